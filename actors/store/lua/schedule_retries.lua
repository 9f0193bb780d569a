-- schedule_retries: save retry contexts and add them to the partition's retry zset.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix ({ns:P}:retry:)
-- ARGV[2..] groups of 8: schedule_id, retry_at_ms, task_id, type, payload, attempt
--           (of the retry), due_ms, last_error
-- Returns the number saved. Idempotent per schedule_id: a message that failed twice
-- (reclaimed and failed again) overwrites one context, never adds a second retry.
local n = 0
for i = 2, #ARGV, 8 do
  local sid = ARGV[i]
  redis.call('HSET', ARGV[1] .. sid, 'task_id', ARGV[i + 2], 'type', ARGV[i + 3],
    'payload', ARGV[i + 4], 'attempt', ARGV[i + 5], 'due_ms', ARGV[i + 6],
    'last_error', ARGV[i + 7], 'retry_at_ms', ARGV[i + 1])
  redis.call('HDEL', ARGV[1] .. sid, 'claim')
  redis.call('ZADD', KEYS[1], ARGV[i + 1], sid)
  n = n + 1
end
return n

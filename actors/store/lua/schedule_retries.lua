-- schedule_retries: save retry contexts and add them to the partition's retry zset.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix ({ns:P}:retry:)   ARGV[2]  partition tag
-- ARGV[3]  buckets per partition
-- ARGV[4..] groups of 10: schedule_id, delay_ms, task_id, type, payload, attempt
--           (of the retry), due_ms, last_error, policy code ('' = none), the failed
--           message's id (kept as 'from')
-- The retry is due at Redis's TIME + delay_ms: one clock for every node (a node whose own
-- clock is skewed neither retries early nor late). Each context keeps in 'born' its task's
-- created_ms now (0: no such task; none kept for a definition without one or one that
-- cannot be read), so that
-- claim_retries.lua drops the retry if the task is deleted and created again under its id
-- before the retry comes due.
-- Returns the number saved. Idempotent per failed message: the same failure written
-- again (a consumer's write sent again after its reply was lost, or the message run again
-- elsewhere and failing again) leaves the context its first write saved (context and zset
-- entry) as it is, even claimed by a dispatcher, and saves nothing once its retry was sent (commit_retries.lua's
-- marks, <prefix><schedule_id>:sent, name the failed messages). A later run of the fire's
-- time (a backfill, a replay) is another message: its retry is saved. A mark key of
-- another kind is read as none.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tag, buckets = ARGV[2], tonumber(ARGV[3])
local n = 0
for i = 4, #ARGV, 10 do
  local sid, from = ARGV[i], ARGV[i + 9]
  local sent = redis.pcall('HGET', ARGV[1] .. sid .. ':sent', from)
  if type(sent) == 'table' then sent = false end  -- an error reply: no mark
  -- Saved already: its context from this failure, and in the zset (a write that failed
  -- halfway, the zset refused, left the context alone: it is written again).
  local saved = not sent and redis.call('HGET', ARGV[1] .. sid, 'from') == from
    and redis.call('ZSCORE', KEYS[1], sid)
  if not sent and not saved then
    local retry_at = string.format('%d', now + tonumber(ARGV[i + 1]))
    redis.call('HSET', ARGV[1] .. sid, 'task_id', ARGV[i + 2], 'type', ARGV[i + 3],
      'payload', ARGV[i + 4], 'attempt', ARGV[i + 5], 'due_ms', ARGV[i + 6],
      'last_error', ARGV[i + 7], 'retry_at_ms', retry_at, 'from', ARGV[i + 9])
    local born = created_ms(tag, bucket_of(ARGV[i + 2], buckets), ARGV[i + 2])
    if born then  -- nil or false: none to keep
      redis.call('HSET', ARGV[1] .. sid, 'born', ms(born))
    else
      redis.call('HDEL', ARGV[1] .. sid, 'born')
    end
    if ARGV[i + 8] ~= '' then
      redis.call('HSET', ARGV[1] .. sid, 'o', ARGV[i + 8])
      redis.call('HDEL', ARGV[1] .. sid, 'claim')
    else
      redis.call('HDEL', ARGV[1] .. sid, 'claim', 'o')
    end
    redis.call('ZADD', KEYS[1], retry_at, sid)
    n = n + 1
  end
end
return n

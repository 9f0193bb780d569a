-- record_outcomes: update tasks of one partition after their fires ran.
-- KEYS[1]  schedule zset of the partition (only for its slot)
-- ARGV[1]  task key prefix
-- ARGV[2..] groups of 4: task_id, outcome (ok | retry | dead), finished_ms, error ('' = none)
-- Returns the number of tasks updated (a deleted task is skipped).
-- ok resets the consecutive-failure count ('retries'); retry and dead increase it.
local n = 0
for i = 2, #ARGV, 4 do
  local key = ARGV[1] .. ARGV[i]
  if redis.call('EXISTS', key) == 1 then
    local outcome = ARGV[i + 1]
    redis.call('HSET', key, 'last_run_ms', ARGV[i + 2], 'last_status', outcome)
    if outcome == 'ok' then
      redis.call('HINCRBY', key, 'runs', 1)
      redis.call('HDEL', key, 'retries', 'last_error')
    else
      redis.call('HINCRBY', key, 'retries', 1)
      redis.call('HSET', key, 'last_error', ARGV[i + 3])
    end
    n = n + 1
  end
end
return n

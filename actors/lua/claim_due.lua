-- claim_due: reserve a batch of due tasks of one partition for one poller.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  task key prefix   ARGV[2]  claim token   ARGV[3]  limit   ARGV[4]  lease_ms
-- Returns {now_ms, earliest_score_after_claim or -1,
--          task_id, type, payload, sched, next_ms, fires, owed_until, ...}  (7 per task)
-- owed_until: when the task still held an earlier claim (that poller died, or lost its
-- lease, before committing), the end of that claim's lease (its score), else -1: the grid
-- times that came due while the dead claim blocked the task are owed fires, whatever the
-- misfire policy.
-- A claim re-scores the task to now + lease (so no other poller sees it as due) and writes
-- the token into the hash. The grid time stays in the hash's next_ms until commit_fires
-- moves it, so a poller that dies before committing leaves the same fire to be claimed again
-- after the lease: late and maybe duplicated (same schedule_id), never lost.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local limit = tonumber(ARGV[3])
local due = redis.call('ZRANGE', KEYS[1], '-inf', string.format('%d', now), 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
local lease_until = string.format('%d', now + tonumber(ARGV[4]))
local out = {now, -1}
for i = 1, #due, 2 do
  local id, score = due[i], due[i + 1]
  local key = ARGV[1] .. id
  local f = redis.call('HMGET', key, 'type', 'payload', 'sched', 'next_ms', 'fires', 'status', 'claim')
  if (not f[1]) or f[6] ~= 'active' or (not f[4]) then
    redis.call('ZREM', KEYS[1], id)  -- stale index entry: task deleted or no longer active
  else
    redis.call('HSET', key, 'claim', ARGV[2])
    redis.call('ZADD', KEYS[1], lease_until, id)
    out[#out + 1] = id
    out[#out + 1] = f[1]
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
    out[#out + 1] = f[4]
    out[#out + 1] = f[5] or '0'
    out[#out + 1] = f[7] and score or -1
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out

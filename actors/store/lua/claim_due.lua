-- claim_due: reserve a batch of due tasks of one partition for one poller.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  partition tag   ARGV[2]  claim token   ARGV[3]  limit   ARGV[4]  lease_ms
-- ARGV[5]  buckets of the namespace
-- Returns {now_ms, earliest_score_after_claim or -1,
--          task_id, bucket, type, payload, sched, next_ms, fires, owed_until, prior, ...}
--          (9 per task)
-- owed_until: when the task still held an earlier claim (that poller died, or lost its
-- lease, before committing), the end of that claim's lease (its score), else -1: the grid
-- times that came due while the dead claim blocked the task are owed fires, whatever the
-- misfire policy; prior: that claim's token ('' if none), so the fires it may have appended
-- are not appended again (enqueue.lua).
-- A claim re-scores the task to now + lease (so no other poller sees it as due) and writes
-- the token into the task's state. The grid time stays in the state's next_ms until
-- commit_fires moves it, so a poller that dies before committing leaves the same fire to be
-- claimed again after the lease: late and maybe duplicated (same schedule_id), never lost.
local tag = ARGV[1]
local buckets = tonumber(ARGV[5])
local now = now_ms()
local due = redis.call('ZRANGE', KEYS[1], '-inf', ms(now), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[3]), 'WITHSCORES')
local lease_until = ms(now + tonumber(ARGV[4]))
local out = {now, -1}
for i = 1, #due, 2 do
  local id, score = due[i], due[i + 1]
  local b = bucket_of(id, buckets)
  local s = get_state(tag, b, id)
  local def = s and redis.call('HGET', tag .. ':def:' .. b, id)
  if (not def) or s[1] ~= ACTIVE or (not s[2]) then
    redis.call('ZREM', KEYS[1], id)  -- stale index entry: task deleted or no longer active
  else
    local typ, payload, sched = cmsgpack.unpack(def)
    local prior = s[9]
    s[9] = ARGV[2]
    put_state(tag, b, id, s)
    redis.call('ZADD', KEYS[1], lease_until, id)
    out[#out + 1] = id
    out[#out + 1] = b
    out[#out + 1] = typ
    out[#out + 1] = payload
    out[#out + 1] = sched
    out[#out + 1] = ms(s[2])
    out[#out + 1] = s[3]
    out[#out + 1] = prior and score or -1
    out[#out + 1] = prior or ''
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out

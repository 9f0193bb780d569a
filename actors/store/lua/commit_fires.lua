-- commit_fires: advance the schedule of claimed tasks whose fires are in their stream.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  partition tag   ARGV[2]  claim token
-- ARGV[3..] groups of 5: task_id, bucket, next_ms ('' = finished), score, fired (count enqueued)
-- Returns {earliest score in the zset after the commit or -1, lost ids...}: lost ids are
-- those whose claim no longer holds (lease expired and re-claimed, or the task was updated,
-- paused or deleted meanwhile); nothing is changed for those.
local tag = ARGV[1]
local lost = {-1}
for i = 3, #ARGV, 5 do
  local id, b, nxt, score, fired = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], tonumber(ARGV[i+4])
  local s = get_state(tag, b, id)
  if s and s[9] == ARGV[2] then
    s[9] = nil
    s[3] = s[3] + fired
    if nxt == '' then
      s[1], s[2] = FINISHED, nil
      redis.call('ZREM', KEYS[1], id)
    else
      s[2] = tonumber(nxt)
      redis.call('ZADD', KEYS[1], score, id)
    end
    put_state(tag, b, id, s)
  else
    lost[#lost + 1] = id
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then lost[1] = tonumber(first[2]) end
return lost

-- commit_fires: advance the schedule of claimed tasks whose fires are in their stream.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  task key prefix   ARGV[2]  claim token
-- ARGV[3..] groups of 4: task_id, next_ms ('' = finished), score, fired (count enqueued)
-- Returns {earliest score in the zset after the commit or -1, lost ids...}: lost ids are
-- those whose claim no longer holds (lease expired and re-claimed, or the task was updated,
-- paused or deleted meanwhile); nothing is changed for those.
local lost = {-1}
for i = 3, #ARGV, 4 do
  local id, nxt, score, fired = ARGV[i], ARGV[i+1], ARGV[i+2], tonumber(ARGV[i+3])
  local key = ARGV[1] .. id
  if redis.call('HGET', key, 'claim') == ARGV[2] then
    redis.call('HDEL', key, 'claim')
    if fired > 0 then redis.call('HINCRBY', key, 'fires', fired) end
    if nxt == '' then
      redis.call('HSET', key, 'status', 'finished')
      redis.call('HDEL', key, 'next_ms')
      redis.call('ZREM', KEYS[1], id)
    else
      redis.call('HSET', key, 'next_ms', nxt)
      redis.call('ZADD', KEYS[1], score, id)
    end
  else
    lost[#lost + 1] = id
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then lost[1] = tonumber(first[2]) end
return lost

-- commit_retries: forget retries whose message is back in its stream.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix   ARGV[2]  claim token   ARGV[3..]  schedule ids
-- Returns {earliest score after the commit or NONE, lost ids...}; a lost id's claim no
-- longer holds (its lease expired and another dispatcher took it): it is left alone.
local out = {NONE}
for i = 3, #ARGV do
  local key = ARGV[1] .. ARGV[i]
  if redis.call('HGET', key, 'claim') == ARGV[2] then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], ARGV[i])
  else
    out[#out + 1] = ARGV[i]
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[1] = tonumber(first[2]) end
return out

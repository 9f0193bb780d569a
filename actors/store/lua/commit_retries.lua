-- commit_retries: forget retries whose message is back in its stream.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix   ARGV[2]  claim token   ARGV[3..]  schedule ids
-- Returns {earliest score after the commit or NONE, lost ids...}; a lost id's context is
-- claimed under another token (its lease expired and another dispatcher took it): it is
-- left alone. A context gone, or unclaimed, is not lost: committed already (this call
-- sent again after its reply was lost), or written anew by a later failure of the fire
-- (schedule_retries.lua clears the claim): left alone too.
local out = {NONE}
for i = 3, #ARGV do
  local key = ARGV[1] .. ARGV[i]
  local claim = redis.call('HGET', key, 'claim')
  if claim == ARGV[2] then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], ARGV[i])
  elseif claim and claim ~= '' then
    out[#out + 1] = ARGV[i]
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[1] = tonumber(first[2]) end
return out

-- commit_retries: forget retries whose message is back in its stream.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix   ARGV[2]  claim token   ARGV[3]  how long a sent
-- retry's mark is kept (ms)   ARGV[4..]  schedule ids
-- Returns {earliest score after the commit or NONE, lost ids...}; a lost id's context is
-- claimed under another token (its lease expired and another dispatcher took it): it is
-- left alone. A context gone, or unclaimed, is not lost: committed already (this call
-- sent again after its reply was lost), or written anew by a later failure of the fire
-- (schedule_retries.lua clears the claim): left alone too.
-- A committed context whose failed message is known ('from') marks it sent in a hash of
-- its own, <prefix><schedule_id>:sent (field: the message's id), kept ARGV[3] ms after
-- the last: the same failure written again (a consumer's write sent again after its reply
-- was lost, or the message run again and failing again) schedules no second retry, nor
-- does an earlier attempt's late one. A key of its own: a context written over it by an
-- older version's script must not take its expiry. A mark key of another kind is left.
local out = {NONE}
for i = 4, #ARGV do
  local key = ARGV[1] .. ARGV[i]
  local f = redis.call('HMGET', key, 'claim', 'from')
  local claim = f[1]
  if claim == ARGV[2] then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], ARGV[i])
    if f[2] and type(redis.pcall('HSET', key .. ':sent', f[2], '1')) == 'number' then
      redis.call('PEXPIRE', key .. ':sent', ARGV[3])
    end
  elseif claim and claim ~= '' then
    out[#out + 1] = ARGV[i]
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[1] = tonumber(first[2]) end
return out

-- own_name: take (or keep) a consumer name in a type's group for one live consumer.
-- KEYS[1]  the name's owner key ({ns:q:<type>}:owner:<name>, the stream's slot)
-- ARGV[1]  this incarnation's owner value (host:pid:instance:token)   ARGV[2]  ttl ms
-- ARGV[3]  a holder this caller found dead and may take over from ('' = none)
-- Returns {1} when the name is now ours (the key set or refreshed for ttl ms), else
-- {0, current holder}. A live consumer refreshes its key every lease/3, so a name is never
-- shared by two live consumers; a dead one's key expires after ttl.
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[1] or (ARGV[3] ~= '' and current == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return {1}
end
return {0, current}

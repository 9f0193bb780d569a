-- count_delivery: count one more delivery of a suspect about to run alone (recover.lua).
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  this consumer   ARGV[3]  message id
-- ARGV[4]  its deliveries as recover.lua returned them
-- Returns its deliveries now, or 0 when it is no longer pending under this consumer
-- (acknowledged meanwhile, or taken by the name's new holder): not to run here. Counted
-- only from ARGV[4], so a call repeated after a lost reply counts once.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if not p[1] then return 0 end
local count = p[1][4]
if count == tonumber(ARGV[4]) then
  count = count + 1
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', count, 'JUSTID')
end
return count

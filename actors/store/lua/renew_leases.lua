-- renew_leases: reset the idle time of messages this consumer is still running.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  this consumer   ARGV[3..]  ids
-- Returns the ids renewed. A message another consumer has taken over meanwhile is left
-- alone (claiming it back would run it twice at once); XCLAIM JUSTID does not count a
-- delivery.
local renewed = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    renewed[#renewed + 1] = ARGV[i]
  end
end
return renewed

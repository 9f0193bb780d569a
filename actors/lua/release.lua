-- release: at shutdown, hand unfinished messages back and leave the group if empty-handed.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  this consumer
-- ARGV[3]  idle ms to set (past any lease, so other claimers take them at once)
-- ARGV[4..] ids still pending here that will not finish
-- Returns {released ids, 1 if the consumer was removed from the group else 0}.
-- Invariant: a consumer with pending messages is never deleted (they would be lost from
-- the PEL); it is removed only when nothing is pending under its name.
local released = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    released[#released + 1] = ARGV[i]
  end
end
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if mine[1] then return {released, 0} end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return {released, 1}

-- release: as a consumer ends (stopped, or failed), hand back every message pending
-- under it.
-- KEYS[1]  the type's stream   KEYS[2]  this consumer's poison ends (Keys.poison_ends)
-- ARGV[1]  group   ARGV[2]  this consumer
-- ARGV[3]  idle ms to set: past any lease, so other claimers take them at once; ten years
--          for a stop (RELEASED_IDLE_MS: past a year, no delivery counted by reclaim.lua
--          or recover.lua), 30 days for a consumer that failed (FAILED_IDLE_MS: counted)
-- ARGV[4]  the first id to release: '-', or '(' and the last id a call before released
-- ARGV[5]  most ids a call releases
-- Returns {released ids, 1 if the consumer was removed from the group else 0}. A call that
-- released ARGV[5] ids may have left more: the caller calls again from the last one
-- (released messages stay pending under this consumer, so each call starts past them).
-- Called when none of this consumer's handlers runs any more: whatever is pending under
-- its name (unfinished, unstarted, or read by an abandoned call) will not finish here.
-- Invariant: a consumer with pending messages is never deleted (its PEL entries would be
-- lost); it is removed only when nothing is pending under its name, and while no poison
-- its claimer dead-lettered waits to be ended (the pruner takes a gone consumer's ends
-- over only while the consumer is in the group). Bounded: ARGV[5] ids a call.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[4], '+', tonumber(ARGV[5]),
  ARGV[2])
local released = {}
for _, p in ipairs(pending) do
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'IDLE', ARGV[3], 'JUSTID')
  released[#released + 1] = p[1]
end
if #released > 0 or ARGV[4] ~= '-' or redis.call('EXISTS', KEYS[2]) == 1 then
  return {released, 0}
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return {released, 1}

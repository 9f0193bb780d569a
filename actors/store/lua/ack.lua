-- ack: acknowledge finished messages of one stream.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2..]  message ids
-- Returns the number acknowledged (ids no longer pending, e.g. reclaimed and finished
-- elsewhere meanwhile, are not counted). The entries stay in the stream until the
-- claimers' trim_acked.lua drops them from its head with the other acknowledged ones.
-- XACK takes the ids a thousand at a time: Lua's unpack stops near 8,000 values, and a
-- consumer of concurrency 10,000 can finish that many in one batch (after Redis was away).
local n = 0
for first = 2, #ARGV, 1000 do
  n = n + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
return n

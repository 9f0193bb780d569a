-- ack: acknowledge finished messages of one stream.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2..]  message ids
-- With KEYS[2], the type's cancel hash: ARGV[2] the number N of message ids, ARGV[3..2+N]
-- the ids, the rest schedule ids of ended tracked fires (an overlap policy's: TRACKED_LETTERS
-- in actors/store/flights.py), whose cancel requests go
-- (one made while the fire ran and not taken before it ended would stay in a busy type's
-- hash for good). A hash Redis rejects holds up no ACK: its requests lapse with it.
-- Returns the number acknowledged (ids no longer pending, e.g. reclaimed and finished
-- elsewhere meanwhile, are not counted). The entries stay in the stream until the
-- claimers' trim_acked.lua drops them from its head with the other acknowledged ones.
-- XACK takes the ids a thousand at a time: Lua's unpack stops near 8,000 values, and a
-- consumer of concurrency 10,000 can finish that many in one batch (after Redis was away).
local first, last = 2, #ARGV
if #KEYS > 1 then
  first, last = 3, 2 + tonumber(ARGV[2])
  for i = last + 1, #ARGV, 1000 do
    redis.pcall('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
end
local n = 0
for i = first, last, 1000 do
  n = n + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, math.min(i + 999, last)))
end
return n

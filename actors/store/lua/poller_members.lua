-- poller_members: a poller says it is alive and learns who else is (partition ownership).
-- KEYS[1]  the namespace's pollers zset (poller id -> alive until, ms)
-- ARGV[1]  poller id   ARGV[2]  ttl_ms (0 = this poller leaves)
-- ARGV[3..] pollers the caller found gone (processes of its host that exited), removed
-- Returns the live pollers' ids, sorted: every poller computes the same assignment of
-- partitions from it (actors/scheduling/ownership.py). Entries past their time are pruned,
-- and those alive until further ahead than any poller says (ten of the caller's ttls, an
-- hour at least): another program's entry (1e300) would hold partitions no poller claims.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
if #ARGV > 2 then redis.call('ZREM', KEYS[1], unpack(ARGV, 3)) end
local gone = redis.call('ZRANGE', KEYS[1], '-inf', string.format('%d', now), 'BYSCORE')
if #gone > 0 then redis.call('ZREM', KEYS[1], unpack(gone)) end
local ahead = math.max(10 * ttl, 3600000)
local bogus = redis.call('ZRANGE', KEYS[1], '(' .. string.format('%d', now + ahead), '+inf',
  'BYSCORE', 'LIMIT', 0, 1000)  -- ZREM by name: the deployed ACL grants no ZREMRANGEBYSCORE
if #bogus > 0 then redis.call('ZREM', KEYS[1], unpack(bogus)) end
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
return live

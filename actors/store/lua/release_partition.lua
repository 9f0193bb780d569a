-- release_partition: a poller lets go of a partition it owns (shutdown, or a rebalance
-- gave it to another poller), between ticks: nothing it claimed is uncommitted.
-- KEYS[1]  the partition's owner hash   ARGV[1]  poller id
-- Returns 1 if released, 0 if the partition was not this poller's.
-- The next owner takes it at once (no lease to wait for) and owes the fires due from now
-- until it does (claim_due.lua, owed): 'until' becomes the time of the release.
local o = redis.call('HGET', KEYS[1], 'poller')
if o ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
redis.call('HDEL', KEYS[1], 'poller')
-- 'renewed' too: every claim it made was committed; none of them read a task written later
local at = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
-- ('version' raised to it: a task written after the release has a later one)
local v = tonumber(redis.call('HGET', KEYS[1], 'version') or 0)
redis.call('HSET', KEYS[1], 'until', at, 'renewed', at,
  'version', string.format('%d', math.max(v, tonumber(at))))
return 1

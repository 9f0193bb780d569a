-- node_number: the number a node's name goes by in task histories (2 bytes an entry
-- instead of the name). KEYS[1]  the namespace's node-number hash
-- ARGV[1]  the node's name
-- Returns its number, 1..65535: the one it was given before, else the next one (after
-- 65,535 names, numbers are given again from 1: the oldest names are forgotten).
local key, name = KEYS[1], ARGV[1]
local n = redis.call('HGET', key, 'name:' .. name)
if n then return tonumber(n) end
n = redis.call('HINCRBY', key, 'last', 1)
if n > 65535 then n = 1; redis.call('HSET', key, 'last', 1) end
local old = redis.call('HGET', key, 'number:' .. n)
if old then redis.call('HDEL', key, 'name:' .. old) end
redis.call('HSET', key, 'name:' .. name, n, 'number:' .. n, name)
return n

-- cancel_fires: ask the consumers of a type to cancel fires wherever they run
-- (cancel_other: a newer fire of the task took their place).
-- KEYS[1]  the type's cancel hash ({ns:q:<type>}:cancel)
-- ARGV[1]  how long the requests are kept (ms)   ARGV[2..] schedule ids
-- A consumer running one of them cancels it and removes its request; a request for a fire
-- that has ended already lapses with the hash.
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
for i = 2, #ARGV do redis.call('HSET', KEYS[1], ARGV[i], now) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return #ARGV - 1

-- keep_meta: lay the namespace's meta key down again if it is gone, whole, in one step (a
-- node starting meanwhile reads it whole or not at all: actors/store/tasks.py).
-- KEYS[1]  ns:meta   ARGV  field, value, ... as the running node read them
-- Returns 1 when it wrote the key, 0 when the key was there.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1

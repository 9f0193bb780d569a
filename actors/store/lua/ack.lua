-- ack: acknowledge and delete finished messages of one stream.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2..]  message ids
-- Returns the number acknowledged (ids no longer pending, e.g. reclaimed and finished
-- elsewhere meanwhile, are not counted; their entries are deleted all the same).
local n = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return n

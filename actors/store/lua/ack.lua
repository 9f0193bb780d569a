-- ack: acknowledge finished messages of one stream.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2..]  message ids
-- Returns the number acknowledged (ids no longer pending, e.g. reclaimed and finished
-- elsewhere meanwhile, are not counted). The entries stay in the stream until the
-- claimers' trim_acked.lua drops them from its head with the other acknowledged ones.
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))

-- recover: a consumer takes back what is pending under its own name and is not running
-- here: what an earlier incarnation of the name left (killed, or restarted by its
-- supervisor), or what a read whose reply was lost delivered.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  consumer   ARGV[3]  most entries
-- ARGV[4]  min idle ms (0: all; a running consumer passes more than its renewal period,
--          so nothing it renews or has just read is taken)
-- Returns a list of {id, {field, value, ...}}: each entry is claimed again by this same
-- consumer with its idle time reset, atomically, so no claimer elsewhere takes it from
-- now on. JUSTID: the delivery count stays as it is (taking back is not a delivery, and a
-- higher count would make a message poison early). Entries whose message was deleted
-- meanwhile drop out of the PEL and are not returned.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[4] or 0),
  '-', '+', tonumber(ARGV[3]), ARGV[2])
local out = {}
for _, p in ipairs(pending) do
  local entry = redis.call('XRANGE', KEYS[1], p[1], p[1])
  if entry[1] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'JUSTID')
    out[#out + 1] = entry[1]
  else
    redis.call('XACK', KEYS[1], ARGV[1], p[1])  -- deleted while pending: nothing to run
  end
end
return out

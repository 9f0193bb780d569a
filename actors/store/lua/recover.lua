-- recover: a consumer that starts under a name it owns takes back what an earlier
-- incarnation of that name left pending (killed, or restarted by its supervisor).
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  consumer   ARGV[3]  most entries
-- Returns a list of {id, {field, value, ...}}: each entry is claimed again by this same
-- consumer with its idle time reset, atomically, so no claimer elsewhere takes it from
-- now on. Entries whose message was deleted meanwhile drop out of the PEL (XCLAIM does
-- that) and are not returned.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[3]), ARGV[2])
local out = {}
for _, p in ipairs(pending) do
  local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1])
  if claimed[1] then
    out[#out + 1] = claimed[1]
  end
end
return out

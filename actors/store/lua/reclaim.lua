-- reclaim: take over messages whose consumer stopped renewing them; dead-letter poison.
-- KEYS[1]  the type's stream   KEYS[2]  its dead-letter stream (same slot)
-- ARGV[1]  group   ARGV[2]  this node's consumer   ARGV[3]  min idle ms (the lease)
-- ARGV[4]  most messages to take   ARGV[5]  max deliveries   ARGV[6]  node name
-- Returns {claimed, poisoned}: claimed is a list of {id, previous owner, idle ms,
-- deliveries, {field, value, ...}}; poisoned is a list of message ids moved to the DLQ.
-- A message delivered max-deliveries times already is not claimed again: it keeps
-- killing its consumers, so it goes to the DLQ with its fields and the reason.
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
local claimed, poisoned = {}, {}
for _, p in ipairs(pending) do
  local id, owner, idle, deliveries = p[1], p[2], p[3], p[4]
  if owner ~= ARGV[2] then
    if deliveries >= tonumber(ARGV[5]) then
      local entry = redis.call('XRANGE', KEYS[1], id, id)
      if entry[1] then
        local fields = entry[1][2]
        fields[#fields + 1] = 'reason'
        fields[#fields + 1] = 'poison'
        fields[#fields + 1] = 'error'
        fields[#fields + 1] = 'delivered ' .. deliveries .. ' times without finishing'
        fields[#fields + 1] = 'deliveries'
        fields[#fields + 1] = tostring(deliveries)
        fields[#fields + 1] = 'node'
        fields[#fields + 1] = ARGV[6]
        fields[#fields + 1] = 'dead_ms'
        fields[#fields + 1] = now
        redis.call('XADD', KEYS[2], '*', unpack(fields))
      end
      redis.call('XACK', KEYS[1], ARGV[1], id)
      redis.call('XDEL', KEYS[1], id)
      poisoned[#poisoned + 1] = id
    else
      local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], id)
      if got[1] then
        claimed[#claimed + 1] = {id, owner, idle, deliveries + 1, got[1][2]}
      end
    end
  end
end
return {claimed, poisoned}

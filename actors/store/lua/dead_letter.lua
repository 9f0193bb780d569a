-- dead_letter: move messages to the type's dead-letter stream, atomically with their ACK.
-- KEYS[1]  the type's stream   KEYS[2]  its dead-letter stream (same slot)
-- ARGV[1]  group
-- ARGV[2..] per message: message id, k, then k field/value items of the DLQ entry
-- Returns the DLQ entry ids, in order; '' for a message no longer pending (already
-- dead-lettered by this very call sent again after its reply was lost, or reclaimed and
-- finished elsewhere): it gets no second dead letter.
local out = {}
local i = 2
while i <= #ARGV do
  local id, k = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1] then
    local fields = {}
    for j = 1, k do fields[j] = ARGV[i + 1 + j] end
    out[#out + 1] = redis.call('XADD', KEYS[2], '*', unpack(fields))
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
  else
    out[#out + 1] = ''
  end
  i = i + 2 + k
end
return out

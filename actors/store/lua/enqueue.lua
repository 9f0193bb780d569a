-- enqueue: append fires to one type's stream, many per call (one round trip, one reply),
-- dropping any fire already enqueued within the dedupe window.
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- ARGV[1]  enq_ms (the claim's Redis time)   ARGV[2]  the type
-- ARGV[3]  marker prefix ({ns:q:<type>}:enq:)   ARGV[4]  dedupe window ms (0 = off)
-- ARGV[5..] groups of 4: task_id, due_ms, payload (JSON), attempt
-- Returns one flag per fire: 1 appended, 0 dropped as a duplicate (the same fire and
-- attempt was appended within the window: a poller or dispatcher died after appending it
-- and before committing, and the fire was claimed again).
-- Message fields: task_id, schedule_id (task_id:due_ms), type, payload, attempt, due_ms,
-- enq_ms. Callers cap the fires per call (ENQUEUE_CHUNK) so no call holds Redis long.
local out = {}
local window = tonumber(ARGV[4])
for i = 5, #ARGV, 4 do
  local id, due, attempt = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  local sid = id .. ':' .. due
  local fresh = true
  if window > 0 then
    fresh = redis.call('SET', ARGV[3] .. sid .. ':' .. attempt, '1', 'NX', 'PX', window)
  end
  if fresh then
    redis.call('XADD', KEYS[1], '*', 'task_id', id, 'schedule_id', sid, 'type', ARGV[2],
      'payload', ARGV[i + 2], 'attempt', attempt, 'due_ms', due, 'enq_ms', ARGV[1])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

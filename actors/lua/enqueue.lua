-- enqueue: append fires to one type's stream, many per call (one round trip, one reply).
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- ARGV[1]  enq_ms (the claim's Redis time)   ARGV[2]  the type
-- ARGV[3..] groups of 4: task_id, due_ms, payload (JSON), attempt
-- Returns the number of entries added. Message fields: task_id, schedule_id
-- (task_id:due_ms), type, payload, attempt, due_ms, enq_ms. Callers cap the fires per
-- call (the poller sends at most ENQUEUE_CHUNK) so one call never blocks Redis for long.
local n = 0
for i = 3, #ARGV, 4 do
  local id, due = ARGV[i], ARGV[i + 1]
  redis.call('XADD', KEYS[1], '*', 'task_id', id, 'schedule_id', id .. ':' .. due,
    'type', ARGV[2], 'payload', ARGV[i + 2], 'attempt', ARGV[i + 3], 'due_ms', due,
    'enq_ms', ARGV[1])
  n = n + 1
end
return n

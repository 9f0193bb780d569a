-- backfill: append a task's past grid times to its type's stream, each at most once per
-- retention: a repeated backfill of the same window appends nothing again.
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- KEYS[2]  the task's backfill marker hash ({ns:q:<type>}:backfilled:<task_id>)
-- ARGV[1]  enq_ms (Redis time of the call)   ARGV[2]  the type   ARGV[3]  the task id
-- ARGV[4]  payload (JSON)   ARGV[5]  marker retention ms
-- ARGV[6]  FLAG_ON: compact messages (task_id, payload, attempt, due_ms), FLAG_OFF = the full form
-- ARGV[7]  the messages' policy code (field o; '' = none: actors/store/flights.py)
-- ARGV[8..] due times (grid ms)
-- Returns one flag per due time: 1 appended, 0 already appended by an earlier backfill.
--
-- Marker: field = due_ms. HSETNX decides; only a field that was new gets its XADD, in the
-- same script and slot, so two backfills racing over one window append each fire once.
-- The hash's expiry is renewed by every call: a window backfilled again within the
-- retention of the last backfill of the task is not appended twice. Messages are written
-- exactly as enqueue.lua writes them (attempt 0, schedule_id = task_id:due_ms).
local stream, marker = KEYS[1], KEYS[2]
local enq, typ, id, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local compact, policy = ARGV[6] == FLAG_ON, ARGV[7]
local out = {}
for i = 8, #ARGV do
  local due = ARGV[i]
  if redis.call('HSETNX', marker, due, '') == 1 then
    local f = {'task_id', id, 'payload', payload, 'attempt', '0', 'due_ms', due}
    if not compact then
      for _, v in ipairs({'schedule_id', id .. ':' .. due, 'type', typ, 'enq_ms', enq}) do
        f[#f + 1] = v
      end
    end
    if policy ~= '' then f[#f + 1], f[#f + 2] = 'o', policy end
    redis.call('XADD', stream, '*', unpack(f))
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #ARGV >= 8 then redis.call('PEXPIRE', marker, ARGV[5]) end
return out

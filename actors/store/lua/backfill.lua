-- backfill: append a task's past grid times to its type's stream, each at most once per
-- retention: a repeated backfill of the same window appends nothing again.
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- KEYS[2]  the task's backfill marker hash ({ns:q:<type>}:backfilled:<task_id>)
-- ARGV[1]  enq_ms (Redis time of the call)   ARGV[2]  the type   ARGV[3]  the task id
-- ARGV[4]  payload (JSON)   ARGV[5]  marker retention ms
-- ARGV[6]  FLAG_ON: compact messages (task_id, payload, attempt, due_ms), FLAG_OFF = the full form
-- ARGV[7]  the messages' policy code (field o; '' = none: actors/store/flights.py)
-- ARGV[8]  the task's created_ms, kept in the marker's field 'born' (the caller deletes a
--          marker an earlier task of the same id left)
-- ARGV[9]  the consumers' seen-key prefix ({ns:q:<type>}:seen:, the stream's slot)
-- ARGV[10] how many attempts' dedupe markers to remove (keys.SEEN_ATTEMPTS)
-- ARGV[11..] due times (grid ms)
-- Returns one flag per due time: 1 appended, 0 already appended by an earlier backfill.
-- A time appended has the consumers' dedupe markers of its earlier runs removed
-- (begin_runs.lua: schedule_id:attempt, its first ARGV[10] attempts), as a replay's
-- are: with [consumers.<type>] dedupe_window_s on, the backfilled copy of a time that
-- started within the window would otherwise be dropped as a duplicate, never run.
--
-- Marker: field = due_ms (append_once.lua), so two backfills racing over one window
-- append each fire once.
-- The hash's expiry is renewed by every call: a window backfilled again within the
-- retention of the last backfill of the task is not appended twice.
local stream, marker = KEYS[1], KEYS[2]
local enq, typ, id, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local compact, policy, seen = ARGV[6] == FLAG_ON, ARGV[7], ARGV[9]
local attempts = tonumber(ARGV[10])
local out = {}
for i = 11, #ARGV do
  local due = ARGV[i]
  out[#out + 1] = append_once(stream, marker, due, id, payload, due, compact, typ, enq, policy)
  if out[#out] == 1 then
    local marks = {}
    for a = 0, attempts - 1 do marks[a + 1] = seen .. id .. ':' .. due .. ':' .. a end
    redis.call('UNLINK', unpack(marks))
  end
end
if #ARGV >= 11 then
  redis.call('HSET', marker, 'born', ARGV[8])
  redis.call('PEXPIRE', marker, ARGV[5])
end
return out

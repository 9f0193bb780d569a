-- set_status: pause, resume or stop one task (status.lua: change_status).
-- KEYS[1]  schedule zset of the task's partition
-- ARGV[1]  partition tag   ARGV[2]  task_id   ARGV[3]  bucket
-- ARGV[4]  action: pause | resume | stop
-- ARGV[5]  next_ms for resume ('' = never)   ARGV[6]  score for resume
-- ARGV[7]  the note (compact JSON, actors/store/notes.py) kept with the change, or '' (none)
-- ARGV[8]  FLAG_ON: the task's schedule has an overlap policy (a resume parks it for its
--          flight: flight.lua's holds_task)
-- ARGV[9]  for resume: the task's version its next_ms was placed from ('' = not checked;
--          status.lua): CODE_CONFLICT, nothing done, and the caller places it again
-- ARGV[10] for resume: 'count:last' of the grid times the pause skipped ('' = none),
--          noted not run (status.lua)
-- A change replaces the task's note in <tag>:notes: the given one, or none (the earlier
-- note described a status the task has left). Nothing is written when nothing changes.
-- Returns {code, status, dropped, type}: code 1 changed, 0 already so, -1 conflict (above),
-- -2 not found, -3 not allowed from status; dropped: the due times of the waiting fires a stop dropped
-- (comma separated, '' = none: flight.lua's drop_waiting); type: the task's, for their
-- not_run lines ('' when none was dropped, or its definition cannot be read).
local code, status, dropped = change_status(ARGV[1], ARGV[3], ARGV[2], ARGV[4], ARGV[5],
  ARGV[6], ARGV[7] or '', KEYS[1], ARGV[8] == FLAG_ON, ARGV[9], ARGV[10])
local typ = ''
if dropped ~= '' then
  local raw = redis.call('HGET', ARGV[1] .. ':def:' .. ARGV[3], ARGV[2])
  typ = raw and read_def(raw) or ''
end
return {code, status, dropped, typ}

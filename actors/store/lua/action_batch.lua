-- action_batch: one batch of an operator's action over selected tasks of one partition
-- (POST /v1/tasks/actions; actors/store/apply_actions.py), and the partition's progress
-- mark, in one script: a node killed at any instant leaves the mark saying exactly which
-- tasks are done.
-- KEYS[1]  the partition's schedule zset   KEYS[2]  the action's progress in the partition
--          ({ns:P}:action:<action_id>: last, changed, unchanged, failed, failures, done)
-- ARGV[1]  partition tag   ARGV[2]  pause | resume | stop | delete | mark (the caller did
--          the work in another slot, a trigger's or backfill's append: tally only)
-- ARGV[3]  the mark the caller read (the last task id done; '' = none yet)
-- ARGV[4]  the new mark: the batch's last task id ('' for an empty batch)
-- ARGV[5]  '1': the partition's last batch (the mark then says done)
-- ARGV[6]  the note kept with a pause or resume ('' = none)   ARGV[7]  progress retention ms
-- ARGV[8]  most failures kept per partition (the rest are counted)
-- ARGV[9..] groups of 5: task_id, bucket, next_ms ('' = never), score (resume), outcome
--          (mark: '1' changed, '0' unchanged, else why it failed; resume: FLAG_ON when the
--          task's schedule has an overlap policy, flight.lua's holds_task, then ':' and the
--          task's version its next_ms was placed from: a task another write changed since
--          fails, 'changed since it was read', to be resumed again; then, when the pause
--          skipped grid times, ':' and their 'count:last', noted not run: status.lua)
-- Returns {-9, mark} when the mark is not ARGV[3] (another applier moved it, or the
-- partition is done: the caller reads it again and goes on from there; nothing written),
-- else {1, code, status or reason, dropped, ...} per task: code 1 changed, 0 unchanged,
-- -2/-3 failed; dropped: the due times of the waiting fires a stop dropped (comma
-- separated, '' = none: flight.lua's drop_waiting).
--
-- Tasks are applied in id order (the caller sorts them), so "done up to this id" is the
-- whole progress of a partition; the compare-and-set on the mark makes a batch sent again
-- (a lost reply, a second applier after a lease ran out) change nothing twice.
local tag, action, progress = ARGV[1], ARGV[2], KEYS[2]
local mark = redis.call('HGET', progress, 'last') or ''
if mark ~= ARGV[3] or redis.call('HGET', progress, 'done') == '1' then return {-9, mark} end
local changed, unchanged, failed, deleted = 0, 0, 0, 0
local failures = {}
local out = {1}
for i = 9, #ARGV, 5 do
  local id, b, given = ARGV[i], ARGV[i + 1], ARGV[i + 4]
  local code, status, dropped = 0, '', ''
  if action == 'mark' then
    if given == '1' then code = 1 elseif given == '0' then code = 0 else code, status = -3, given end
  elseif action == 'delete' then
    code = delete_task(tag, b, id, KEYS[1]) and 1 or 0  -- gone already: unchanged
    if code == 1 then deleted = deleted + 1 end
  else
    local tracked, version, paused = string.match(given, '^([^:]*):?([^:]*):?(.*)$')
    code, status, dropped = change_status(tag, b, id, action, ARGV[i + 2], ARGV[i + 3],
      ARGV[6], KEYS[1], tracked == FLAG_ON, version, paused)
    if code == -1 then status = 'changed since it was read: ' .. action .. ' it again'
    elseif code == -2 then status = 'not found'
    elseif code == -3 then status = 'cannot ' .. action .. ' a ' .. status .. ' task' end
  end
  if code == 1 then changed = changed + 1
  elseif code == 0 then unchanged = unchanged + 1
  else
    failed = failed + 1
    failures[#failures + 1] = id .. ' ' .. status
  end
  out[#out + 1], out[#out + 2], out[#out + 3] = code, status, dropped
end
if deleted > 0 then count_write(tag) end
if changed > 0 then redis.call('HINCRBY', progress, 'changed', changed) end
if unchanged > 0 then redis.call('HINCRBY', progress, 'unchanged', unchanged) end
if failed > 0 then
  redis.call('HINCRBY', progress, 'failed', failed)
  local kept = redis.call('HGET', progress, 'failures') or ''
  local room = tonumber(ARGV[8]) - select(2, string.gsub(kept, '\n', ''))
  for j = 1, math.min(room, #failures) do kept = kept .. failures[j] .. '\n' end
  redis.call('HSET', progress, 'failures', kept)
end
if ARGV[4] ~= '' then redis.call('HSET', progress, 'last', ARGV[4]) end
if ARGV[5] == '1' then redis.call('HSET', progress, 'done', '1') end
redis.call('PEXPIRE', progress, ARGV[7])
return out

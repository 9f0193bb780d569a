-- update_task: replace a task's payload and/or schedule.
-- KEYS[1]  schedule zset of the task's partition
-- ARGV[1]  partition tag   ARGV[2]  task_id   ARGV[3]  bucket
-- ARGV[4]  payload JSON or '' (keep)   ARGV[5]  sched (encoded) or '' (keep)
-- ARGV[6]  next_ms for the new schedule ('' = never)   ARGV[7]  score
-- ARGV[8]  labels as compact JSON ('{}' = none) replacing the task's, or '' (keep)
-- ARGV[9]  FLAG_ON: the new schedule has an overlap policy; without one (allow_all)
--          nothing waits behind a fire of the task (no claim would start it), so the fires
--          its former policy held back go with its flight record, each noted not run
--          ('updated': flight.lua's drop_waiting)
-- Returns {code, status, placed, dropped, type}: CODE_OK updated, CODE_NOT_FOUND not
-- found; placed 1 when a schedule other than the task's took effect; dropped: the due
-- times of the waiting fires that went (comma separated, '' = none); type: the task's.
-- A new schedule takes effect at once: the claim (if any) is dropped so a poller holding it
-- cannot commit the old grid; a finished task with a new schedule becomes active again.
-- The latest grid time the old schedule's claims decided is forgotten (flight.lua): the
-- new grid's times were never decided, even those before it. A schedule sent again as it
-- is (a client that sends the whole task to change its payload) changes nothing of the
-- grid: the next time, the fire count against max_runs and the status stay (placed anew,
-- a finished task would fire its last grid time again).
local tag, id, b = ARGV[1], ARGV[2], ARGV[3]
local def = redis.call('HGET', tag .. ':def:' .. b, id)
local s = get_state(tag, b, id)
if not (def and s) then return {CODE_NOT_FOUND, ''} end
local typ, payload, sched, created = read_def(def)
if not typ then
  error({err = 'ERR task ' .. id .. ': its definition record (' .. tag .. ':def:' .. b ..
    ') cannot be read; delete the task and create it again'})
end
if ARGV[4] ~= '' then payload = ARGV[4] end
local placed, dropped = 0, ''
if ARGV[5] ~= '' and ARGV[5] ~= sched then
  placed = 1
  if ARGV[9] ~= FLAG_ON then
    dropped = drop_waiting(tag, id, 'updated')
    redis.call('HDEL', tag .. ':flight', id)
  end
  local f = get_flight(tag .. ':flight', id)
  local decided = f.hw
  f.hw = nil
  sched = ARGV[5]
  s[STATE_FIRES] = 0  -- fires count against max_runs of the schedule they were made by
  if s[STATE_STATUS] == FINISHED then s[STATE_STATUS] = ACTIVE end
  if ARGV[6] == '' and s[STATE_STATUS] == ACTIVE and holds_task(f, ARGV[9] == FLAG_ON) then
    -- a schedule that never fires, with fires still waiting behind the one in flight (an
    -- operator's trigger or backfill its overlap policy held back), or that one
    -- unconfirmed: parked as a poller parks such a task (overlap.lua), on now (no grid
    -- time of the new schedule was decided)
    park_task(tag, id, f, s, KEYS[1])
  else
    if decided then put_flight(tag .. ':flight', id, f) end
    if ARGV[6] == '' then
      if s[STATE_STATUS] == ACTIVE then s[STATE_STATUS] = FINISHED end
      s[STATE_NEXT_MS] = nil
      redis.call('ZREM', KEYS[1], id)
    else
      s[STATE_NEXT_MS] = tonumber(ARGV[6])
      if s[STATE_STATUS] == ACTIVE then
        -- due now if the end of its fire in flight woke it for fires waiting behind it,
        -- or that one is unconfirmed: not held back until the new grid's first time
        redis.call('ZADD', KEYS[1], placed_score(f, ARGV[7]), id)
      end
    end
  end
end
if ARGV[8] ~= '' then put_labels(tag, b, id, ARGV[8]) end
redis.call('HSET', tag .. ':def:' .. b, id, cmsgpack.pack(typ, payload, sched, created))
-- a new version: commit_fires and the pollers' definitions see it
s[STATE_UPDATED_MS] = new_version(tag, s[STATE_UPDATED_MS])
put_state(tag, b, id, s)
count_write(tag)
return {CODE_OK, STATUS_NAMES[s[STATE_STATUS]], placed, dropped, typ}

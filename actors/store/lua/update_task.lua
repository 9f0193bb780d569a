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
-- ARGV[10] FLAG_ON when the new schedule is on the grid of the one ARGV[17] names
--          (Schedule.same_grid: a bound, a policy, the jitter or the spread changed; ''
--          = another grid): the task keeps its next grid time, its fire count and the
--          latest grid time decided
-- ARGV[11] with ARGV[10]: the kept grid time's delay (spread offset and jitter, ms)
-- ARGV[12] with ARGV[10]: the new end_ms ('' = none)   ARGV[13] the new max_runs ('' = none)
-- ARGV[14], ARGV[15] with ARGV[10]: next_ms and score of a task with no grid time left to
--          plan (finished, or parked on a time its claims decided: the grid's next time
--          after now, as a resume places it; '' = none)
-- ARGV[16] with ARGV[10]: the fire count those were placed from: while the task's count
--          is still it (else a claim's commit moved it meanwhile: no revival)
-- ARGV[17] the task's schedule the caller placed the update from ('' = none read)
-- ARGV[18] with ARGV[10]: FLAG_ON when the task's grid had ended at its next time as read
--          (parked on a time its claims decided: not planned again)
-- Returns {code, status, placed, dropped, type}: CODE_OK updated, CODE_NOT_FOUND not
-- found, CODE_CONFLICT the schedule ARGV[17] names is no longer the task's (nothing done);
-- placed 1 when a schedule other than the task's took effect; dropped: the due times of
-- the waiting fires that went (comma separated, '' = none); type: the task's.
-- A new schedule takes effect at once: the claim (if any) is dropped so a poller holding it
-- cannot commit the old grid; a finished task with a new schedule becomes active again.
-- On another grid, the latest grid time the old schedule's claims decided is forgotten
-- (flight.lua): the new grid's times were never decided, even those before it; on the same
-- grid it stays, with the fire count and the next grid time (past a new end_ms or
-- max_runs: none, the task finishes or parks as below). A schedule sent again as it
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
  -- the caller placed the update from a schedule another update has replaced since: read
  -- again and placed again (placed as a new grid, a finished one-shot would fire again)
  if (ARGV[17] or '') ~= '' and ARGV[17] ~= sched then return {CODE_CONFLICT, ''} end
  local same = ARGV[10] == FLAG_ON and ARGV[17] == sched  -- (placed from it)
  local next_ms, score = ARGV[6], ARGV[7]
  if same then
    local n = s[STATE_NEXT_MS]
    local kept = n
    local f0 = get_flight(tag .. ':flight', id)
    -- a task parked on a time its claims decided (its grid ended there, fires wait behind
    -- it) does not plan that time again: without the policy's record (allow_all now) it
    -- would run twice. Another decided time (a claim's commit to come, held back, or
    -- refused by an API write) stays, its claim's fires found again (markers, the fire in
    -- flight appended once) and counted by the commit that moves it on.
    local pending = f0.inflight ~= '' and f0.by ~= '' and tonumber(f0.inflight) == n
    local parked = ARGV[18] == FLAG_ON and f0.hw and kept and kept <= f0.hw
    if parked and not pending then kept = nil end
    if kept then
      local past_end = ARGV[12] ~= '' and kept > tonumber(ARGV[12])
      local spent = ARGV[13] ~= '' and s[STATE_FIRES] >= tonumber(ARGV[13])
      if past_end or spent then
        next_ms = ''
      else
        next_ms, score = ms(kept), ms(kept + tonumber(ARGV[11]))
      end
    elseif ARGV[16] == ms(s[STATE_FIRES] or 0) then
      next_ms, score = ARGV[14], ARGV[15]
    elseif n then
      -- a claim's commit moved it since the caller read it (the revival was placed from
      -- an older state), and another claim holds its next time: left there, that claim's
      -- fires found again by the next one (commit_fires keeps a claim whose time stayed)
      next_ms, score = ms(n), ms(n + tonumber(ARGV[11]))
    else
      next_ms = ''  -- finished since the caller read it: it stays so
    end
  end
  if ARGV[9] ~= FLAG_ON then
    dropped = drop_waiting(tag, id, 'updated')
    redis.call('HDEL', tag .. ':flight', id)
  end
  local f = get_flight(tag .. ':flight', id)
  local decided = not same and f.hw
  if not same then
    f.hw = nil
    s[STATE_FIRES] = 0  -- fires count against max_runs of the schedule they were made by
    redis.call('HDEL', tag .. ':parked', id)  -- a park time of the grid it leaves
  end
  sched = ARGV[5]
  if s[STATE_STATUS] == FINISHED then s[STATE_STATUS] = ACTIVE end
  if next_ms == '' and s[STATE_STATUS] == ACTIVE and holds_task(f, ARGV[9] == FLAG_ON) then
    -- a schedule that never fires, with fires still waiting behind the one in flight (an
    -- operator's trigger or backfill its overlap policy held back), or that one
    -- unconfirmed: parked as a poller parks such a task (overlap.lua), on now (no grid
    -- time of the new schedule was decided)
    park_task(tag, id, f, s, KEYS[1])
  else
    if decided then put_flight(tag .. ':flight', id, f) end
    if next_ms == '' then
      if s[STATE_STATUS] == ACTIVE then s[STATE_STATUS] = FINISHED end
      s[STATE_NEXT_MS] = nil
      redis.call('ZREM', KEYS[1], id)
    else
      s[STATE_NEXT_MS] = tonumber(next_ms)
      if s[STATE_STATUS] == ACTIVE then
        -- due now if the end of its fire in flight woke it for fires waiting behind it,
        -- or that one is unconfirmed: not held back until the new grid's first time
        redis.call('ZADD', KEYS[1], placed_score(f, score), id)
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

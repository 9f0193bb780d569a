-- flight.lua: prepended to the scripts that read or write a task's flight record
-- (overlap.lua, end_flights.lua, commit_fires.lua, confirm_flights.lua; set_status.lua,
-- action_batch.lua and update_task.lua, which place a task anew). A record, in the
-- partition's flight hash under the task id, is six fields separated by '|': the due time
-- in flight ('' = none); the same again once a cancel_other fire asked for it to be
-- cancelled ('' = not asked); the dead streak ('' = 0; 'n:due' once a dead end was
-- counted: the due time of the last one, so the same end written again, its reply lost,
-- is not counted twice); the waiting due times (comma
-- separated, in order; 'm' marks one an operator's trigger or backfill held back); the
-- token of the claim or call that put the fire in flight, until its append is confirmed,
-- with when it did ('token@ms'; '' once confirmed: a commit, or the operator's call once
-- its append went through; one left over is a call that died, maybe before its append, or
-- one still on its way; 'm!token@ms' for an operator's fire a poller started from
-- waiting: appended again, it stays an operator's fire); and the latest grid time a
-- poller's claim decided ('' = none): a claim repeated after its poller died plans grid
-- times up to it again, and they are not decided twice (one that ran, or was skipped,
-- stays so). A task with none of these has no record.
local function get_flight(key, id)
  local raw = redis.call('HGET', key, id) or '|||||'
  local inflight, replaced, streak, waiting, by, final =
    string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  local count, dead = string.match(streak or '', '^(%d+):(%d+)$')
  local token, at = string.match(by or '', '^(.*)@(%d+)$')
  token = token or by or ''
  local manual = string.sub(token, 1, 2) == 'm!'
  if manual then token = string.sub(token, 3) end
  local f = {inflight = inflight or '', replaced = replaced or '',
             streak = tonumber(count or streak) or 0, dead = dead, waiting = {}, by = token,
             manual = manual,
             at = tonumber(at), hw = tonumber(final)}
  for w in string.gmatch(waiting or '', '[^,]+') do f.waiting[#f.waiting + 1] = w end
  return f
end

-- The record's token field: 'token@ms' while the fire in flight is unconfirmed ('token'
-- alone in a record an earlier version wrote; 'm!' first for an operator's fire whose
-- token does not say so), '' once confirmed or with none in flight.
local function by_field(f)
  if f.inflight == '' or f.by == '' then return '' end
  local by = f.by
  if f.manual and string.sub(by, 1, 7) ~= 'manual-' then by = 'm!' .. by end
  return f.at and (by .. '@' .. string.format('%d', f.at)) or by
end

local function put_flight(key, id, f)
  if f.inflight == '' and #f.waiting == 0 and f.streak == 0 and not f.dead and not f.hw then
    redis.call('HDEL', key, id)
  else
    redis.call('HSET', key, id, f.inflight .. '|' .. f.replaced .. '|' ..
      (f.dead and (tostring(f.streak) .. ':' .. f.dead) or (f.streak > 0 and tostring(f.streak))
        or '') .. '|' .. table.concat(f.waiting, ',') ..
      '|' .. by_field(f) .. '|' ..
      (f.hw and string.format('%d', f.hw) or ''))
  end
end

-- Whether the task's flight alone must keep it scheduled once its grid has ended (or
-- never fires again): fires wait behind the one in flight, or that one is unconfirmed
-- (its decider may have died before its append, and only a claim appends it again).
-- Finished, the task is out of the schedule, and nothing could wake it for them. Only a
-- task with an overlap policy (``tracked``): a claim of one without decides nothing of
-- its flight (overlap.lua), so kept scheduled it would plan its park time as a fire at
-- every claim (an operator's skip trigger leaves such a task a record).
local function holds_task(f, tracked)
  return tracked and (#f.waiting > 0 or (f.inflight ~= '' and f.by ~= ''))
end

-- Mark a task parked on ``at`` (the partition's parked hash: task id -> the time): that
-- time is counted in its fires already (the commit that parked it counted it; parked by
-- an operator's write on now, it is no grid time), so a wake, which plans it again, does
-- not count it again (overlap.lua), and ``upcoming`` does not list it. A mark is only
-- heeded while it is the flight's latest decided time: a task placed on another grid
-- forgets that time, and the mark with it.
local function mark_parked(tag, id, at)
  redis.call('HSET', tag .. ':parked', id, string.format('%d', at))
end

-- Park a task whose grid has ended while its flight holds it (holds_task): active, its
-- next time the latest grid time decided or now, whichever is later (a claim takes that
-- time as decided: overlap.lua), due now in the schedule, so its claim starts the waiting
-- fires (or appends the unconfirmed one again); it finishes once none is left. Finished,
-- it would be out of the schedule, and no end of the fire ahead could wake it
-- (end_flights.lua). The caller writes the state ``s``.
local function park_task(tag, id, f, s, schedule)
  local now = now_ms()
  f.hw = math.max(f.hw or 0, now)
  put_flight(tag .. ':flight', id, f)
  mark_parked(tag, id, f.hw)
  s[STATE_NEXT_MS] = f.hw
  redis.call('ZADD', schedule, ms(now), id)
end

-- A task's index score when an operator's write places it anew (a resume, a new
-- schedule): due now if its fire in flight ended with fires waiting behind it (that end
-- could not wake a task out of the schedule, end_flights.lua, nor one a claim had already
-- taken) or is unconfirmed (the claim appends it again once its decider must be gone),
-- rather than at its next grid time; ``score`` otherwise.
local function placed_score(f, score)
  if (f.inflight == '' and #f.waiting > 0) or (f.inflight ~= '' and f.by ~= '') then
    return ms(math.min(tonumber(score), now_ms()))
  end
  return score
end

-- Fires not run, per task: 'count reason due blocking' (the last one; count in all).
local function note_not_run(key, id, count, reason, due, blocking)
  local old = redis.call('HGET', key, id)
  local total = count + (old and tonumber(string.match(old, '^(%d+)')) or 0)
  redis.call('HSET', key, id, string.format('%d', total) .. ' ' .. reason .. ' ' .. due .. ' ' ..
    (blocking ~= '' and blocking or '-'))
end

-- The fires waiting behind a task's fire in flight that nothing will start: a task
-- stopped for good (no claim comes for it; reason 'stopped'), or given a schedule
-- without an overlap policy (its claims decide no flight; 'updated'). Left waiting, they
-- would be nowhere to be seen: they are dropped, noted not run in the partition's
-- not-run hash. Returns their due times, comma separated ('' = none), for the caller's
-- not_run lines. The fire in flight runs on.
local function drop_waiting(tag, id, reason)
  local key = tag .. ':flight'
  local f = get_flight(key, id)
  if #f.waiting == 0 then return '' end
  local dues = {}
  for _, w in ipairs(f.waiting) do dues[#dues + 1] = (string.gsub(w, '^m', '')) end
  note_not_run(tag .. ':notrun', id, #dues, reason, dues[#dues], '')
  f.waiting = {}
  put_flight(key, id, f)
  return table.concat(dues, ',')
end

-- The append of the fire this token put in flight went through: its decision stands.
-- Returns whether fires wait with none in flight: the fire in flight ended between the
-- claim's decision and this confirmation, and its end could not wake the task (claimed,
-- its score was already due), so the caller wakes it.
local function confirm_flight(key, id, token)
  local f = get_flight(key, id)
  if f.by == token and f.by ~= '' then
    f.by = ''
    put_flight(key, id, f)
  end
  return f.inflight == '' and #f.waiting > 0
end

-- status.lua: prepended (after records.lua) to the scripts that pause, resume or stop
-- tasks: set_status.lua (one task) and action_batch.lua (a batch of an operator's action),
-- so both change a task the same way (after flight.lua: a resume reads the flight record,
-- a stop drops the fires waiting in it).

-- Pause, resume or stop one task. schedule: the partition's schedule zset; next_ms and
-- score: a resume's next grid time and its index score ('' next_ms = never: finished);
-- note: the compact JSON note kept with the change ('' = none); version: a resume's, the
-- task's version (STATE_UPDATED_MS) next_ms was placed from ('' = not checked: a write
-- since, an update's new schedule, answers CODE_CONFLICT, nothing done; a record no write
-- has versioned since its creation has none, and is taken as read). A change replaces
-- the task's note in <tag>:notes (the earlier note described a status the task has left);
-- nothing is written when nothing changes. paused: a resume's 'count:last' of the grid
-- times the pause skipped ('' = none: actors.domain.misfires.paused_past), noted not run
-- (reason 'paused') in the partition's not-run record. Returns code, status, and the due
-- times of the fires a stop dropped (comma separated, '' = none: drop_waiting): code 1 changed,
-- 0 already so, -1 conflict, -2 not found, -3 not allowed from status.
local function change_status(tag, b, id, action, next_ms, score, note, schedule, tracked,
                             version, paused)
  local s = get_state(tag, b, id)
  if not s then return CODE_NOT_FOUND, '', '' end
  local status = s[STATE_STATUS]
  local stored = s[STATE_UPDATED_MS]
  if action == 'resume' and status == PAUSED and (version or '') ~= '' and stored
      and string.format('%d', stored) ~= version then
    return CODE_CONFLICT, STATUS_NAMES[status], ''
  end
  local target = ({pause = PAUSED, resume = ACTIVE, stop = STOPPED})[action]
  if status == target then return 0, STATUS_NAMES[status], '' end
  local allowed = (action == 'pause' and status == ACTIVE)
    or (action == 'resume' and status == PAUSED)
    or (action == 'stop' and (status == ACTIVE or status == PAUSED))
  if not allowed then return CODE_BAD_TRANSITION, STATUS_NAMES[status], '' end
  local dropped = ''
  -- a new version (commit_fires)
  s[STATE_STATUS], s[STATE_UPDATED_MS] = target, new_version(tag, s[STATE_UPDATED_MS])
  if action == 'resume' then
    local skipped, last = string.match(paused or '', '^(%d+):(%d+)$')
    if skipped then note_not_run(tag .. ':notrun', id, tonumber(skipped), 'paused', last, '') end
    local f = get_flight(tag .. ':flight', id)
    if next_ms == '' and holds_task(f, tracked) then
      -- its grid ended during the pause with fires still waiting behind the one in
      -- flight, or that one unconfirmed: parked as a poller parks such a task
      -- (overlap.lua; the grid times the pause skipped stay skipped)
      park_task(tag, id, f, s, schedule)
    elseif next_ms == '' then
      s[STATE_STATUS], s[STATE_NEXT_MS] = FINISHED, nil
    else
      s[STATE_NEXT_MS] = tonumber(next_ms)
      redis.call('ZADD', schedule, placed_score(f, score), id)
    end
  else
    redis.call('ZREM', schedule, id)
    if action == 'stop' then dropped = drop_waiting(tag, id, 'stopped') end
  end
  put_state(tag, b, id, s)
  if (note or '') ~= '' then
    redis.call('HSET', tag .. ':notes', id, note)
  else
    redis.call('HDEL', tag .. ':notes', id)
  end
  count_write(tag)
  return 1, STATUS_NAMES[s[STATE_STATUS]], dropped
end

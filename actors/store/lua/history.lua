-- history.lua: prepended to the scripts that decide a fire's fate (record_outcomes.lua,
-- overlap.lua, commit_fires.lua) and to those that delete tasks. Two records of a
-- task in its partition's slot, read by actors/store/history.py and
-- actors/store/ledger.py (the layout and its why are there):
--   <tag>:history   id -> the task's last occurrences, newest first: a 6-byte base due
--                   time (ms), then 12-byte entries: fate | origin << 3 | attempt << 5
--                   (1 byte; attempt 7 = 7 or more), due - base (5 bytes, signed, ms),
--                   start - due and run time (2 bytes each, a time code), node number (2)
--   <tag>:history:errors   id -> 'due attempt text' lines, newest first, of the failed
--                   entries still in the ring (at most HISTORY_ERRORS)
--   <tag>:attention id -> 'reason since_ms due_ms type': the task's latest occurrence
--                   needs an operator (dead, expired, skipped, late)
--   <tag>:attention:counts  'type reason' -> how many of the partition's tasks are so
-- Fate codes (FATE_*), HISTORY_ENTRY, HISTORY_ERRORS and NO_TIME: codes.lua.
-- The attention reason of each fate that puts a task on the list (nil: it leaves it).
local attention_of = {[FATE_DEAD] = 'dead', [FATE_SKIPPED] = 'skipped',
                      [FATE_MISFIRED] = 'skipped', [FATE_EXPIRED] = 'expired'}

-- A duration in 2 bytes: ms below 32,768, then whole seconds up to ~9 hours (more is
-- shown as that); NO_TIME when there is none (a fire that did not start).
local function time_code(v)
  if not v then return NO_TIME end
  if v < 32768 then return math.max(0, math.floor(v)) end
  return 32768 + math.min(32766, math.floor(v / 1000))
end

-- Put a task on the attention list (reason), or take it off (nil) unless its entry's
-- reason is kept (an ok not judged late or on time, a retry's or a trigger's, leaves a
-- 'late' entry: it says nothing of the schedule's fires). The count per type and reason
-- moves with it; an entry whose reason stays keeps the time it came.
local function set_attention(tag, id, reason, due, task_type, now, kept)
  local key, counts = tag .. ':attention', tag .. ':attention:counts'
  local old = redis.call('HGET', key, id)
  local since = now
  if old then
    local oreason, osince, _, otype = string.match(old, '^(%S+) (%S+) (%S+) (.*)$')
    if not reason and kept and oreason == kept then return end
    if oreason == reason and otype == task_type then since = osince end
    redis.call('HINCRBY', counts, (otype or '') .. ' ' .. (oreason or ''), -1)
  end
  if reason then
    redis.call('HSET', key, id, reason .. ' ' .. since .. ' ' .. due .. ' ' .. task_type)
    redis.call('HINCRBY', counts, task_type .. ' ' .. reason, 1)
  elseif old then
    redis.call('HDEL', key, id)
  end
end

-- Whether the ring already holds an entry of this due time and fate (a poller's decision
-- made again: its claim sent again after a lost reply, or claimed again after its commit
-- was refused).
local function in_ring(ring, due, fate)
  local base = struct.unpack('>I6', ring)
  for at = 7, #ring - HISTORY_ENTRY + 1, HISTORY_ENTRY do
    local head, offset = struct.unpack('>Bi5', ring, at)
    if head % 8 == fate and base + offset == due then return true end
  end
  return false
end

-- Whether the ring (a task's stored history, or false) holds an entry of this due time
-- of a fate other than expired (a time noted expired is noted again as before: counted
-- once, recorded once, its not_run line said again).
local function ring_decided(ring, due)
  if not ring or #ring < 6 + HISTORY_ENTRY then return false end
  local base = struct.unpack('>I6', ring)
  for at = 7, #ring - HISTORY_ENTRY + 1, HISTORY_ENTRY do
    local head, offset = struct.unpack('>Bi5', ring, at)
    if base + offset == due and head % 8 ~= FATE_EXPIRED then return true end
  end
  return false
end

-- Record one occurrence of a task (keep: the ring's length; 0 keeps none); once: not if
-- the ring holds it already (in_ring). Returns whether it was recorded.
local function push_history(tag, id, keep, fate, origin, attempt, due, lag, run, node, err,
                            once)
  if keep <= 0 then return false end
  local key = tag .. ':history'
  local old = redis.call('HGET', key, id)
  local base
  if old and #old >= 6 + HISTORY_ENTRY then
    if once and in_ring(old, due, fate) then return false end
    base = struct.unpack('>I6', old)
    if math.abs(due - base) >= 549755813888 then old = nil end  -- 17 years apart: anew
  else
    old = nil
  end
  if not old then base, old = due, struct.pack('>I6', due) end
  local entry = struct.pack('>Bi5HHH', fate + origin * 8 + math.min(attempt, 7) * 32,
    due - base, time_code(lag), time_code(run), node)
  redis.call('HSET', key, id,
    string.sub(old, 1, 6) .. entry .. string.sub(old, 7, 6 + (keep - 1) * HISTORY_ENTRY))
  if err then
    local ekey = tag .. ':history:errors'
    local lines = ms(due) .. ' ' .. attempt .. ' ' .. err .. '\n' ..
      (redis.call('HGET', ekey, id) or '')
    local cut, at = 0, 0
    for _ = 1, HISTORY_ERRORS do
      at = string.find(lines, '\n', at + 1, true)
      if not at then break end
      cut = at
    end
    redis.call('HSET', ekey, id, string.sub(lines, 1, cut))
  end
  return true
end

-- A deleted task's history and attention entry go with it.
local function forget_history(tag, id)
  redis.call('HDEL', tag .. ':history', id)
  redis.call('HDEL', tag .. ':history:errors', id)
  set_attention(tag, id, nil, '', '', '')
end

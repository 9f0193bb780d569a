-- end_flights: fires of tasks with an overlap policy, a catch-up window or a failure
-- limit have ended: their in-flight marks go, a fire waiting behind one is woken, and a
-- task whose fires ended dead too many times in a row is paused.
-- KEYS[1]  the partition's schedule zset   KEYS[2]  its flight hash   KEYS[3]  its notes hash
-- KEYS[4]  its not-run hash (an expired fire is noted there)
-- ARGV[1]  partition tag
-- ARGV[2..] groups of 7: task_id, bucket, end (0 ok, 2 dead, 3 cancelled, 4 expired,
--           5 dropped: an enqueue found the fire appended already), due_ms, pause after
--           this many dead fires in a row ('' = never), the error's line, the
--           creation version of the fire's task ('' = not known: flights.py
--           task_policy_code's ;b)
-- Returns {task_id, dead streak, ...} of the tasks it paused.
--
-- A mark is removed only by the fire it names (a fire cancel_other replaced, or one run
-- twice, ends nothing). The end of a fire of a task deleted meanwhile writes nothing, nor
-- does one of a task deleted and created again under the id since (its creation version
-- is not the fire's), but for a mark naming that fire: the new task starts with no
-- streak, and an old fire's dead end must not pause it. A woken task gets score now if
-- it is scheduled (ZADD XX LT: a paused or deleted task is not put back), so its poller
-- claims it and enqueues the waiting fire (overlap.lua). A pause is an API-like write:
-- new version, counted write.
local tag = ARGV[1]
local paused = {}
local now
-- The fire's own mark goes (a waiting fire's task woken), whoever's fire it was.
local function end_mark(f, id, due)
  if f.inflight == due then
    f.inflight, f.replaced = '', ''
    if #f.waiting > 0 then
      now = now or now_ms()
      redis.call('ZADD', KEYS[1], 'XX', 'LT', ms(now), id)
    end
    return true
  end
  return false
end
for i = 2, #ARGV, 7 do
  local id, b, ended, due, limit = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3],
    tonumber(ARGV[i + 4])
  local born = tonumber(ARGV[i + 6])
  local f = get_flight(KEYS[2], id)
  -- read only for an end that would change the task beyond its fire's own mark: a dead
  -- end (the streak), an expired one (a not-run note), an ok one that would reset a
  -- streak (most ok ends find none to reset, and read nothing)
  local created = born and (ended == 2 or ended == 4 or (ended == 0 and (f.streak > 0 or f.dead)))
    and created_ms(tag, b, id)
  if not redis.call('HGET', tag .. ':state:' .. b, id) then
    redis.call('HDEL', KEYS[2], id)  -- a deleted task: nothing of it is kept
  elseif created and created ~= 0 and created ~= born then
    -- a fire of an earlier task of the id (deleted since): no streak, pause or note of
    -- the new one; only a mark naming this fire goes (a decision about the earlier task
    -- made after its delete left it; no other end would ever clear it)
    if end_mark(f, id, due) then put_flight(KEYS[2], id, f) end
  elseif ended ~= 5 or f.inflight == due then
    end_mark(f, id, due)
    if ended == 2 and f.dead ~= due then  -- not the same end again (a reply lost)
      f.streak, f.dead = f.streak + 1, due
    elseif ended == 0 then
      f.streak, f.dead = 0, nil
    end
    if ended == 4 then note_not_run(KEYS[4], id, 1, 'expired', due, '') end
    if limit and f.streak >= limit then
      local s = get_state(tag, b, id)
      if s and s[STATE_STATUS] == ACTIVE then
        now = now or now_ms()
        s[STATE_STATUS], s[STATE_UPDATED_MS] = PAUSED, new_version(tag, s[STATE_UPDATED_MS])
        redis.call('ZREM', KEYS[1], id)
        put_state(tag, b, id, s)
        count_write(tag)
        redis.call('HSET', KEYS[3], id, cjson.encode({note = ARGV[i + 5], action = 'pause',
          reason = 'failures', failures = f.streak, at_ms = now}))
        paused[#paused + 1] = id
        paused[#paused + 1] = f.streak
      end
      f.streak = 0
    end
    put_flight(KEYS[2], id, f)
  end
end
return paused

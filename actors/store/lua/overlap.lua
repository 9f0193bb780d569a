-- overlap: decide which planned fires of tasks with an overlap policy start now, and note
-- the fires not run (overlap, expired). One call per partition per tick, only for the
-- claimed tasks that have a policy or an expired fire; atomic with the in-flight marks.
-- KEYS[1]  the partition's flight hash ({ns:P}:flight)   KEYS[2]  its not-run hash
-- ARGV[1]  most fires a buffer_all task keeps waiting   ARGV[2]  this claim's (or call's)
--          token: the fires it puts in flight are unconfirmed until its commit
--          (commit_fires.lua) or, for an operator's call, confirm_flights.lua
-- ARGV[3]  FLAG_ON: a poller's claim of grid times (FLAG_OFF: an operator's trigger or
--          backfill)
-- ARGV[4]  partition tag   ARGV[5]  history length (grid times not run are occurrences of
--          their task: history.lua, each recorded once however often it is decided
--          again; the latest puts the task on the attention list)
-- ARGV[6]  buckets per partition (a task deleted since its claim gets no history; an
--          operator's call reads the task's status: below)
-- ARGV[7]  ms after which a fire another claim or call put in flight, unconfirmed, is
--          taken as its decider's that died (appended again): its decider may still be
--          on its way to its append until then (0: at once)
-- ARGV[8]  the partition's count of API writes as the claim read it ('' : not checked, an
--          operator's call): when it moved, a task whose version is no longer the claimed
--          one (updated, paused, resumed, stopped, deleted since) is not decided for: its
--          wait is 1 ms, so its commit, which finds it changed, leaves it to its next claim
--          (a decision of the old definition would write over the flight record the write
--          reset: a grid time of the new schedule taken as decided, fires made to wait
--          that the new policy runs at once)
-- ARGV[9..] per task: task_id, type, policy (A allow_all: expired times noted only, S skip,
--           1 buffer_one, B buffer_all, C cancel_other), FLAG_ON if the plan ends the task's
--           grid ('' otherwise), its version as claimed, n, m, then n planned due times (in
--           order), then m expired due times (later than the catch-up window: not run, only
--           noted)
-- Returns per task: {task_id, due times to enqueue (comma separated; prefixed 'r' when an
-- earlier decision put it in flight and was never confirmed: if the enqueue finds it
-- appended already, that copy is the one in flight; then 'm' when an operator's call
-- held it back, or put it in flight unconfirmed), due times of fires to cancel (comma separated), skipped due times
-- (comma separated), the due time in flight they waited on ('' = none), the last grid
-- time if the grid ended with fires still waiting ('' = none: the poller keeps the task
-- scheduled until they start; now when no grid time was decided), ms to wait before
-- deciding again ('' = decided: below),
-- the expired times not noted because decided before (comma separated), how many of the
-- planned and expired times were counted before (a parked task's wake: below)}.
--
-- Waiting: a grid decision whose times include the task's fire in flight, put there by
-- another decider that has not confirmed its append and may still be on its way to it
-- (within ARGV[7]), decides nothing: its claim would otherwise count that time decided
-- and move the grid past a fire that is never appended if its decider died. The poller
-- holds the task back that long; decided again then, the fire is appended ('r').
--
-- The fire in flight is a task's fire from its enqueue until it is acknowledged,
-- dead-lettered or its retries end (end_flights.lua). skip: a due time that comes while
-- one is in flight is not run; buffer_one: one waits, later ones are not run;
-- buffer_all: all wait (up to ARGV[1]), in order; cancel_other: the one in flight is asked
-- to cancel (cancel_fires.lua; asked again at every decision until it ends) and the
-- newest due time waits for it to end.
-- Repeats are safe (but a claim's for a task changed since: ARGV[8]): the same claim sent
-- again after a lost reply, or any decision after
-- a poller or API call died before its append was confirmed, enqueues the fire in flight
-- again (the enqueue markers drop a copy where the dying claim had appended one; past the
-- dedupe window it may run twice, as at-least-once allows, never not at all); a grid time
-- decided before (in flight, waiting, skipped, or run and ended) is not decided again.
local cap, token = tonumber(ARGV[1]), ARGV[2]
local grid = ARGV[3] == FLAG_ON
local tag, keep, buckets = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local takeover = tonumber(ARGV[7])
local written = grid and ARGV[8] ~= ''
  and (redis.call('HGET', tag .. ':poller', 'writes') or '0') ~= ARGV[8]
local out = {}
local now = now_ms()
local i = 9
while i <= #ARGV do
  local id, task_type, policy, ends = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3] == FLAG_ON
  local version = ARGV[i + 4]
  local n, m = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  local first = i + 7
  i = first + n + m
  local run, skipped, cancel, blocking, park, wait = {}, {}, {}, '', '', ''
  -- skipped times that are an operator's fires (a trigger or backfill), not grid times:
  -- said not run, but no occurrence of the grid for the history (a grid time is there as
  -- decided before; a trigger never is one)
  local operators = {}
  local function skip(d, manual)
    skipped[#skipped + 1] = d
    if manual then operators[d] = true end
  end
  -- The task's state, read once when needed (try_state: nil when deleted, false when it
  -- cannot be read): a deleted task's fires not run are noted nowhere (its records are
  -- gone, and a task created again under the id must not inherit the notes).
  local state, read = nil, false
  local function task_state()
    if not read then state, read = try_state(tag, bucket_of(id, buckets), id), true end
    return state
  end
  local function exists() return task_state() ~= nil end
  local f = policy ~= 'A' and get_flight(KEYS[1], id)
  if f and written then
    local s = task_state()
    if not s or ms(s[STATE_UPDATED_MS] or 0) ~= version then f, wait = false, '1' end
  end
  local decided = grid and f and f.hw  -- the latest grid time decided before this call
  local before = {}  -- the times in flight or waiting before this call
  if decided then
    if f.inflight ~= '' then before[f.inflight] = true end
    if f.replaced ~= '' then before[f.replaced] = true end
    for _, w in ipairs(f.waiting) do before[(string.gsub(w, '^m', ''))] = true end
  end
  if f and f.inflight ~= '' and f.by ~= '' and f.by ~= token and f.at and grid
      and now - f.at < takeover then
    -- a claim that plans no time (woken before its grid time, or every missed time
    -- skipped) or ends the grid (parked) waits too: deciding now, it would append nothing
    -- and finish the task (the fire never appended if its decider died) or leave it on
    -- its grid (appended again only at its next grid time; the poller waits no longer)
    local hit = n + m == 0 or ends
    for j = first, first + n + m - 1 do
      if ARGV[j] == f.inflight then hit = true end
    end
    if hit then wait = string.format('%d', f.at + takeover - now) end
  end
  if f and wait == '' then
    local held = grid and '' or 'm'  -- how an operator's waiting fire is marked
    local again = ''  -- the fire in flight this call appends again (unconfirmed), if any
    local function start(w)
      local manual = string.sub(w, 1, 1) == 'm'
      f.inflight, f.replaced, f.by, f.at = manual and string.sub(w, 2) or w, '', token, now
      f.manual = manual
      run[#run + 1] = w
    end
    if f.inflight ~= '' and f.by ~= '' then
      -- Unconfirmed: maybe never appended. Appended again by the same claim sent again,
      -- or once its decider must be gone; before that, another claim or call leaves it
      -- to its decider (both appending it would run it twice).
      if f.by == token or not f.at or now - f.at >= takeover then
        -- an operator's fire (put in flight by its call, its token 'manual-...':
        -- manual_fires.py, or started from waiting by a poller: flight.lua's manual) stays
        -- one: 'rm', appended with the policy's letter alone (no catch-up window), whoever
        -- appends it again
        f.manual = f.manual or string.sub(f.by, 1, 7) == 'manual-'
        run[#run + 1] = 'r' .. (f.manual and 'm' or '') .. f.inflight
        again = f.inflight
        f.by, f.at = token, now
      end
    elseif f.inflight == '' and #f.waiting > 0
        and (grid or string.sub(f.waiting[1], 1, 1) == 'm') then
      -- a waiting fire starts first; an operator's call starts only an operator's fire
      -- (a trigger or backfill held back): grid fires are left to the task's poller,
      -- woken by the end of the fire ahead (a paused task's once it resumes), which
      -- appends them with the task's own code, and the call's own fire starts
      start(table.remove(f.waiting, 1))
    end
    if f.replaced ~= '' then cancel[#cancel + 1] = f.replaced end  -- until it has ended
    local waiting = {}
    for _, w in ipairs(f.waiting) do waiting[(string.gsub(w, '^m', ''))] = true end
    -- No fire waits behind the fire in flight of a task that no claim will start it for:
    -- one stopped or deleted since its claim or the operator's read (a stop drops the
    -- fires waiting then: flight.lua's drop_waiting), or, for an operator's fire, one
    -- finished (the API refuses such a call; this one read the task before its last grid
    -- fire was committed). It is not run, as a skip task's would be. Read when a time
    -- would wait (also behind the call's own first fire: a backfill).
    local function cannot_wait()
      local s = task_state()
      local status = s and s[STATE_STATUS]
      return not exists() or status == STOPPED or (not grid and status == FINISHED)
    end
    for j = first, first + n - 1 do
      local d = ARGV[j]
      if d == f.inflight and not grid and d ~= again then
        -- an operator's fire (a backfill) of the time whose own fire is in flight: not
        -- run beside it, nor held (it would wait behind itself), and said so
        skip(d, true)
        blocking = d
      elseif d == f.inflight or waiting[d] or (grid and f.hw and tonumber(d) <= f.hw) then
        -- decided before: in flight, waiting, or (a grid time) skipped, run or ended
      elseif f.inflight ~= '' and policy ~= 'S' and cannot_wait() then
        skip(d, not grid)
        blocking = f.inflight
      elseif f.inflight == '' then
        start(held .. d)
      elseif policy == 'C' then
        local last = run[#run]
        if last == f.inflight or last == 'm' .. f.inflight then  -- put in flight now
          run[#run] = nil  -- never appended: replaced at once, never runs
          skip(f.inflight, last ~= f.inflight)
          blocking = d
          start(held .. d)
        else  -- cancelled wherever it is; the newest due time waits for it to end
          if f.replaced ~= f.inflight then
            cancel[#cancel + 1], f.replaced = f.inflight, f.inflight
          end
          for _, w in ipairs(f.waiting) do
            local due = string.gsub(w, '^m', '')
            skip(due, due ~= w)
            waiting[due] = nil
          end
          f.waiting, waiting[d], blocking = {held .. d}, true, f.inflight
        end
      elseif (policy == '1' and #f.waiting == 0) or (policy == 'B' and #f.waiting < cap) then
        f.waiting[#f.waiting + 1], waiting[d] = held .. d, true
      else
        skip(d, not grid)
        blocking = f.inflight
      end
    end
    if grid and n + m > 0 then  -- the latest grid time decided: expired ones count too
      local last = math.max(n > 0 and tonumber(ARGV[first + n - 1]) or 0,
                            m > 0 and tonumber(ARGV[first + n + m - 1]) or 0)
      f.hw = math.max(f.hw or 0, last)
    end
    if ends and #f.waiting > 0 then
      -- parked on the latest grid time decided; on now when none is (a grid that ended
      -- with none planned: all of it skipped, or a schedule with none left)
      f.hw = f.hw or now
      park = string.format('%d', f.hw)
    end
    put_flight(KEYS[1], id, f)
  end
  -- The expired grid times to note: none when decided when claimed again; none decided
  -- before, which go back as known: the flight's latest grid time decided (a parked task
  -- is planned again at its park time at each wake), a time in flight or waiting before
  -- this call, or one up to that latest time its history holds as run or skipped (a
  -- claim repeated after its poller died plans them again). A time below it that none of
  -- these holds (owed after a takeover, never decided; or decided longer ago than the
  -- history keeps) is noted; one noted expired before is noted again, counted once.
  local expired, known = {}, {}
  local ring
  if wait == '' then
    for j = first + n, first + n + m - 1 do
      local d = tonumber(ARGV[j])
      local seen = decided and (d == decided or before[ARGV[j]])
      if decided and not seen and d <= decided and keep > 0 then
        if ring == nil then ring = redis.call('HGET', tag .. ':history', id) or false end
        seen = ring_decided(ring, d)
      end
      if seen then known[#known + 1] = ARGV[j] else expired[#expired + 1] = ARGV[j] end
    end
  end
  -- Expired grid times are noted last, in order: a record whose last note is 'expired'
  -- holds the latest one noted, and a decision made again (the same claim sent again, a
  -- task whose stream Redis rejects claimed again with its grid unmoved) counts only the
  -- later ones, so the count says how many fires were dropped, not how often. (Only a
  -- count: after a new schedule whose grid starts before that time, or a consumer's own
  -- 'expired' note between two decisions, it may be off by the times it cannot tell.)
  local fresh = #expired
  if grid and fresh > 0 then
    local last = string.match(redis.call('HGET', KEYS[2], id) or '', '^%d+ expired (%d+) ')
    if last then
      last = tonumber(last)
      while fresh > 0 and tonumber(expired[#expired - fresh + 1]) <= last do fresh = fresh - 1 end
    end
  end
  local noted = (#skipped > 0 or fresh > 0) and exists()
  if #skipped > 0 and noted then
    note_not_run(KEYS[2], id, #skipped, 'overlap', skipped[#skipped], blocking)
  end
  if fresh > 0 and noted then note_not_run(KEYS[2], id, fresh, 'expired', expired[#expired], '') end
  -- The grid times not run go into the history, whoever decided (an operator's
  -- cancel_other fire displaces the grid fires waiting)
  local fates = {}
  for _, d in ipairs(skipped) do
    if not operators[d] then fates[#fates + 1] = {tonumber(d), FATE_SKIPPED} end
  end
  if grid then
    for _, d in ipairs(expired) do fates[#fates + 1] = {tonumber(d), FATE_EXPIRED} end
  end
  if #fates > 0 and exists() then
    table.sort(fates, function(a, b) return a[1] < b[1] end)
    local recorded = false
    for _, e in ipairs(fates) do
      recorded = push_history(tag, id, keep, e[2], 0, 0, e[1], nil, nil, 0, nil, true) or recorded
    end
    if recorded or keep <= 0 then
      local last = fates[#fates]
      set_attention(tag, id, attention_of[last[2]], ms(last[1]), task_type, ms(now))
    end
  end
  -- A parked task's wake plans the time it is parked on again (so does its first claim
  -- after an update on its grid revived it there): counted already (its mark,
  -- flight.lua's mark_parked, is the flight's latest decided time), it is not counted
  -- again. A time decided by a claim whose commit never came (its poller died, an API
  -- write refused it) has no mark, and is counted when claimed again. The mark is read
  -- only for a claim that plans a time decided before.
  local counted, again_planned = 0, false
  if decided and wait == '' then
    for j = first, first + n + m - 1 do
      if tonumber(ARGV[j]) <= decided then again_planned = true end
    end
  end
  if again_planned then
    local parked = tonumber(redis.call('HGET', tag .. ':parked', id))
    if parked == decided then
      for j = first, first + n + m - 1 do
        if tonumber(ARGV[j]) == parked then counted = counted + 1 end
      end
    end
  end
  out[#out + 1] = {id, table.concat(run, ','), table.concat(cancel, ','),
    table.concat(skipped, ','), blocking, park, wait, table.concat(known, ','), counted}
end
return out

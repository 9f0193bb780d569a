-- record_outcomes: update tasks of one partition after their fires ran (or did not).
-- KEYS[1]  schedule zset of the partition (only for its slot)
-- ARGV[1]  partition tag   ARGV[2]  history length (0 = none kept)
-- ARGV[3]  the node's number (history.lua)
-- ARGV[4]  MessagePack of the rows' types in order, each with its lateness bound and its
--           number of rows: type, ms (0 = none), rows, type, ms, rows, ... (the consumers
--           of one process write their batches in one call a partition)
-- ARGV[5]  MessagePack of one flat array, rows of 11 (one C call decodes them all, its
--           numbers arriving as numbers; the bucket a string, for key names): task_id,
--           bucket, outcome code (0 ok, 1 retry, 2 dead,
--           3 cancelled, 4 expired: not run), finished_ms, error ('' = none), due_ms,
--           started_ms ('' = did not start), attempt, origin (0 schedule, 1 trigger,
--           2 backfill, 3 replay), the error's line (queue_rows.py error_line), and the lateness the fire was
--           allowed (its spread and jitter, ms; '' = not judged: a retry or a manual fire)
-- Returns, per group, the number of its tasks updated (a deleted task is skipped), or the
-- error its write met (a string): a group whose write fails (a key of the wrong type) ends
-- there and the next group goes on, so one batch's trouble never makes another batch's
-- rows fail (and be written again). A group with tasks whose run record (or the state
-- record it starts from) cannot be decoded (a hand edit, another program) answers
-- {number, task ids...}: those tasks' history and attention are written, their counts
-- are not (their record is left as it is), and no other task's outcome waits on them.
-- ok resets the consecutive-failure count (retries) and forgets the last error; retry and
-- dead increase it and keep the error in the partition's errors hash; a fire not run
-- changes neither. Every outcome is an occurrence in the task's history; dead, expired
-- and a start later than the bound (beyond its allowance) put the task on the attention
-- list, any other ok takes it off (history.lua).
-- Outcomes go to the task's run record, never its state record: the state is its poller's
-- and the API's alone (commit_fires relies on that). A task without a run record (not run
-- since it was created, or since layout 2) starts from the counts in its state record.
local tag, keep, node = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local groups = cmsgpack.unpack(ARGV[4])
local fate_of = {[0] = FATE_OK, FATE_FAILED, FATE_DEAD, FATE_CANCELLED, FATE_EXPIRED}
local now
-- Whether any task of the partition is on the attention list: while none is (the usual
-- case), an ok fire has no entry to take off and costs no lookup. (EXISTS: an emptied
-- hash is gone; and the command the shipped ACL grants, deploy/redis/users.acl.)
local listed = redis.call('EXISTS', tag .. ':attention') == 1
-- The partition's keys rows write beside their own records, checked (an HGET, once a
-- call; TYPE is not in the shipped ACL) only when a group's rows would write them: one
-- that holds another kind of value (a hand edit, another program) fails the group before
-- it writes anything (record_group), so the consumer's tries again write no row twice,
-- and the error names the key. Each is kept as false (fine) or its error, Redis's code
-- first.
local kinds = {}
local function wrong(name)
  local key = tag .. ':' .. name
  if kinds[key] == nil then
    local reply = redis.pcall('HGET', key, '')
    kinds[key] = type(reply) == 'table' and reply.err and reply.err .. ' (' .. key .. ')'
      or false
  end
  return kinds[key] or nil
end

-- The error of the key of another kind that row i of a would write, or nil; r: its run
-- record.
local function wrong_key(a, i, r, late)
  local outcome = a[i + 2]
  if outcome <= 2 and (outcome > 0 or (r[RUN_LAST_STATUS] or 0) ~= 0) then
    local bad = wrong('errors')
    if bad then return bad end
  end
  if keep > 0 then
    local bad = wrong('history') or (a[i + 9] ~= '' and wrong('history:errors'))
    if bad then return bad end
  end
  -- the attention list: as record_group decides it, below
  local started, allowed = tonumber(a[i + 6]), tonumber(a[i + 10])
  local is_late = late > 0 and allowed and started and started - a[i + 5] - allowed > late
  if outcome == 2 or outcome == 4 or (outcome == 0 and (listed or is_late)) then
    return wrong('attention') or wrong('attention:counts')
  end
  return nil
end

-- One group's rows (those of one type), a[first .. last]: how many tasks it updated.
-- A run record's count or status: a number, or none yet.
local function is_count(v)
  return v == nil or type(v) == 'number'
end

local function record_group(a, first, last, task_type, late)
  -- Every row's run record read first (a task's rows share one, updated in turn): a key
  -- Redis refuses to read, or a partition key of another kind a row would write (wrong),
  -- fails the group before it writes anything, naming the task, so the consumer's tries
  -- again (actors/execution/held_back.py) write nothing twice. A record that reads but
  -- does not decode is that task's alone: it is left as it is (unread[id]).
  local runs, unread, named = {}, {}, {}
  for i = first, last, 11 do
    local id, b = a[i], a[i + 1]
    if runs[id] == nil then
      local ok, r = pcall(get_run, tag, b, id)
      local text = not ok and (type(r) == 'table' and r.err or tostring(r))
      if text and string.match(text, '^%u[%u_]* ') then  -- Redis's reply: its code first
        error({err = text .. ' (the run record of task ' .. id .. ', ' .. tag .. ':run:' ..
          b .. ', cannot be read)'})  -- (WRONGTYPE, NOPERM): the caller classifies it
      end
      if not ok or (r and not (is_count(r[RUN_RUNS]) and is_count(r[RUN_RETRIES])
          and is_count(r[RUN_LAST_STATUS]))) then
        r, unread[id] = {}, true
        named[#named + 1] = id
      end
      runs[id] = r or false
    end
    local bad = runs[id] and wrong_key(a, i, runs[id], late)
    if bad then
      error({err = bad .. ': the outcome of task ' .. id .. ' is written there'})
    end
  end
  local n = 0
  for i = first, last, 11 do
    local id, b, outcome = a[i], a[i + 1], a[i + 2]
    local r = runs[id]
    if r then
      local finished = a[i + 3]
      if outcome <= 2 then
        -- only after a failure is there an error to forget
        local failed_before = r[RUN_LAST_STATUS] and r[RUN_LAST_STATUS] ~= 0
        r[RUN_LAST_RUN_MS], r[RUN_LAST_STATUS] = finished, outcome
        if outcome == 0 then
          r[RUN_RUNS], r[RUN_RETRIES] = (r[RUN_RUNS] or 0) + 1, nil
          if failed_before then redis.call('HDEL', tag .. ':errors', id) end
        else
          r[RUN_RETRIES] = (r[RUN_RETRIES] or 0) + 1
          redis.call('HSET', tag .. ':errors', id, a[i + 4])
        end
      end
      local fate, due, started = fate_of[outcome], a[i + 5], tonumber(a[i + 6])
      local line, allowed = a[i + 9], tonumber(a[i + 10])
      local lag = started and started - due
      push_history(tag, id, keep, fate, a[i + 8], a[i + 7], due, lag,
        started and finished - started, node, line ~= '' and line or nil)
      local reason = attention_of[fate]
      if fate == FATE_OK and late > 0 and allowed and lag and lag - allowed > late then
        reason = 'late'
      end
      if reason then now, listed = now or now_ms(), true end
      if reason or (fate == FATE_OK and listed) then  -- an ok on time takes the task off
        set_attention(tag, id, reason, due, task_type, reason and ms(now) or '',
          not allowed and 'late' or nil)
      end
      -- the run record last: should a write above fail all the same (the keys were
      -- checked before the group's first row), its count has not moved
      if outcome <= 2 and not unread[id] then put_run(tag, b, id, r) end
      n = n + 1
    end
  end
  if #named == 0 then return n end
  local out = {n}  -- (no unpack: a group may name more tasks than it takes)
  for _, id in ipairs(named) do out[#out + 1] = id end
  return out
end

local a = cmsgpack.unpack(ARGV[5])
local first = 1
local replies = {}
for g = 1, #groups, 3 do
  local last = first + 11 * groups[g + 2] - 1
  local ok, n = pcall(record_group, a, first, last, groups[g], groups[g + 1])
  replies[#replies + 1] = ok and n or (type(n) == 'table' and n.err or tostring(n))
  first = last + 1
end
return replies

-- commit_fires: advance the schedule of claimed tasks whose fires are in their stream.
-- KEYS[1]  schedule zset of the partition   KEYS[2]  the partition's owner hash
-- KEYS[3..2+M]  enqueue markers of this claim that must be there (one server only: they
--          live in the streams' slots)
-- ARGV[1]  partition tag   ARGV[2]  poller id   ARGV[3]  claim token
-- ARGV[4]  the partition's write count as the claim read it
-- ARGV[5]  M, how many markers to check   ARGV[6..5+M]  the field each must hold (the part
--          of the claim its enqueue call wrote)
-- ARGV[6+M]  T, how many tasks of the claim have an overlap policy and were decided for
--          by it (overlap.lua; FireCommit.confirm: not those held back to wait)
-- ARGV[7+M..6+M+T]  their ids: their appends went through (the markers are there), so
--          their decisions are confirmed (flight.lua), whatever the rest of the commit does;
--          one whose fire in flight ended meanwhile, fires waiting, is committed with score
--          now instead of its next grid time's (its end could not wake it, end_flights.lua)
-- ARGV[7+M+T]  K, how many tasks of the claim missed grid times
-- then K groups of 5: task_id, history fate (coalesced or skipped: misfire), the first
--          grid time missed, type, history length: one history entry each, written when
--          the task's commit is (history.lua)
-- then one value: MessagePack of one flat array (one C call decodes it), groups of 5:
--           task_id, bucket (a string: it goes into key names), score (a string, for ZADD;
--           '' = finished: out of the schedule, unless its flight holds it (a tracked
--           task with a fire waiting or unconfirmed: parked, flight.lua's holds_task);
--           '^score' = parked by its claim: its next time (the latest grid time its
--           flight decided, or now when none was) is counted by this commit, or is no
--           grid time (flight.lua's mark_parked);
--           '+ms' = held back: this long after now, the
--           task's fires not appended, its state the claimed one, a fire this claim put
--           in flight for it left to its next decision; '*ms' the same, the claim kept in
--           flight: its type needed several enqueue calls, one may have gone through),
--           due_ms (a number: the grid time claimed),
--           the new state record (the claimed one with its grid moved on and its fires
--           counted, built by the poller; its version, STATE_UPDATED_MS, is the claimed one)
-- Returns {earliest score in the zset after the commit or NONE, lost ids...}, or
-- {NOT_ENQUEUED} when a marker is missing: an enqueue pipelined ahead of this commit did
-- not complete, so
-- nothing changes (a grid time moves only after its fires are in the stream). Fencing: if
-- the partition is no longer this poller's, or the claim is no longer in flight (another
-- owner took the partition over), nothing changes and every id is lost (the new owner
-- claims those grid times again) but those whose state is already the one this commit
-- writes: the same commit ran before and its reply was lost. A task is also lost when an API write changed it since the
-- claim (its updated_ms or grid time moved: updated, paused, stopped, deleted and created
-- again) or deleted it; it is left as that write put it (not one whose state is the one
-- this commit writes: the commit, kept in flight, sent again after its reply was lost),
-- but for a pause or a stop on the grid time claimed: the claim's fires are in the stream,
-- so they are counted (no claim comes to count them).
--
-- Every API write to a partition's tasks counts itself in the owner hash ('writes'), and
-- nothing else writes a state record but its partition's one poller (outcomes go to the
-- run records). So when the count is what the claim read, no claimed state changed, and
-- each task costs a write and its part of one ZADD: no read, no MessagePack work.
-- Otherwise each state is read and checked as claimed first.
local tag, me, token = ARGV[1], ARGV[2], ARGV[3]
local checks = tonumber(ARGV[5])
for i = 1, checks do  -- HGET, not HEXISTS: the ACL a deployment granted (deploy/redis)
  if not redis.call('HGET', KEYS[2 + i], ARGV[5 + i]) then return {NOT_ENQUEUED} end
end
local confirms = tonumber(ARGV[6 + checks])
local wake, tracked = {}, {}
for i = 7 + checks, 6 + checks + confirms do
  tracked[ARGV[i]] = true
  if confirm_flight(tag .. ':flight', ARGV[i], token) then wake[ARGV[i]] = true end
end
local misfires_at = 7 + checks + confirms
local misfires = tonumber(ARGV[misfires_at])
local tasks_from = misfires_at + 1 + 5 * misfires  -- the tasks' array
local a = cmsgpack.unpack(ARGV[tasks_from])
local o = redis.call('HMGET', KEYS[2], 'poller', 'inflight', 'writes')
local inflight = o[2] or ''
local at = string.find(' ' .. inflight, ' ' .. token .. ':', 1, true)
local function out_with_earliest(reply)
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then reply[1] = tonumber(first[2]) end
  return reply
end
-- Row i's state parked on ``hw`` (``park_time``, below): the claimed one, its grid moved
-- on, but active, its next time the park time.
local function parked_record(i, hw)
  local st = {cmsgpack.unpack(a[i + 4])}
  st[STATE_STATUS], st[STATE_NEXT_MS] = ACTIVE, hw
  return cmsgpack.pack(unpack(st, 1, STATE_VALUES))
end
-- Whether row i's stored state is the one this commit writes: this commit wrote it (sent
-- again after its reply was lost), or an identical one did (for a row that ends the grid,
-- the one parked on its flight's time, if its flight kept it).
local function written(i)
  local stored = redis.call('HGET', tag .. ':state:' .. a[i + 1], a[i])
  if stored == a[i + 4] then return true end
  if a[i + 2] ~= '' or not stored or not tracked[a[i]] then return false end
  local hw = get_flight(tag .. ':flight', a[i]).hw
  return hw ~= nil and stored == parked_record(i, hw)
end
local out = {NONE}
if o[1] ~= me or not at then
  -- Not in flight: taken over, or this very commit already ran and its reply was lost
  -- (the caller sends it again). A task whose stored state is the one this commit writes
  -- was committed by it, and is not lost.
  for i = 1, #a, 5 do
    if not written(i) then out[#out + 1] = a[i] end
  end
  if o[1] == me then return out_with_earliest(out) end
  return out
end
local unchanged = (o[3] or '0') == ARGV[4]
local keep = false
local moved, finished = {}, {}  -- the zset's changes, a few commands for the whole batch
-- A held task's fire this claim put in flight has no decider left on its way: the task's
-- next decision appends it at once (a 'by' without its time: overlap.lua), held or lost.
local function undecided(id)
  local f = get_flight(tag .. ':flight', id)
  if f.by == token and f.at then
    f.at = nil
    put_flight(tag .. ':flight', id, f)
  end
end
-- A task whose grid this commit ends that its flight must keep scheduled (flight.lua's
-- holds_task; its overlap policy sent it to the confirm list): the time it is parked on
-- (the latest grid time decided, now if none), or false. Read only for a task this
-- commit finishes.
local function park_time(id)
  if not tracked[id] then return false end
  local f = get_flight(tag .. ':flight', id)
  if not holds_task(f, true) then return false end
  if not f.hw then
    f.hw = now_ms()
    put_flight(tag .. ':flight', id, f)
  end
  return f.hw
end
for i = 1, #a, 5 do
  local id, b, score = a[i], a[i + 1], a[i + 2]
  local mark = string.byte(score, 1)
  local held = mark == 43 or mark == 42  -- '+', '*'
  local s, due
  local ok = unchanged
  if not ok then
    s, due = get_state(tag, b, id), a[i + 3]
    local claimed_version = select(STATE_UPDATED_MS, cmsgpack.unpack(a[i + 4])) or 0
    ok = s ~= nil and s[STATE_STATUS] == ACTIVE and s[STATE_NEXT_MS] == due
      and (s[STATE_UPDATED_MS] or 0) == claimed_version
  end
  local parked = ok and score == '' and park_time(id)
  if parked then
    -- its grid ended, but a fire waits behind its fire in flight (an operator's call
    -- decided it after this claim's decision) or that one is unconfirmed: kept active and
    -- due now, on a time its flight counts decided, so its claim starts the fire (or
    -- parks it until the fire ahead ends: overlap.lua), rather than finished out of the
    -- schedule, where no end could wake it. Counted as a write: the state is not the
    -- one the poller built, which it would otherwise take as known at its next claim.
    redis.call('HSET', tag .. ':state:' .. b, id, parked_record(i, parked))
    mark_parked(tag, id, parked)
    count_write(tag)
    moved[#moved + 1] = ms(now_ms())
    moved[#moved + 1] = id
  elseif ok then
    redis.call('HSET', tag .. ':state:' .. b, id, a[i + 4])
    if mark == 94 then  -- '^': parked by its claim, on a time this commit counts
      score = string.sub(score, 2)
      mark_parked(tag, id, select(STATE_NEXT_MS, cmsgpack.unpack(a[i + 4])))
    end
    if score == '' then
      finished[#finished + 1] = id
    else
      if wake[id] then
        score = ms(now_ms())
      elseif held then
        -- '*': its type needed several calls, of which an earlier one may have gone
        -- through; claimed again, it must find what that appended: kept in flight.
        keep = keep or mark == 42
        score = ms(now_ms() + tonumber(string.sub(score, 2)))
        undecided(id)
      end
      moved[#moved + 1] = score
      moved[#moved + 1] = id
    end
  elseif not written(i) then
    if held then undecided(id) end
    if not held and s and (s[STATE_STATUS] == PAUSED or s[STATE_STATUS] == STOPPED)
        and s[STATE_NEXT_MS] == due then
      -- paused or stopped since the claim, on the grid time it claimed: this claim's
      -- fires are in the stream, so they are counted (max_runs, and a resume, which
      -- places the task after that time, count them; lost, they went uncounted). All
      -- else stays as the API write left it: its next time is not this claim's, which
      -- an update since the pause could have made wrong.
      s[STATE_FIRES] = select(STATE_FIRES, cmsgpack.unpack(a[i + 4]))
      put_state(tag, b, id, s)
      count_write(tag)
    end
    out[#out + 1] = id
    -- changed but not moved (e.g. a new payload): its grid time is claimed again, and
    -- must find this claim's fires (kept in flight until the dedupe window forgets it)
    keep = keep or (s ~= nil and s[STATE_NEXT_MS] == due)
  end  -- else its state is the one this commit writes: the commit, sent again after its
  -- reply was lost while the claim stayed in flight, wrote it; not lost
end
-- The zset's changes, a thousand arguments a call (unpack stops near 8,000 values).
local function in_chunks(command, args)
  for first = 1, #args, 1000 do
    redis.call(command, KEYS[1], unpack(args, first, math.min(first + 999, #args)))
  end
end
in_chunks('ZADD', moved)
in_chunks('ZREM', finished)
if misfires > 0 then  -- the missed grid times of the tasks committed
  local lost, now = {}, ms(now_ms())
  for j = 2, #out do lost[out[j]] = true end
  for j = misfires_at + 1, tasks_from - 1, 5 do
    local id, fate, due = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2]
    if not lost[id] then
      local keep = tonumber(ARGV[j + 4])
      local recorded = push_history(tag, id, keep, fate, 0, 0, tonumber(due), nil, nil, 0, nil,
        true)
      if attention_of[fate] and (recorded or keep <= 0) then
        set_attention(tag, id, attention_of[fate], due, ARGV[j + 3], now)
      end
    end
  end
end
if keep then return out_with_earliest(out) end
-- this claim is done: drop it from the partition's claims in flight
local rest = {}
for entry in string.gmatch(inflight, '%S+') do
  if string.sub(entry, 1, #token + 1) ~= token .. ':' then rest[#rest + 1] = entry end
end
redis.call('HSET', KEYS[2], 'inflight', table.concat(rest, ' '))
return out_with_earliest(out)

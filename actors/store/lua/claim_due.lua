-- claim_due: read a batch of due tasks of one partition, for the poller that owns it.
-- KEYS[1]  schedule zset of the partition   KEYS[2]  the partition's owner hash
-- ARGV[1]  partition tag   ARGV[2]  poller id   ARGV[3]  claim token (unique per tick)
-- ARGV[4]  limit   ARGV[5]  lease_ms   ARGV[6]  buckets of the namespace
-- ARGV[7]  how long an uncommitted claim is remembered (ms: the dedupe window)
-- ARGV[8]  a holder the caller found gone (a process of its host that has exited: a
--          killed node or scheduler process), taken over without waiting ('' = none)
-- ARGV[9]  FLAG_ON: leave the definition records out (the caller keeps those it has read, by
--          version: actors/store/definitions.py), FLAG_OFF = return them
-- ARGV[10] with ARGV[9] FLAG_ON: the partition's count of writes at which the caller knows
--          every state it committed (actors/store/known_states.py); if the count is still
--          that and the partition still the caller's, the states are left out too ('' =
--          return them)
-- Returns {now_ms, earliest score or NONE, held, prior, owed_until or NONE, writes, states,
--          owed version ('' = unknown), owed_from or NONE, task_id, definition record,
--          state record, ...} (a
--          header of CLAIM_HEADER items, then CLAIM_ITEMS per task, the records as stored:
--          actors/store/claim_replies.py decodes them; with ARGV[9] FLAG_ON,
--          LEAN_CLAIM_ITEMS per task:
--          task_id, state record; states 0, the count being ARGV[10]: 2 per task,
--          task_id, score, and nothing is read per task). When a task is claimed the
--          earliest is now_ms (no second ZRANGE: the commit reports the real one).
-- held: 1 when another poller's lease on the partition holds (nothing is claimed; the
-- caller leaves the partition alone, and prior is that poller's id), else 0 and the
-- partition is this poller's for at least half of lease_ms more (renewed once half of it
-- is gone).
--
-- Ownership (the owner hash: poller, until, renewed, owed, owed_from, owed_version, inflight,
-- writes, version):
-- one poller serves a partition at a time, so a claim writes nothing per task: the zset
-- keeps the grid times, and a task stays due until commit_fires moves it. A poller that
-- dies before committing leaves its tasks due; the next owner takes the partition once the
-- lease has run out and claims the same grid times again: late, maybe duplicated (same
-- schedule_id), never lost.
--   inflight: 'token:ms' of each claim not committed yet (normally just the current one).
--     A claim names them all as prior: the fires they may have appended are looked up in
--     their enqueue markers and not appended again (enqueue.lua). Entries older than the
--     dedupe window are forgotten (their markers are gone by then).
--   owed: a partition taken from a poller that died (lease run out) or let it go owes
--     every fire due until the handover, whatever the misfire policy: they are late
--     because of the handover, not missed while nothing ran (plan_fires owed_until_ms).
--     At most one lease after the last one ended, so after a longer outage of every
--     poller the misfire policy applies as usual. Only tasks written before the handover
--     are owed: owed_version is the partition's last version given then (records.lua
--     new_version), or the handover's time if later, and a task created, updated or
--     resumed since has a later one.
--   renewed: when the lease was last taken or renewed (or the partition released): no
--     claim before it read a task written after it, and any claim after it applied the
--     misfire policy to the times it found missed. 'version' is raised to it there, so a
--     task written in the same millisecond after the claim has a later version, one
--     written before it not (the comparison is exact, whatever the clock's resolution).
--     At a takeover it becomes owed_from: a
--     task written after it has its times before it under its policy, those after it
--     owed (tick_plan.plan_fire). Unknown (an earlier version's hash has none) or later
--     than now (a clock that stepped back): NONE, every time from the due one owed.
-- writes: how many API writes the partition's tasks have had (records.lua count_write),
-- and takeovers (another poller may have committed since this one last did): while it is
-- the same, only this poller wrote the partition's states. commit_fires skips checking
-- each task when it is the same then, and a claim leaves the states out (ARGV[10]).
-- updated_ms is the task's version: commit_fires advances a task only if no API write
-- (update, pause, delete) changed it since this claim read it.
local tag, me, token = ARGV[1], ARGV[2], ARGV[3]
local buckets = tonumber(ARGV[6])
local lean = ARGV[9] == FLAG_ON
local now = now_ms()
local o = redis.call('HMGET', KEYS[2], 'poller', 'until', 'owed', 'inflight', 'writes',
  'owed_version', 'version', 'renewed', 'owed_from')
local writes = o[5] or '0'
local held_until = tonumber(o[2] or 0)  -- a hash without it (hand-edited): run out
if o[1] and o[1] ~= me and o[1] ~= ARGV[8] and held_until > now then
  -- CLAIM_HEADER items
  return {now, NONE, 1, o[1], NONE, writes, 1, '', NONE}
end
local lease = tonumber(ARGV[5])
local owed, owed_version = tonumber(o[3] or NONE), o[6] or ''
local owed_from = tonumber(o[9] or '')
local fields = {}  -- the owner hash's changes, written in one HSET
-- the partition's version raised to now, written with 'renewed' (above)
local raised = ms(math.max(tonumber(o[7] or 0), now))
-- the caller's states are the stored ones (no write since, and no other owner)
local known = lean and ARGV[10] ~= '' and o[1] == me and writes == ARGV[10]
if o[1] ~= me then
  -- taken over: the fires due from the end of the last lease (or the release) until now
  -- are owed, at most one lease of them (after a longer outage the policy applies)
  owed = o[2] and math.min(now, tonumber(o[2]) + lease) or NONE
  -- (no version yet, or one an earlier version's writes left behind the clock: any task
  -- written before now is owed, as a write after it gets at least now)
  owed_version = raised
  local renewed = tonumber(o[8] or '')
  owed_from = renewed and renewed <= now and renewed or NONE
  writes = ms(tonumber(writes) + 1)
  fields = {'poller', me, 'owed', ms(owed), 'until', ms(now + lease), 'renewed', ms(now),
            'writes', writes, 'owed_version', owed_version, 'owed_from', ms(owed_from),
            'version', owed_version}
elseif held_until - now < lease / 2 then  -- once half of it is gone
  fields = {'until', ms(now + lease), 'renewed', ms(now), 'version', raised}
end
local priors, kept, forgotten = {}, {}, 0
local oldest = now - tonumber(ARGV[7])
for t, at in string.gmatch(o[4] or '', '(%S+):(%d+)') do
  if tonumber(at) < oldest then
    forgotten = forgotten + 1
  else
    priors[#priors + 1] = t
    kept[#kept + 1] = t .. ':' .. at
  end
end
local limit = tonumber(ARGV[4])
-- CLAIM_HEADER items
local out = {now, NONE, 0, table.concat(priors, ' '), owed, writes, known and 0 or 1,
             owed_version, owed_from or NONE}
local header = CLAIM_HEADER
local range = {'ZRANGE', KEYS[1], '-inf', ms(now), 'BYSCORE', 'LIMIT', 0, limit}
if known then range[#range + 1] = 'WITHSCORES' end
local due = redis.call(unpack(range))
if known then  -- ids and scores alone: the caller has the states
  for i = 1, #due do out[header + i] = due[i] end
else
  for _, id in ipairs(due) do
    local b = bucket_of(id, buckets)
    -- The records go back as stored (the poller decodes them: no MessagePack work here).
    -- An active state begins with its status (fixint 0) and then its grid time (not nil):
    -- STATE_STATUS and STATE_NEXT_MS stay a state's first two values (codes.py).
    local s = redis.call('HGET', tag .. ':state:' .. b, id)
    local status = s and string.byte(s, 1)
    local def
    -- A state this version does not write (another layout, a hand edit), or an active one
    -- without a definition (a partial restore): '' for the definition, and the poller
    -- names the task unreadable; it stays due, never dropped without a word.
    if status == ACTIVE then
      def = string.byte(s, 2) ~= MP_NIL
        and (lean or redis.call('HGET', tag .. ':def:' .. b, id) or '')
    elseif s and not (status == PAUSED or status == STOPPED or status == FINISHED) then
      def = lean or redis.call('HGET', tag .. ':def:' .. b, id) or ''
    end
    if not def then
      redis.call('ZREM', KEYS[1], id)  -- stale index entry: task deleted or no longer active
    else
      out[#out + 1] = id
      if not lean then out[#out + 1] = def end
      out[#out + 1] = s
    end
  end
end
if #out > header or forgotten > 0 then
  if #out > header then kept[#kept + 1] = token .. ':' .. ms(now) end
  fields[#fields + 1] = 'inflight'
  fields[#fields + 1] = table.concat(kept, ' ')
end
if #fields > 0 then redis.call('HSET', KEYS[2], unpack(fields)) end
if #out > header then
  out[2] = now  -- a task is due by now; the commit that follows reports the real earliest
else
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then out[2] = tonumber(first[2]) end
end
return out

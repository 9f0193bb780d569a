-- records.lua: prepended to every script that reads or writes a task (actors/store/scripts.py).
-- A task is up to three values in bucket hashes of its partition (actors/store/records.py has
-- the why):
--   <tag>:def:<b>    id -> cmsgpack(type, payload, sched, created_ms)
--   <tag>:state:<b>  id -> cmsgpack(status, next_ms, fires, updated_ms, runs, retries,
--                                   last_run_ms, last_status, claim)
--                    (runs .. last_status: as of its last run under layout 2, if any)
--   <tag>:run:<b>    id -> cmsgpack(runs, retries, last_run_ms, last_status)
--                    (once it has run under layout 3: record_outcomes.lua alone writes it)
--   <tag>:errors     id -> last error (failing tasks only)
--   <tag>:type:<type>:<b>  id -> ''   (the type index)
-- Each record's values are read by name, never by number: s[STATE_NEXT_MS], r[RUN_RETRIES]
-- (codes.lua, from the field order defined once in actors/store/codes.py STATE_FIELDS,
-- RUN_FIELDS; a definition is read whole, local typ, payload, sched, created = unpack).
-- Status and outcome codes: actors/store/records.py STATUS_NAMES, OUTCOME_NAMES.
local ACTIVE, PAUSED, STOPPED, FINISHED = 0, 1, 2, 3
local STATUS_NAMES = {[0] = 'active', 'paused', 'stopped', 'finished'}
local MP_NIL = 0xc0  -- MessagePack's nil, as a byte

-- The bucket of a task id: actors.store.keys.bucket_hash, the same arithmetic (exact in doubles).
local function bucket_of(id, buckets)
  local h = 0
  local bytes = {string.byte(id, 1, -1)}  -- one call for all bytes: ~40 % faster
  for i = 1, #bytes do h = (h * 256 + bytes[i]) % 4294967291 end
  return h % buckets
end

local function ms(n) return string.format('%d', n) end

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The state as a table (s[STATE_STATUS] .. s[STATE_CLAIM]), or nil when the task does not
-- exist. STATE_UPDATED_MS is also the task's version (API writes move it forward;
-- commit_fires checks it). STATE_CLAIM: a claim token written by versions before partition
-- ownership (claims now write nothing per task); commits clear it.
local function get_state(tag, b, id)
  local raw = redis.call('HGET', tag .. ':state:' .. b, id)
  if not raw then return nil end
  return {cmsgpack.unpack(raw)}
end

-- get_state for a script that goes on past a record it cannot read: false for a state
-- record that does not unpack, or whose status is not a number.
local function try_state(tag, b, id)
  local raw = redis.call('HGET', tag .. ':state:' .. b, id)
  if not raw then return nil end
  local ok, s = pcall(function() return {cmsgpack.unpack(raw)} end)
  if not ok or type(s[STATE_STATUS]) ~= 'number' then return false end
  return s
end

-- A definition record's values (typ, payload, sched, created), or nil when it cannot be
-- read (not a record any version writes: a hand edit, another program; its type must be a
-- string): a script that meets one goes on without it rather than failing every task of
-- its call (claim_due.lua and the poller name such a task unreadable).
local function read_def(raw)
  local ok, typ, payload, sched, created = pcall(cmsgpack.unpack, raw)
  if not ok or type(typ) ~= 'string' then return nil end
  return typ, payload, sched, created
end

-- A task's created_ms (its definition's last value, its first version: a task deleted and
-- created again under its id has another), 0 when no such task; nil for a definition
-- without one; false for a definition that cannot be read (read_def).
local function created_ms(tag, b, id)
  local raw = redis.call('HGET', tag .. ':def:' .. b, id)
  if not raw then return 0 end
  local typ, _, _, created = read_def(raw)
  if not typ then return false end
  return created
end

-- The run record as a table (r[RUN_RUNS] .. r[RUN_LAST_STATUS]): the task's own, else the
-- counts its state record carries (not run under layout 3 yet); nil when no such task.
local function get_run(tag, b, id)
  local raw = redis.call('HGET', tag .. ':run:' .. b, id)
  if raw then return {cmsgpack.unpack(raw)} end
  local s = get_state(tag, b, id)
  return s and {
    [RUN_RUNS] = s[STATE_RUNS], [RUN_RETRIES] = s[STATE_RETRIES],
    [RUN_LAST_RUN_MS] = s[STATE_LAST_RUN_MS], [RUN_LAST_STATUS] = s[STATE_LAST_STATUS],
  }
end

-- Count a write to the partition's tasks other than the one its poller's commit built (an
-- API write, a migration, a commit that parks a task instead of finishing it): a commit of
-- a claim read before it checks each task it advances, and the poller's known states of
-- the partition are dropped (commit_fires.lua, actors/store/known_states.py).
local function count_write(tag)
  redis.call('HINCRBY', tag .. ':poller', 'writes', 1)
end

-- A new version for a task being written (its updated_ms): later than every version any
-- earlier write to its partition gave (the last one is kept in the owner hash, 'version'),
-- so a version names one definition and state of a task id for good, even across a
-- delete and a create of the same id within a millisecond. commit_fires compares versions;
-- pollers keep the definitions they claimed by version (actors/store/definitions.py).
local function new_version(tag, old)
  local owner = tag .. ':poller'
  local last = tonumber(redis.call('HGET', owner, 'version') or 0)
  local v = math.max(now_ms(), last + 1, (old or 0) + 1)
  redis.call('HSET', owner, 'version', ms(v))
  return v
end

-- Write a state or run table as its record: its values in their order, nil where unset.
local function put_state(tag, b, id, s)
  redis.call('HSET', tag .. ':state:' .. b, id, cmsgpack.pack(unpack(s, 1, STATE_VALUES)))
end

local function put_run(tag, b, id, r)
  redis.call('HSET', tag .. ':run:' .. b, id, cmsgpack.pack(unpack(r, 1, RUN_VALUES)))
end

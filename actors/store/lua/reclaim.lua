-- reclaim: take over messages whose consumer stopped renewing them; dead-letter poison.
-- KEYS[1]  the type's stream   KEYS[2]  its dead-letter stream (same slot)
-- KEYS[3]  this consumer's poison ends to do (Keys.poison_ends, same slot): hash of each
--          poisoned message's id -> {now, task_id, due_ms, policy code, attempt}, packed,
--          kept (a week) until the claimer has ended its flight and recorded it dead; while
--          the key holds another kind of value, poison is held (below), not dead-lettered:
--          its flight's end and its history entry would have nowhere to wait
-- KEYS[4]  the type's cancel hash (cancel_fires.lua, same slot): a poisoned tracked
--          fire's request goes with it, as an ended fire's goes with its ACK (ack.lua)
-- ARGV[1]  group   ARGV[2]  this node's consumer   ARGV[3]  min idle ms (the lease)
-- ARGV[4]  most messages to take   ARGV[5]  max deliveries   ARGV[6]  node name
-- ARGV[7]  the type (a dead letter's 'type' field)
-- ARGV[8]  the caller's reading of Redis's clock when it sent this call ('' = unknown)
-- ARGV[9]  most ms this call may have waited to run (Redis paused or stalled meanwhile)
-- Returns {claimed, poisoned, stalled, now, held}: claimed is a list of {id, previous
-- owner, idle ms, deliveries, {field, value, ...}}; poisoned is a list of message ids moved
-- to the DLQ (each one's task records it dead, and with a policy, field o, its task's
-- flight ends with it: the claimer does both from KEYS[3]);
-- stalled is 1 when the call ran more than ARGV[9] ms after it was sent: then it takes
-- nothing, since the live holders' renewals were held up by the same stall and their
-- messages look idle without their consumer being gone; now is Redis's time (ms) as the
-- call ran, the clock of this stream's server for the caller's next ARGV[8]; held is the
-- error of a poison message's dead letter Redis refused ('' = none): that message stays
-- pending, tried again next round, and the others are claimed meanwhile.
-- A message delivered max-deliveries times already is not claimed again: it keeps
-- killing its consumers, so it goes to the DLQ with its fields in the full form (a
-- compact message's schedule_id, type and enq_ms added, so it can be replayed) and the
-- reason. The window looked at is larger than the count (4x, +100), so this consumer's
-- own idle entries (its own consumer recovers them) cannot hide others' dead messages.
-- A message a stopping consumer released (release.lua with RELEASED_IDLE_MS, ten years;
-- over one here; a failed consumer's 30 days are under it, and counted) did
-- not die with its holder: taken over, it keeps its count (this delivery stands in for the
-- released one) and is never poison for it, so a rolling deploy counts nothing, as a
-- restart under the same name does not (recover.lua).
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
if ARGV[8] ~= '' and tonumber(now) - tonumber(ARGV[8]) > tonumber(ARGV[9]) then
  return {{}, {}, 1, now, ''}
end
local want = tonumber(ARGV[4])
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+',
  want * 4 + 100)
local claimed, poisoned, held = {}, {}, ''
-- (a hash read, not TYPE: the shipped ACL allows no command the scripts do not need)
local probe = redis.pcall('HGET', KEYS[3], '-')
local ends_unkept = type(probe) == 'table' and probe.err
local released = 365 * 24 * 3600 * 1000  -- ms: a stop's release gives ten years

-- An entry with more than ENTRY_FIELDS fields (another program's) keeps its first ones in
-- its dead letter, and the rest go in one field, 'folded' (MessagePack of their list): Lua
-- 5.1 passes at most ~8,000 values to a call (XADD), so its dead letter could not be
-- written otherwise, and the poison would fail every reclaim.
local function full_form(id, raw)
  local f, fields = {}, {}
  local kept = math.min(#raw, 2 * ENTRY_FIELDS)
  for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
  for j = 1, kept do fields[j] = raw[j] end
  if #raw > kept then
    local rest = {}
    for j = kept + 1, #raw do rest[#rest + 1] = raw[j] end
    fields[#fields + 1] = 'folded'
    fields[#fields + 1] = cmsgpack.pack(rest)
  end
  local function add(name, value)
    if f[name] == nil and value ~= nil then
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
  end
  if f.task_id and f.due_ms then add('schedule_id', f.task_id .. ':' .. f.due_ms) end
  add('type', ARGV[7])
  add('enq_ms', string.match(id, '^(%d+)'))
  return fields
end

for _, p in ipairs(pending) do
  local id, owner, idle, deliveries = p[1], p[2], p[3], p[4]
  local stop_released = idle >= released
  if owner ~= ARGV[2] then
    if deliveries >= tonumber(ARGV[5]) and not stop_released then
      local dead = true  -- acknowledged and deleted this round (also one deleted meanwhile)
      local entry = redis.call('XRANGE', KEYS[1], id, id)
      if entry[1] then
        local fields = full_form(id, entry[1][2])
        fields[#fields + 1] = 'reason'
        fields[#fields + 1] = 'poison'
        fields[#fields + 1] = 'error'
        fields[#fields + 1] = 'delivered ' .. deliveries .. ' times without finishing'
        fields[#fields + 1] = 'deliveries'
        fields[#fields + 1] = tostring(deliveries)
        fields[#fields + 1] = 'node'
        fields[#fields + 1] = ARGV[6]
        fields[#fields + 1] = 'dead_ms'
        fields[#fields + 1] = now
        fields[#fields + 1] = 'msg_id'
        fields[#fields + 1] = id
        -- refused (OOM, before this call wrote anything): left pending, tried next round,
        -- and the others are claimed meanwhile
        local added
        if ends_unkept then
          added = {err = ends_unkept .. ' (' .. KEYS[3] .. ', the poison ends to do)'}
        else
          added = redis.pcall('XADD', KEYS[2], '*', unpack(fields))
        end
        if type(added) == 'table' and added.err then
          dead, held = false, added.err
        else
          local raw, o, task, due, attempt = entry[1][2], '', nil, nil, '0'
          for j = 1, #raw, 2 do
            if raw[j] == 'o' then o = raw[j + 1] end
            if raw[j] == 'task_id' then task = raw[j + 1] end
            if raw[j] == 'due_ms' then due = raw[j + 1] end
            if raw[j] == 'attempt' then attempt = raw[j + 1] end
          end
          if task and due then
            -- for the claimer to end its flight and record it dead (the key's kind
            -- checked above)
            redis.pcall('HSET', KEYS[3], id, cmsgpack.pack({now, task, due, o, attempt}))
            redis.pcall('PEXPIRE', KEYS[3], 604800000)
            if o ~= '' and string.find(TRACKED_POLICIES, string.sub(o, 1, 1), 1, true) then
              redis.pcall('HDEL', KEYS[4], task .. ':' .. due)  -- rejected: lapses
            end
          end
        end
      end
      if dead then
        redis.call('XACK', KEYS[1], ARGV[1], id)
        redis.call('XDEL', KEYS[1], id)
        poisoned[#poisoned + 1] = id
      end
    elseif #claimed < want then
      -- one delivery more, but for a message a stop released: this one stands in for it
      local count = stop_released and deliveries or deliveries + 1
      local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], id,
        'RETRYCOUNT', count)
      if got[1] then
        claimed[#claimed + 1] = {id, owner, idle, count, got[1][2]}
      end
    end
  end
end
return {claimed, poisoned, 0, now, held}

-- enqueue: append fires to one type's stream, many per call (one round trip, one reply),
-- dropping any fire an earlier claim of the same task already appended.
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- ARGV[1]  enq_ms (the claim's Redis time)   ARGV[2]  the type
-- ARGV[3]  marker prefix ({ns:q:<type>}:enq:)   ARGV[4]  dedupe window ms (0 = off)
-- ARGV[5]  the claim's token   ARGV[6]  this call's part of the claim (its first index)
-- ARGV[7]  tokens of earlier claims of this caller, committed in full since: their markers
--          go now ('' = none; space-separated)
-- ARGV[8]  '1': compact messages (task_id, payload, attempt, due_ms), '' = the full form
-- ARGV[9]  MessagePack of one flat array (one C call decodes it), groups of 6: task_id,
--          due_ms, payload (JSON), attempt (due_ms and attempt as strings: they go into
--          messages and ids, and Redis formats a Lua number with a slow printf),
--           prior claims ('' = none: the task held no earlier claim; several are space
--           separated), policy code ('' =
--           none: actors/store/flights.py; written as the message's field o)
-- Returns one flag per fire: 1 appended, 0 dropped as a duplicate.
--
-- Markers, one hash per claim and stream (<prefix><token>, kept for the window): field =
-- the call's part, value = its flags, '|', and the fires it appended or found appended
-- ('task_id:due_ms:attempt', one per line). Written once per call, not per fire, so the
-- common case costs one HSET a batch. Duplicates come only from a claim taken over after
-- its poller died between enqueue and commit: the new claim names the old one (prior),
-- and only those fires are looked up, in the old claim's markers. A call repeated after
-- its reply was lost finds its own part and answers as it did the first time. A claim
-- committed in full is no one's prior any more (the commit took it out of the partitions'
-- claims in flight), so its poller names it in its next call and its markers go then:
-- kept for the whole window, they held every fire of the last minute (~240 bytes a task
-- at 20,000 fires/s).
-- Message fields: task_id, payload, attempt, due_ms; the full form (a namespace whose meta
-- does not say messages = 2: nodes of an older version may read it) adds schedule_id
-- (task_id:due_ms), type and enq_ms, which a compact message's reader derives from the
-- rest, its stream and its entry id (actors/store/messages.py). Callers cap the fires per
-- call (ENQUEUE_CHUNK) so no call holds Redis long.
local window = tonumber(ARGV[4])
local mine = ARGV[3] .. ARGV[5]
for committed in string.gmatch(ARGV[7], '%S+') do redis.call('UNLINK', ARGV[3] .. committed) end
if window > 0 then
  local done = redis.call('HGET', mine, ARGV[6])
  if done then
    local out = {}
    for i = 1, string.find(done, '|', 1, true) - 1 do out[i] = tonumber(string.sub(done, i, i)) end
    return out
  end
end
local appended_by = {}  -- prior claims -> {fire = true} of what they appended
local function known(prior)  -- prior: one or more claim tokens, space separated
  local set = appended_by[prior]
  if not set then
    set = {}
    for claim in string.gmatch(prior, '%S+') do
      for _, v in ipairs(redis.call('HVALS', ARGV[3] .. claim)) do
        local bar = string.find(v, '|', 1, true)
        for fire in string.gmatch(string.sub(v, bar + 1), '[^\n]+') do set[fire] = true end
      end
    end
    appended_by[prior] = set
  end
  return set
end
local compact = ARGV[8] == '1'
local out, fires = {}, {}
local a = cmsgpack.unpack(ARGV[9])
for i = 1, #a, 6 do
  local id, due, attempt, prior, policy = a[i], a[i + 1], a[i + 3], a[i + 4], a[i + 5]
  local sid = id .. ':' .. due
  local fire = sid .. ':' .. attempt
  if window > 0 and prior ~= '' and known(prior)[fire] then
    out[#out + 1] = 0
  else
    if policy ~= '' then  -- a tracked fire: the full or compact form, and o
      local f = {'task_id', id, 'payload', a[i + 2], 'attempt', attempt, 'due_ms', due,
        'o', policy}
      if not compact then
        for _, v in ipairs({'schedule_id', sid, 'type', ARGV[2], 'enq_ms', ARGV[1]}) do
          f[#f + 1] = v
        end
      end
      redis.call('XADD', KEYS[1], '*', unpack(f))
    elseif compact then
      redis.call('XADD', KEYS[1], '*', 'task_id', id, 'payload', a[i + 2],
        'attempt', attempt, 'due_ms', due)
    else
      redis.call('XADD', KEYS[1], '*', 'task_id', id, 'schedule_id', sid, 'type', ARGV[2],
        'payload', a[i + 2], 'attempt', attempt, 'due_ms', due, 'enq_ms', ARGV[1])
    end
    out[#out + 1] = 1
  end
  fires[#fires + 1] = fire
end
if window > 0 then
  redis.call('HSET', mine, ARGV[6], table.concat(out) .. '|' .. table.concat(fires, '\n'))
  redis.call('PEXPIRE', mine, window)
end
return out

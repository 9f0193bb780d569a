-- create_tasks: create tasks of one partition; idempotent for a repeated definition.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  partition tag ({ns:P})
-- ARGV[2..] groups of 8: task_id, bucket, type, payload (JSON), sched (encoded),
--           next_ms ('' = never), score, labels (compact JSON, '' = none)
-- Returns one code per task: CODE_OK created, CODE_UNCHANGED existed with the same
-- definition and labels, CODE_CONFLICT another definition (or one that cannot be read:
-- the caller's batch goes on, and the task's delete is the way out).
local tag = ARGV[1]
local version  -- the created tasks' version and creation time (records.lua new_version)
local out = {}
local created = false
for i = 2, #ARGV, 8 do
  local id, b, typ, payload, sched, nxt, score, labels =
    ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5], ARGV[i+6], ARGV[i+7]
  -- a state without a definition (a partial delete or restore) is a task still: its
  -- flight, run record and history would be the new task's (a conflict; its delete is
  -- the way out)
  local cur = redis.call('HGET', tag .. ':def:' .. b, id)
    or (redis.call('HGET', tag .. ':state:' .. b, id) and '')
  if cur then
    local typ0, payload0, sched0 = read_def(cur)  -- nil when it cannot be read: a conflict
    local labels0 = redis.call('HGET', tag .. ':labels', id) or ''
    if typ0 == typ and payload0 == payload and sched0 == sched and labels0 == labels then
      out[#out + 1] = CODE_UNCHANGED
    else
      out[#out + 1] = CODE_CONFLICT
    end
  else
    version = version or new_version(tag)
    redis.call('HSET', tag .. ':def:' .. b, id, cmsgpack.pack(typ, payload, sched, version))
    local s = {[STATE_FIRES] = 0, [STATE_UPDATED_MS] = version, [STATE_RUNS] = 0}
    if nxt == '' then
      s[STATE_STATUS] = FINISHED
    else
      s[STATE_STATUS], s[STATE_NEXT_MS] = ACTIVE, tonumber(nxt)
      redis.call('ZADD', KEYS[1], score, id)
    end
    put_state(tag, b, id, s)
    -- A task created again under an id starts with no occurrences, attention entry or
    -- acknowledgement: a delete by an earlier version left them (history.lua).
    forget_history(tag, id)
    redis.call('HDEL', tag .. ':acks', id)
    redis.call('HSET', tag .. ':type:' .. typ .. ':' .. b, id, '')
    if labels ~= '' then put_labels(tag, b, id, labels) end
    out[#out + 1] = CODE_OK
    created = true
  end
end
if created then count_write(tag) end
return out

-- create_tasks: create tasks of one partition; idempotent for a repeated definition.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  task key prefix         ARGV[2]  type-set key prefix
-- ARGV[3..] groups of 6: task_id, type, payload (JSON), sched (JSON), next_ms ('' = never), score
-- Returns one code per task: 1 created, 0 existed with the same definition, -1 conflict.
-- Absent counters (fires, runs, retries) read as 0: saves memory per task.
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
local out = {}
for i = 3, #ARGV, 6 do
  local id, typ, payload, sched, nxt, score = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5]
  local key = ARGV[1] .. id
  local cur = redis.call('HMGET', key, 'type', 'payload', 'sched')
  if cur[1] then
    if cur[1] == typ and cur[2] == payload and cur[3] == sched then
      out[#out + 1] = 0
    else
      out[#out + 1] = -1
    end
  else
    if nxt == '' then
      redis.call('HSET', key, 'type', typ, 'payload', payload, 'sched', sched,
        'status', 'finished', 'created_ms', now)
    else
      redis.call('HSET', key, 'type', typ, 'payload', payload, 'sched', sched,
        'status', 'active', 'created_ms', now, 'next_ms', nxt)
      redis.call('ZADD', KEYS[1], score, id)
    end
    redis.call('SADD', ARGV[2] .. typ, id)
    out[#out + 1] = 1
  end
end
return out

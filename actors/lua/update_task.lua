-- update_task: replace a task's payload and/or schedule.
-- KEYS[1]  schedule zset of the task's partition   KEYS[2]  the task hash
-- ARGV[1]  task_id   ARGV[2]  payload JSON or '' (keep)   ARGV[3]  sched JSON or '' (keep)
-- ARGV[4]  next_ms for the new schedule ('' = never)      ARGV[5]  score
-- Returns {code, status}: 1 updated, -2 not found.
-- A new schedule takes effect at once: the claim (if any) is dropped so a poller holding it
-- cannot commit the old grid; a finished task with a new schedule becomes active again.
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return {-2, ''} end
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('HSET', KEYS[2], 'updated_ms', now)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'payload', ARGV[2]) end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], 'sched', ARGV[3])
  redis.call('HDEL', KEYS[2], 'claim', 'fires')
  if status == 'finished' then status = 'active' end
  if ARGV[4] == '' then
    if status == 'active' then status = 'finished' end
    redis.call('HDEL', KEYS[2], 'next_ms')
    redis.call('ZREM', KEYS[1], ARGV[1])
  else
    redis.call('HSET', KEYS[2], 'next_ms', ARGV[4])
    if status == 'active' then
      redis.call('ZADD', KEYS[1], ARGV[5], ARGV[1])
    end
  end
  redis.call('HSET', KEYS[2], 'status', status)
end
return {1, status}

-- set_status: pause, resume or stop one task.
-- KEYS[1]  schedule zset of the task's partition   KEYS[2]  the task hash
-- ARGV[1]  task_id   ARGV[2]  action: pause | resume | stop
-- ARGV[3]  next_ms for resume ('' = never)   ARGV[4]  score for resume
-- Returns {code, status}: 1 changed, 0 already so, -2 not found, -3 not allowed from status.
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return {-2, ''} end
local action = ARGV[2]
local target = ({pause = 'paused', resume = 'active', stop = 'stopped'})[action]
if status == target then return {0, status} end
local allowed = (action == 'pause' and status == 'active')
  or (action == 'resume' and status == 'paused')
  or (action == 'stop' and (status == 'active' or status == 'paused'))
if not allowed then return {-3, status} end
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('HSET', KEYS[2], 'status', target, 'updated_ms', now)
redis.call('HDEL', KEYS[2], 'claim')  -- an in-flight poller commit must not re-add it
if action == 'resume' then
  if ARGV[3] == '' then
    redis.call('HSET', KEYS[2], 'status', 'finished')
    redis.call('HDEL', KEYS[2], 'next_ms')
    return {1, 'finished'}
  end
  redis.call('HSET', KEYS[2], 'next_ms', ARGV[3])
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return {1, target}

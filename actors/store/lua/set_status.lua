-- set_status: pause, resume or stop one task.
-- KEYS[1]  schedule zset of the task's partition
-- ARGV[1]  partition tag   ARGV[2]  task_id   ARGV[3]  bucket
-- ARGV[4]  action: pause | resume | stop
-- ARGV[5]  next_ms for resume ('' = never)   ARGV[6]  score for resume
-- ARGV[7]  the note (compact JSON, actors/store/notes.py) kept with the change, or '' (none)
-- A change replaces the task's note in <tag>:notes: the given one, or none (the earlier
-- note described a status the task has left). Nothing is written when nothing changes.
-- Returns {code, status}: 1 changed, 0 already so, -2 not found, -3 not allowed from status.
local tag, id, b, action = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local s = get_state(tag, b, id)
if not s then return {-2, ''} end
local status = s[1]
local target = ({pause = PAUSED, resume = ACTIVE, stop = STOPPED})[action]
if status == target then return {0, STATUS_NAMES[status]} end
local allowed = (action == 'pause' and status == ACTIVE)
  or (action == 'resume' and status == PAUSED)
  or (action == 'stop' and (status == ACTIVE or status == PAUSED))
if not allowed then return {-3, STATUS_NAMES[status]} end
s[1], s[4] = target, new_version(tag, s[4])  -- a new version (commit_fires)
if action == 'resume' then
  if ARGV[5] == '' then
    s[1], s[2] = FINISHED, nil
  else
    s[2] = tonumber(ARGV[5])
    redis.call('ZADD', KEYS[1], ARGV[6], id)
  end
else
  redis.call('ZREM', KEYS[1], id)
end
put_state(tag, b, id, s)
if (ARGV[7] or '') ~= '' then
  redis.call('HSET', tag .. ':notes', id, ARGV[7])
else
  redis.call('HDEL', tag .. ':notes', id)
end
count_write(tag)
return {1, STATUS_NAMES[s[1]]}

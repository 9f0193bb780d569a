-- delete_tasks: delete tasks of one partition and their index entries.
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  task key prefix   ARGV[2]  type-set key prefix   ARGV[3..]  task ids
-- Returns the number of tasks deleted. Callers bound the ids per call (a clear of a million
-- tasks is many short calls, never one long one).
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = ARGV[1] .. id
  local typ = redis.call('HGET', key, 'type')
  if typ then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', ARGV[2] .. typ, id)
    n = n + 1
  end
end
return n

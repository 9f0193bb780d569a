-- delete_tasks: delete tasks of one partition, their index entries, labels, notes, fires in flight
-- fires not run, history and attention entry (a task created again under the id starts
-- with none).
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  partition tag   ARGV[2..]  pairs: task_id, bucket
-- Returns the number of tasks deleted. Callers bound the ids per call (a clear of a million
-- tasks is many short calls, never one long one).
local tag = ARGV[1]
local n = 0
for i = 2, #ARGV, 2 do
  local id, b = ARGV[i], ARGV[i + 1]
  local def = redis.call('HGET', tag .. ':def:' .. b, id)
  if def then
    local typ = cmsgpack.unpack(def)
    redis.call('HDEL', tag .. ':def:' .. b, id)
    redis.call('HDEL', tag .. ':state:' .. b, id)
    redis.call('HDEL', tag .. ':run:' .. b, id)
    redis.call('HDEL', tag .. ':type:' .. typ .. ':' .. b, id)
    drop_labels(tag, b, id)
    redis.call('HDEL', tag .. ':errors', id)
    redis.call('HDEL', tag .. ':notes', id)
    redis.call('HDEL', tag .. ':flight', id)
    redis.call('HDEL', tag .. ':notrun', id)
    forget_history(tag, id)
    redis.call('HDEL', tag .. ':acks', id)
    redis.call('ZREM', KEYS[1], id)
    n = n + 1
  end
end
if n > 0 then count_write(tag) end
return n

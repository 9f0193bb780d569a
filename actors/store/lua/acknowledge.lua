-- acknowledge: an operator takes a task off the attention list, with a note.
-- KEYS[1]  the partition's schedule zset (only for its slot)
-- ARGV[1]  partition tag   ARGV[2]  task_id   ARGV[3]  bucket
-- ARGV[4]  the acknowledgement (compact JSON: note, by, at_ms), kept in <tag>:acks
-- Returns {code, the entry it removed ('' = the task was not on the list)}: code 1
-- acknowledged, 0 not on the list, -2 no such task. The acknowledgement stays until the
-- task is deleted; the task comes back on the list with its next occurrence that needs one.
local tag, id, b = ARGV[1], ARGV[2], ARGV[3]
if not redis.call('HGET', tag .. ':state:' .. b, id) then return {-2, ''} end
local entry = redis.call('HGET', tag .. ':attention', id)
if not entry then return {0, ''} end
set_attention(tag, id, nil, '', '', '')
redis.call('HSET', tag .. ':acks', id, ARGV[4])
return {1, entry}

-- acknowledge: an operator takes a task off the attention list, with a note.
-- KEYS[1]  the partition's schedule zset (only for its slot)
-- ARGV[1]  partition tag   ARGV[2]  task_id   ARGV[3]  bucket
-- ARGV[4]  the acknowledgement (compact JSON: note, by, at_ms), kept in <tag>:acks
-- Returns {code, the entry it removed ('' = the task was not on the list)}: code 1
-- acknowledged, 0 not on the list, -2 no such task. The acknowledgement stays until the
-- task is deleted; the task comes back on the list with its next occurrence that needs one.
-- An entry left by a task deleted meanwhile (by a node that did not know the list) can
-- be acknowledged too: it goes, and nothing is kept.
local tag, id, b = ARGV[1], ARGV[2], ARGV[3]
local exists = redis.call('HGET', tag .. ':state:' .. b, id) ~= false  -- HGET: the shipped ACL
local entry = redis.call('HGET', tag .. ':attention', id)
if not entry then return {exists and CODE_UNCHANGED or CODE_NOT_FOUND, ''} end
set_attention(tag, id, nil, '', '', '')
if exists then redis.call('HSET', tag .. ':acks', id, ARGV[4]) end
return {CODE_OK, entry}

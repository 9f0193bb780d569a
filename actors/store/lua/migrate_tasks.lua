-- migrate_tasks: move tasks of one partition from layout 1 (a hash per task) to layout 2
-- (records in bucket hashes, actors/store/records.py). The schedule zset is the same in both.
-- KEYS[1]  schedule zset of the partition (only for its slot)
-- ARGV[1]  partition tag   ARGV[2]  the layout-1 type set these ids came from
-- ARGV[3..] groups of 6: task_id, bucket, type, definition, state, last error ('' = none);
--           definition '' = the layout-1 hash was gone (only the
--           type set's entry is dropped)
-- Returns the number of tasks moved. Each task moves whole (written, then its old hash
-- deleted) in this one script: an interrupted migration resumes where it stopped. It
-- counts as a write to the partition's tasks (records.lua count_write): a poller that
-- knows the partition's states (actors/store/known_states.py) reads them again.
local tag = ARGV[1]
local n = 0
for i = 3, #ARGV, 6 do
  local id, b, typ, def, state, err = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5]
  if def ~= '' then
    redis.call('HSET', tag .. ':def:' .. b, id, def)
    redis.call('HSET', tag .. ':state:' .. b, id, state)
    redis.call('HSET', tag .. ':type:' .. typ .. ':' .. b, id, '')
    if err ~= '' then redis.call('HSET', tag .. ':errors', id, err) end
    redis.call('DEL', tag .. ':task:' .. id)
    n = n + 1
  end
  redis.call('SREM', ARGV[2], id)
end
if n > 0 then redis.call('HINCRBY', tag .. ':poller', 'writes', 1) end
return n

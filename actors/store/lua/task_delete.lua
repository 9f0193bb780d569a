-- task_delete.lua: prepended (after records.lua, labels.lua and history.lua) to the scripts that delete
-- tasks: delete_tasks.lua and action_batch.lua, so both delete a task the same way.

-- Delete one task: its records, index entries, labels, notes, fires in flight, fires not
-- run, history, attention entry and acknowledgement (a task created again under the id
-- starts with none). schedule: the
-- partition's schedule zset. Returns true when the task existed. The caller counts the
-- partition's write (count_write) once for all it deleted. A task whose definition cannot
-- be read (read_def) is deleted all the same, but for its entry in its type's index
-- (the type is in that record): a delete is the way out of a broken record, and of a
-- state left without its definition. expect: the type whose index named the task (a
-- clear of that type; nil otherwise): a task of another type is not deleted (the id was
-- deleted and created again as another type after such a delete), and the index entry
-- goes either way, so a clear of the type leaves no such entry behind.
local function delete_task(tag, b, id, schedule, expect)
  local def = redis.call('HGET', tag .. ':def:' .. b, id)
  local typ = def and read_def(def)
  if expect and (typ ~= expect or not def) then
    redis.call('HDEL', tag .. ':type:' .. expect .. ':' .. b, id)
  end
  if expect and typ and typ ~= expect then return false end
  if not def and not redis.call('HGET', tag .. ':state:' .. b, id) then return false end
  redis.call('HDEL', tag .. ':def:' .. b, id)
  redis.call('HDEL', tag .. ':state:' .. b, id)
  redis.call('HDEL', tag .. ':run:' .. b, id)
  if typ then redis.call('HDEL', tag .. ':type:' .. typ .. ':' .. b, id) end
  drop_labels(tag, b, id)
  redis.call('HDEL', tag .. ':errors', id)
  redis.call('HDEL', tag .. ':notes', id)
  redis.call('HDEL', tag .. ':flight', id)
  redis.call('HDEL', tag .. ':notrun', id)
  redis.call('HDEL', tag .. ':parked', id)
  forget_history(tag, id)
  redis.call('HDEL', tag .. ':acks', id)
  redis.call('ZREM', schedule, id)
  return true
end

-- labels.lua: prepended to the scripts that write or delete a task's labels
-- (actors/store/scripts.py). A labelled task has
--   <tag>:labels               id -> its labels as compact JSON (sorted keys)
--   <tag>:label:<k>=<v>:<b>    id -> ''   (one index hash per label pair and bucket)
-- A task without labels has neither. Names: actors/store/keys.py (labels, by_label).

-- Drop the task's labels and their index entries (nothing when it has none).
-- A labels record that is not a JSON object of strings (another program's) is dropped
-- all the same, its index entries left (a listing by label skips an id whose task is gone).
local function drop_labels(tag, b, id)
  local raw = redis.call('HGET', tag .. ':labels', id)
  if not raw then return end
  local ok, labels = pcall(cjson.decode, raw)
  if ok and type(labels) == 'table' then
    for k, v in pairs(labels) do
      if type(k) == 'string' and type(v) == 'string' then
        redis.call('HDEL', tag .. ':label:' .. k .. '=' .. v .. ':' .. b, id)
      end
    end
  end
  redis.call('HDEL', tag .. ':labels', id)
end

-- Give the task these labels (compact JSON; '' or '{}' = none), replacing any it had.
local function put_labels(tag, b, id, encoded)
  drop_labels(tag, b, id)
  if encoded == '' or encoded == '{}' then return end
  redis.call('HSET', tag .. ':labels', id, encoded)
  for k, v in pairs(cjson.decode(encoded)) do
    redis.call('HSET', tag .. ':label:' .. k .. '=' .. v .. ':' .. b, id, '')
  end
end

-- read_definitions: the definition and state records of claimed tasks of one partition,
-- for a poller that claimed them without their definitions (or states) and does not have
-- these yet.
-- KEYS[1]  schedule zset of the partition (only for its slot)   KEYS[2]  its owner hash
-- ARGV[1]  partition tag   ARGV[2..] pairs: task_id, bucket
-- Returns per task: definition record, state record (each as stored, false if none); then
-- the partition's count of writes (claim_due.lua). The state comes along for its version:
-- a definition read after its claim is used only if the task's version is still the
-- claimed one (actors/store/definitions.py); a state the claim left out, only if no write
-- came since the claim (actors/store/known_states.py).
local tag = ARGV[1]
local out = {}
for i = 2, #ARGV, 2 do
  local id, b = ARGV[i], ARGV[i + 1]
  out[#out + 1] = redis.call('HGET', tag .. ':def:' .. b, id)
  out[#out + 1] = redis.call('HGET', tag .. ':state:' .. b, id)
end
out[#out + 1] = redis.call('HGET', KEYS[2], 'writes') or '0'
return out

-- disown_name: give up a consumer name at a graceful stop, if it is still ours.
-- KEYS[1]  the name's owner key   ARGV[1]  this incarnation's owner value
-- Returns 1 if the key was ours and is deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

-- prune_consumers: remove consumers that are gone and hold nothing, and take over the
-- poison ends their claimers left undone.
-- KEYS[1]  the type's stream   KEYS[2]  this consumer's poison ends (Keys.poison_ends)
-- ARGV[1]  group   ARGV[2]  min idle ms   ARGV[3]  this consumer
-- ARGV[4]  the type's poison ends key prefix (Keys.poison_ends with no name: the same slot)
-- ARGV[5]  the type's name owner key prefix (Keys.owner with no name: the same slot)
-- Returns the names removed. A consumer is removed only with 0 pending (never losing a PEL
-- entry), idle longer than min idle (a live one reads every few hundred ms) and its name
-- held by no one (own_name.lua: a live consumer refreshes its owner key every lease/3,
-- also while it reads nothing for a while, its reads closed by a suspect's turn): a live
-- consumer's poison ends stay its own, done once.
-- Poison ends (reclaim.lua) are kept per claimer's name until that claimer has done them:
-- a claimer gone for good (its node replaced, a fresh name never used again) would leave
-- a task's flight unended, a skip-policy task skipping every fire, for the week they are
-- kept. So a removed name's ends move to this consumer's, whose claimer does them next.
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
  if info['name'] ~= ARGV[3] and info['pending'] == 0 and info['idle'] > tonumber(ARGV[2])
      and not redis.call('GET', ARGV[5] .. info['name']) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed[#removed + 1] = info['name']
    local theirs = ARGV[4] .. info['name']
    local ends = redis.call('HGETALL', theirs)
    for first = 1, #ends, 1000 do  -- (pairs: 1000 values a call, unpack's limit far off)
      redis.call('HSET', KEYS[2], unpack(ends, first, math.min(first + 999, #ends)))
    end
    if #ends > 0 then
      redis.call('PEXPIRE', KEYS[2], 604800000)
      redis.call('DEL', theirs)
    end
  end
end
return removed

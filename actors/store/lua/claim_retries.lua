-- claim_retries: reserve due retries of one partition for one retry dispatcher.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix   ARGV[2]  claim token   ARGV[3]  limit   ARGV[4]  lease_ms
-- ARGV[5]  partition tag   ARGV[6]  buckets per partition
-- Returns {now_ms, earliest score after claim or NONE, {dropped schedule ids},
--          {unreadable schedule ids}, schedule_id, task_id, type, payload, attempt, due_ms,
--          prior, policy, ...}
-- (a header of RETRY_CLAIM_HEADER items, then RETRY_CLAIM_ITEMS per retry); prior: the
-- tokens of earlier claims never committed, space separated ('' if none; see
-- enqueue.lua); policy: the
-- fire's policy code ('' if none). Dropped: retries of a task deleted or stopped since its
-- fire failed, their contexts deleted (a stop is final, a deleted task has no more fires;
-- a paused or finished task's retry still runs: its fire had started); a task deleted and
-- created again under its id is another task (its created_ms is not the context's 'born',
-- kept by schedule_retries.lua; a context without one, of an earlier version, is not
-- checked). A task whose state or definition record cannot be read (try_state, read_def)
-- keeps its retry: the retry carries what it runs, and a broken record holds back no
-- other retry of the partition. A context this version cannot run (its task id, type,
-- payload, attempt or due time missing, or no number where one goes: written by hand or
-- by another program) is named unreadable and left as it is, claimed a lease on (named
-- again then), never dropped without a word nor sent as a fire that would fail the type's
-- enqueue (Scripts.claim_retries names those whose type or policy is no text, or no type
-- name).
-- Same claim-then-commit rule as claim_due: a dispatcher killed before commit_retries
-- leaves the retry to be claimed again after the lease (never a loss), and the claim
-- names every earlier claim of it as prior (its 'claim', then its 'priors': newest first,
-- at most RETRY_PRIORS): one killed before its enqueue left no markers, and the one
-- before it may have appended the retry (enqueue.lua reads each prior's markers).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('ZRANGE', KEYS[1], '-inf', string.format('%d', now), 'BYSCORE',
  'LIMIT', 0, tonumber(ARGV[3]))
local lease_until = string.format('%d', now + tonumber(ARGV[4]))
local tag, buckets = ARGV[5], tonumber(ARGV[6])

-- Whether the context's task was deleted and created again since its fire failed (its
-- created_ms is not the context's born; a definition that cannot be read is not judged).
local function reborn(b, id, born)
  if not born then return false end
  local created = created_ms(tag, b, id)
  return created ~= false and tonumber(born) ~= (created or 0)
end
-- The claims before this one, newest first: the last claim, then the ones it named.
local function priors(claim, earlier)
  local tokens = {}
  for token in string.gmatch((claim or '') .. ' ' .. (earlier or ''), '%S+') do
    if #tokens < RETRY_PRIORS then tokens[#tokens + 1] = token end
  end
  return table.concat(tokens, ' ')
end
-- A whole number as the dispatcher reads one (tonumber takes '1.5', '1e3', '0x10', 'inf')
local function whole(v) return v and string.match(v, '^%d+$') ~= nil end
local dropped, unreadable = {}, {}
-- RETRY_CLAIM_HEADER items
local out = {now, NONE, dropped, unreadable}
for _, sid in ipairs(due) do
  local key = ARGV[1] .. sid
  local f = redis.call('HMGET', key, 'task_id', 'type', 'payload', 'attempt', 'due_ms', 'claim',
    'o', 'born', 'priors')
  local b = f[1] and bucket_of(f[1], buckets)
  local s = f[1] and try_state(tag, b, f[1])
  if not f[1] and redis.call('EXISTS', key) == 0 then
    redis.call('ZREM', KEYS[1], sid)  -- context gone: nothing to retry
  elseif f[1] and (s == nil or (s and s[STATE_STATUS] == STOPPED) or reborn(b, f[1], f[8])) then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], sid)
    dropped[#dropped + 1] = sid
  elseif not (f[1] and f[2] and f[3] and whole(f[4]) and whole(f[5])) then
    redis.call('ZADD', KEYS[1], lease_until, sid)
    unreadable[#unreadable + 1] = sid
  else
    local prior = priors(f[6], f[9])
    redis.call('HSET', key, 'claim', ARGV[2], 'priors', prior)
    redis.call('ZADD', KEYS[1], lease_until, sid)
    out[#out + 1] = sid
    for j = 1, 5 do out[#out + 1] = f[j] end
    out[#out + 1] = prior
    out[#out + 1] = f[7] or ''
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out

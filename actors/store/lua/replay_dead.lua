-- replay_dead: move dead letters back to their type's stream as fresh first attempts.
-- KEYS[1]  the type's stream   KEYS[2]  its dead-letter stream (same slot)
-- ARGV[1]  the type   ARGV[2]  seen-key prefix ({ns:q:<type>}:seen:, same slot)
-- ARGV[3..]  dead-letter entry ids
-- Returns {outcomes, task_ids}, one of each per id: the new stream id, 'missing' (no such
-- entry: already replayed or purged) or 'malformed' (not a Metronome message: kept in the
-- DLQ for a human); and the entry's task id ('' when it has none).
-- Moving is atomic per entry: XADD to the stream and XDEL from the DLQ in one script, so a
-- replay can neither lose an entry nor run it twice. The fire keeps its schedule_id and
-- due_ms (so its log lines join up with the original's; a dead letter in the compact form
-- gets its schedule_id from task_id and due_ms) and starts again at attempt 0. The
-- consumers' dedupe markers of its earlier attempts (begin_runs.lua) are removed, so the
-- replay and its retries run even within a dedupe window. Its policy code (o) marks it
-- replayed (actors/store/flights.py origin_of): its task's history says so.
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))
local out, ids = {}, {}
for i = 3, #ARGV do
  ids[i - 2] = ''
  local entry = redis.call('XRANGE', KEYS[2], ARGV[i], ARGV[i])
  if entry[1] then
    local raw, f = entry[1][2], {}
    for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
    ids[i - 2] = f.task_id or ''
    local sid = f.schedule_id
    if not sid and f.task_id and f.due_ms then sid = f.task_id .. ':' .. f.due_ms end
    if f.task_id and sid and f.payload and f.due_ms then
      local tried = math.max(tonumber(f.attempts) or 0, (tonumber(f.attempt) or 0) + 1)
      for a = 0, math.min(tried, 1000) do redis.call('DEL', ARGV[2] .. sid .. ':' .. a) end
      out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'task_id', f.task_id,
        'schedule_id', sid, 'type', ARGV[1], 'payload', f.payload, 'attempt', '0',
        'due_ms', f.due_ms, 'enq_ms', now, 'replay_of', ARGV[i], 'o', 'A;mr')
      redis.call('XDEL', KEYS[2], ARGV[i])
    else
      out[#out + 1] = 'malformed'
    end
  else
    out[#out + 1] = 'missing'
  end
end
return {out, ids}

-- Sliding-window check-and-add for a batch of counters, atomically.
-- The same algorithm as window.Counter, with Redis's clock.
--
-- KEYS[i]  counter i: a hash whose fields are bucket epochs and whose
--          values are the hits recorded in that bucket.
-- ARGV[1]  "1": dry run, record nothing (answers only).
-- ARGV[2]  the time in microseconds, or "" to read Redis's TIME (the
--          default: every replica then agrees whatever its own clock says).
-- ARGV[3+5*(i-1) .. 7+5*(i-1)], for counter i:
--          bucket length in microseconds, buckets per window (k), limit,
--          hits (0: check whether one more hit would fit), veto ("1"/"0").
--
-- Returns 5 integers per counter: allowed (0/1), recorded (0/1), remaining,
-- reset in microseconds, bucket epoch.
--
-- A bucket epoch e is floor(now / b). The admission check counts epochs
-- e-k .. e (the oldest bucket, which only partly overlaps the window, in
-- full: no burst at window boundaries) and admits iff sum + hits <= limit.
-- If any counter with veto set is refused, nothing is recorded.

if redis.replicate_commands then
  pcall(redis.replicate_commands) -- effects replication (a no-op from Redis 7)
end

local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local dry = ARGV[1] == '1'

-- state of each distinct key: its epoch, layout and counts inside the window
local states = {}
local function load(key, b, k)
  local st = states[key]
  if st then
    return st
  end
  local e = (now - math.fmod(now, b)) / b
  local fields = redis.call('HGETALL', key)
  -- a field newer than e means Redis's clock stepped back: stand still at
  -- the newest bucket seen, as window.Counter does
  for j = 1, #fields, 2 do
    local f = tonumber(fields[j])
    if f and f > e then
      e = f
    end
  end
  local counts, sum, stale = {}, 0, {}
  for j = 1, #fields, 2 do
    local f = tonumber(fields[j])
    local c = tonumber(fields[j + 1]) or 0
    if f == nil or f < e - k then
      stale[#stale + 1] = fields[j]
    elseif c > 0 then
      counts[f] = c
      sum = sum + c
    end
  end
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  st = {e = e, b = b, k = k, counts = counts, sum = sum, pending = 0, added = 0}
  states[key] = st
  return st
end

local n = #KEYS
local reqs = {}
local vetoed = false
for i = 1, n do
  local a = 3 + 5 * (i - 1)
  local b, k = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local r = {
    limit = tonumber(ARGV[a + 2]), hits = tonumber(ARGV[a + 3]),
    veto = ARGV[a + 4] == '1', st = load(KEYS[i], b, k),
  }
  local need = r.hits
  if need == 0 then
    need = 1
  end
  r.need = need
  -- earlier requests of this batch on the same key count too
  r.allowed = r.st.sum + r.st.pending + need <= r.limit
  if r.allowed and r.hits > 0 then
    r.st.pending = r.st.pending + r.hits
  end
  if r.veto and not r.allowed then
    vetoed = true
  end
  reqs[i] = r
end

local record = not dry and not vetoed
if record then
  for i = 1, n do
    local r = reqs[i]
    if r.allowed and r.hits > 0 then
      local st = r.st
      redis.call('HINCRBY', KEYS[i], st.e, r.hits)
      st.counts[st.e] = (st.counts[st.e] or 0) + r.hits
      st.sum = st.sum + r.hits
      st.added = st.added + 1
      r.recorded = true
    end
  end
  for key, st in pairs(states) do
    if st.added > 0 then
      -- the newest bucket is counted until (e+k+1)*b: at most a window and
      -- a bucket from now
      redis.call('PEXPIRE', key, math.ceil((st.k + 1) * st.b / 1000))
    end
  end
end

-- answers, from the final state of each counter
local out = {}
for i = 1, n do
  local r, st = reqs[i], reqs[i].st
  local e, k, b = st.e, st.k, st.b
  local remaining = r.limit - st.sum
  if remaining < 0 then
    remaining = 0
  end
  local reset = 0
  if r.allowed then
    -- until every counted hit has aged out: the newest non-empty bucket
    for x = e, e - k, -1 do
      if st.counts[x] then
        reset = (x + k + 1) * b - now
        break
      end
    end
  elseif r.need > r.limit then
    reset = k * b -- no window can ever take it: the full window length
  else
    -- until enough old buckets leave that the request would pass
    reset = (e + k + 1) * b - now
    local freed = 0
    for x = e - k, e do
      freed = freed + (st.counts[x] or 0)
      if st.sum - freed + r.need <= r.limit then
        reset = (x + k + 1) * b - now
        break
      end
    end
  end
  if reset < 0 then
    reset = 0
  end
  local a = 5 * (i - 1)
  out[a + 1] = r.allowed and 1 or 0
  out[a + 2] = r.recorded and 1 or 0
  out[a + 3] = remaining
  out[a + 4] = reset
  out[a + 5] = e
end
return out

-- Time buckets (algorithm time_buckets of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- window.BucketCounter: a hash of bucket epochs and their counts.
local TimeBuckets = {}

function TimeBuckets.load(key, b, k)
  local e = idiv(now, b)
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
  return {alg = ALG_TIME_BUCKETS, e = e, b = b, k = k, counts = counts, sum = sum,
          exists = #fields > 0, dirty = {}, added = false}
end

-- ageOut is the time (us) until bucket x leaves the window.
local function swAgeOut(st, x)
  return clamp0((x + st.k + 1) * st.b - now)
end

local function swRetryAfter(st, hits, limit)
  if hits > limit then
    return st.k * st.b
  end
  local freed = 0
  for x = math.max(st.e - st.k, 0), st.e do
    freed = freed + (st.counts[x] or 0)
    if freed >= st.sum or st.sum - freed <= limit - hits then
      return swAgeOut(st, x)
    end
  end
  return swAgeOut(st, st.e)
end

function TimeBuckets.allow(st, hits, limit)
  local s = st.sum
  local r = {remaining = limit - math.min(s, limit), bucket = st.e}
  if hits == 0 then
    if s < limit then
      r.allowed = true
      r.reset = 0
      for x = st.e, math.max(st.e - st.k, 0), -1 do
        if (st.counts[x] or 0) > 0 then
          r.reset = swAgeOut(st, x)
          break
        end
      end
    else
      r.reset = swRetryAfter(st, 1, limit)
    end
    r.reset = r.reset * 1000
    return r
  end
  if s > limit or hits > limit - s then
    r.reset = swRetryAfter(st, hits, limit) * 1000
    return r
  end
  st.sum = s + hits
  st.counts[st.e] = (st.counts[st.e] or 0) + hits
  st.dirty[st.e] = true
  st.added = true
  r.allowed, r.recorded = true, true
  r.remaining = limit - s - hits
  r.reset = swAgeOut(st, st.e) * 1000
  return r
end

-- refund takes hits back from the newest buckets first, never below zero.
function TimeBuckets.refund(st, hits)
  for x = st.e, math.max(st.e - st.k, 0), -1 do
    if hits <= 0 then
      break
    end
    local c = st.counts[x] or 0
    if c > 0 then
      local sub = math.min(c, hits)
      st.counts[x] = c - sub
      st.sum = st.sum - sub
      st.dirty[x] = true
      hits = hits - sub
    end
  end
end

function TimeBuckets.write(key, st)
  local any = false
  for x in pairs(st.dirty) do
    any = true
    local c = st.counts[x] or 0
    if c > 0 then
      redis.call('HSET', key, field(x), c)
    else
      redis.call('HDEL', key, field(x))
    end
  end
  if st.added then
    -- the newest bucket is counted until (e+k+1)*b: at most a window and a
    -- bucket from now
    redis.call('PEXPIRE', key, math.ceil((st.k + 1) * st.b / 1000))
  end
  return any
end

-- rollback and settle: a vetoed batch writes nothing of a time-buckets
-- counter (its state is only written by write).
function TimeBuckets.rollback() end
function TimeBuckets.settle() end

-- undo takes the hits off the bucket they were recorded in (field, its
-- epoch); a bucket that already left the window holds nothing to take back.
function TimeBuckets.undo(key, field, hits)
  undoField(key, field, hits)
end

ALGS[ALG_TIME_BUCKETS] = TimeBuckets

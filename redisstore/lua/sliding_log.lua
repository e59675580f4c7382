-- The sliding log (algorithm sliding_log of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- The exact log (window.LogCounter) as a sorted set: one member per
-- admitted hit, "<time>:<seq>" scored by its admission time (us; seq, six
-- digits, tells hits of one instant apart), and "#seen" scored by minus the
-- newest time written. Every step is O(log n) in the log's size (plus the
-- hits a call adds or takes back): counts are ZCOUNTs, the k-th oldest hit a
-- ZRANGE by rank, and changes are deferred to write, so that a vetoed batch
-- records nothing.
local SlidingLog = {}

local function lgMember(t, seq)
  return field(t) .. ':' .. string.format('%06d', seq)
end

function SlidingLog.load(key, b, k)
  local w = k * b
  local stored = redis.call('ZSCORE', key, '#seen') -- false when the key is missing
  local t = now -- a clock that steps back stands still
  if stored and -tonumber(stored) > t then
    t = -tonumber(stored)
  end
  local edge = t - w -- entries at or before it left the window (t - W, t]
  local expired = redis.call('ZCOUNT', key, 0, field(edge))
  local st = {alg = ALG_SLIDING_LOG, key = key, w = w, t = t, exists = stored ~= false, expired = expired,
              base = redis.call('ZCOUNT', key, '(' .. field(edge), '+inf'), added = 0, removed = 0}
  -- the rank of the oldest live entry: after "#seen" and the expired ones
  st.off = expired
  if stored then
    st.off = st.off + 1
  end
  return st
end

-- lgCount is the hits in the window, the batch's changes included.
local function lgCount(st)
  return st.base - st.removed + st.added
end

-- lgKth is the time of the k-th oldest hit in the window (1 <= k <=
-- lgCount): a stored one, or one this batch added at st.t.
local function lgKth(st, k)
  if k <= st.base - st.removed then
    local r = redis.call('ZRANGE', st.key, st.off + k - 1, st.off + k - 1, 'WITHSCORES')
    return tonumber(r[2])
  end
  return st.t
end

local function lgNewestAgeOut(st)
  local n = lgCount(st)
  if n == 0 then
    return 0
  end
  return clamp0(lgKth(st, n) + st.w - now) * 1000
end

function SlidingLog.allow(st, hits, limit)
  local count = lgCount(st)
  local r = {remaining = limit - math.min(count, limit), bucket = st.t}
  local need = math.max(hits, 1)
  if count > limit or need > limit - count then
    if need > limit then
      r.reset = st.w * 1000
    else
      -- when the (count+need-limit)-th oldest entry leaves the window
      r.reset = clamp0(lgKth(st, count + need - limit) + st.w - now) * 1000
    end
    return r
  end
  if hits == 0 then
    r.allowed = true
    r.reset = lgNewestAgeOut(st)
    return r
  end
  st.added = st.added + hits
  r.allowed, r.recorded = true, true
  r.remaining = limit - count - hits
  r.reset = lgNewestAgeOut(st)
  return r
end

-- refund takes back the newest hits first, never below zero: this batch's
-- own, then stored ones.
function SlidingLog.refund(st, hits)
  local own = math.min(st.added, hits)
  st.added = st.added - own
  st.removed = math.min(st.removed + hits - own, st.base)
end

-- lgRemove removes the members of key that ZREVRANGEBYSCORE key max min
-- LIMIT 0 n lists: the n newest of the range.
local function lgRemove(key, max, min, n)
  while n > 0 do
    local ms = redis.call('ZREVRANGEBYSCORE', key, max, min, 'LIMIT', 0, math.min(n, 1000))
    if #ms == 0 then
      return
    end
    redis.call('ZREM', key, unpack(ms))
    n = n - #ms
  end
end

function SlidingLog.write(key, st)
  if st.expired == 0 and st.added == 0 and st.removed == 0 then
    return false
  end
  if st.expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, 0, field(st.t - st.w))
  end
  lgRemove(key, '+inf', 0, st.removed)
  if st.added > 0 then
    local seq = redis.call('ZCOUNT', key, field(st.t), field(st.t))
    local left = st.added
    while left > 0 do
      local args = {}
      for _ = 1, math.min(left, 500) do
        args[#args + 1] = st.t
        args[#args + 1] = lgMember(st.t, seq)
        seq = seq + 1
      end
      redis.call('ZADD', key, unpack(args))
      left = left - #args / 2
    end
  end
  redis.call('ZADD', key, -st.t, '#seen')
  -- the newest entry (at most t) leaves the window by t + W
  redis.call('PEXPIRE', key, math.ceil((st.t - now + st.w) / 1000) + 1)
  return true
end

-- rollback and settle: a vetoed batch writes nothing of a sliding log.
function SlidingLog.rollback() end
function SlidingLog.settle() end

-- undo takes up to hits off the entries stamped with the time they were
-- recorded at (field, us), the highest sequence numbers first.
function SlidingLog.undo(key, field, hits)
  if hits > 0 then
    lgRemove(key, field, field, hits)
  end
end

ALGS[ALG_SLIDING_LOG] = SlidingLog

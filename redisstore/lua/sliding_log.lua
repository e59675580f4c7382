-- The sliding log (algorithm sliding_log of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- The exact log (window.LogCounter), one field per admission time; a call
-- reads the whole log (at most limit fields).
local SlidingLog = {}

function SlidingLog.load(key, b, k)
  local fields = redis.call('HGETALL', key)
  local cnt, ts, seen = {}, {}, nil
  for j = 1, #fields, 2 do
    if fields[j] == 'seen' then
      seen = tonumber(fields[j + 1])
    else
      local f, c = tonumber(fields[j]), tonumber(fields[j + 1]) or 0
      if f and c > 0 then
        cnt[f] = c
        ts[#ts + 1] = f
      end
    end
  end
  table.sort(ts)
  local t = now -- a clock that steps back stands still
  if seen and seen > t then
    t = seen
  end
  local st = {alg = ALG_SLIDING_LOG, w = k * b, t = t, cnt = cnt, ts = {}, n = 0,
              exists = #fields > 0, dirty = {}, added = false}
  -- entries at or before t - W left the window (t - W, t]
  for _, f in ipairs(ts) do
    if f <= t - st.w then
      st.cnt[f] = nil
      st.dirty[f] = true
    else
      st.ts[#st.ts + 1] = f
      st.n = st.n + cnt[f]
    end
  end
  return st
end

local function lgNewestAgeOut(st)
  if st.n == 0 then
    return 0
  end
  return clamp0(st.ts[#st.ts] + st.w - now) * 1000
end

function SlidingLog.allow(st, hits, limit)
  local count = st.n
  local r = {remaining = limit - math.min(count, limit), bucket = st.t}
  local need = math.max(hits, 1)
  if count > limit or need > limit - count then
    if need > limit then
      r.reset = st.w * 1000
    else
      -- when the (count+need-limit)-th oldest entry leaves the window
      local left, x = count + need - limit, 0
      for _, f in ipairs(st.ts) do
        x = x + st.cnt[f]
        if x >= left then
          r.reset = clamp0(f + st.w - now) * 1000
          break
        end
      end
    end
    return r
  end
  if hits == 0 then
    r.allowed = true
    r.reset = lgNewestAgeOut(st)
    return r
  end
  if st.cnt[st.t] == nil then
    st.ts[#st.ts + 1] = st.t -- t is at least every entry's time
  end
  st.cnt[st.t] = (st.cnt[st.t] or 0) + hits
  st.n = count + hits
  st.dirty[st.t], st.added = true, true
  r.allowed, r.recorded = true, true
  r.remaining = limit - count - hits
  r.reset = lgNewestAgeOut(st)
  return r
end

-- refund takes back the newest hits first, never below zero.
function SlidingLog.refund(st, hits)
  while hits > 0 and #st.ts > 0 do
    local f = st.ts[#st.ts]
    local sub = math.min(st.cnt[f], hits)
    st.cnt[f] = st.cnt[f] - sub
    st.n = st.n - sub
    st.dirty[f] = true
    hits = hits - sub
    if st.cnt[f] == 0 then
      st.cnt[f] = nil
      st.ts[#st.ts] = nil
    end
  end
end

function SlidingLog.write(key, st)
  local any = false
  for f in pairs(st.dirty) do
    any = true
    if st.cnt[f] then
      redis.call('HSET', key, field(f), st.cnt[f])
    else
      redis.call('HDEL', key, field(f))
    end
  end
  if any then
    redis.call('HSET', key, 'seen', field(st.t))
    -- the newest entry (at most t) leaves the window by t + W
    redis.call('PEXPIRE', key, math.ceil((st.t - now + st.w) / 1000) + 1)
  end
  return any
end

-- rollback and settle: a vetoed batch writes nothing of a sliding log.
function SlidingLog.rollback() end
function SlidingLog.settle() end

-- undo takes up to the hits off the entries stamped with the time they
-- were recorded at (field, us).
function SlidingLog.undo(key, field, hits)
  undoField(key, field, hits)
end

ALGS[ALG_SLIDING_LOG] = SlidingLog

-- The fixed window (algorithm fixed_window of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
local FixedWindow = {}

function FixedWindow.load(key, b, k)
  local w = k * b
  local cur = idiv(now, w)
  local fields = redis.call('HGETALL', key)
  local stale = {}
  for j = 1, #fields, 2 do
    local f = tonumber(fields[j])
    if f and f > cur then
      cur = f -- the clock stepped back: act in the newest window
    end
  end
  local cnt = 0
  for j = 1, #fields, 2 do
    local f = tonumber(fields[j])
    if f == cur then
      cnt = tonumber(fields[j + 1]) or 0
    else
      stale[#stale + 1] = fields[j]
    end
  end
  return {alg = ALG_FIXED_WINDOW, w = w, cur = cur, cnt = cnt, stale = stale,
          exists = #fields > 0, dirty = false, added = false}
end

function FixedWindow.allow(st, hits, limit, always)
  local cnt = st.cnt
  local r = {remaining = limit - math.min(cnt, limit),
             reset = clamp0((st.cur + 1) * st.w - now) * 1000, bucket = st.cur}
  if hits == 0 then
    r.allowed = cnt < limit
    return r
  end
  if always and (cnt > limit or hits > limit - cnt) then
    st.cnt = math.min(cnt + hits, MAX_LIMIT)
    st.dirty, st.added = true, true
    r.recorded, r.remaining = true, 0
    return r
  end
  if cnt > limit or hits > limit - cnt then
    if hits > limit then
      r.reset = st.w * 1000
    end
    return r
  end
  st.cnt = cnt + hits
  st.dirty, st.added = true, true
  r.allowed, r.recorded = true, true
  r.remaining = limit - cnt - hits
  return r
end

function FixedWindow.refund(st, hits)
  if st.cnt > 0 then
    st.cnt = st.cnt - math.min(st.cnt, hits)
    st.dirty = true
  end
end

function FixedWindow.write(key, st)
  if not st.dirty then
    return false
  end
  if #st.stale > 0 then
    redis.call('HDEL', key, unpack(st.stale))
  end
  redis.call('HSET', key, field(st.cur), st.cnt)
  -- kept a window past its end, so that it still answers (as an existing,
  -- empty counter) right after the edge
  redis.call('PEXPIRE', key, math.ceil(((st.cur + 2) * st.w - now) / 1000))
  return true
end

-- rollback takes q's hits back from a counter that an always-charged hit
-- keeps (the others are not written).
function FixedWindow.rollback(st, q)
  if st.keep then
    st.cnt = st.cnt - q.hits
  end
end

-- settle keeps a counter created by the vetoed batch, empty (as
-- window.Store keeps the counter it created); a kept charge was written.
function FixedWindow.settle(key, st)
  if st.created and not st.keep then
    st.cnt, st.dirty = 0, true
    FixedWindow.write(key, st)
  end
end

-- undo takes the hits off the window they were recorded in (field, its
-- number), if it is still the newest.
function FixedWindow.undo(key, field, hits, _, b, k)
  local st = FixedWindow.load(key, b, k)
  if tonumber(field) == st.cur and st.cnt > 0 then
    redis.call('HINCRBY', key, field, -math.min(st.cnt, hits))
  end
end

ALGS[ALG_FIXED_WINDOW] = FixedWindow

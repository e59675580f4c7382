-- The sliding window (algorithm sliding_window of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- window.Counter (the default): checkpoint.lua's fixed-size string.
local SlidingWindow = {}

function SlidingWindow.load(key, b, k)
  local st = CP.decode(key, b * k, now)
  st.alg = ALG_SLIDING_WINDOW
  st.t = CP.advance(st)
  st.dirty, st.added = false, false
  return st
end

function SlidingWindow.allow(st, hits, limit, always)
  CP.resize(st, CP.quotaFor(limit))
  local est = CP.estimate(st)
  local r = {remaining = limit - math.min(est, limit), bucket = st.t}
  local need = math.max(hits, 1)
  if always and hits > 0 and (est > limit or hits > limit - est) then
    -- a debt: every hit is counted, up to what the fields hold
    CP.add(st, st.t, math.min(hits, MAX_LIMIT - math.min(est, MAX_LIMIT)))
    st.dirty, st.added = true, true
    r.recorded, r.remaining = true, 0
    r.reset = CP.retryAfter(st, CP.estimate(st), 1, limit)
  elseif est > limit or need > limit - est then
    r.reset = CP.retryAfter(st, est, need, limit)
  elseif hits == 0 then
    r.allowed = true
    r.reset = CP.newestAgeOut(st)
  else
    CP.add(st, st.t, hits)
    st.dirty, st.added = true, true
    r.allowed, r.recorded = true, true
    r.remaining = limit - est - hits
    r.reset = CP.newestAgeOut(st)
  end
  return r
end

function SlidingWindow.refund(st, hits)
  CP.takeBack(st, hits)
  st.dirty = true
end

-- write stores the counter only when its hits changed: the pruning a read
-- does is done again by the next one, and answers do not depend on it.
function SlidingWindow.write(key, st)
  if not st.dirty then
    return false
  end
  CP.encode(key, st)
  return true
end

-- rollback takes back q's hits from a vetoed batch's state, as window.Store
-- does (record, then take back): the open block keeps the newer stamp, so
-- both backends hold the same state.
function SlidingWindow.rollback(st, q, dry)
  if not dry or st.keep then
    CP.takeBack(st, q.hits)
    st.undone = true
  end
end

-- settle writes what a vetoed batch leaves of the counter: hits taken back,
-- or blocks re-sized for a changed limit (CP.resize marks it dirty).
function SlidingWindow.settle(key, st)
  if (st.undone or st.dirty) and not st.keep then
    CP.encode(key, st)
  end
end

-- undo takes back hits recorded at field (a time, us) by an earlier call:
-- the newest hits, unless they were recorded a window or more before the
-- newest time written (they have left already), as window.Counter.UndoAt.
function SlidingWindow.undo(key, field, hits, _, b, k)
  local st = CP.decode(key, b * k, now)
  if st.exists and st.newest - tonumber(field) < st.w and hits > 0 then
    CP.takeBack(st, hits)
    CP.encode(key, st)
  end
end

ALGS[ALG_SLIDING_WINDOW] = SlidingWindow

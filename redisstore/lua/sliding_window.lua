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

-- Reservations: a replica may hold a block of a counter's quota and spend
-- it without a round trip per hit (redisstore/reserve.go). A reservation
-- counts in full from the moment it is granted. The replica spends it only
-- until useEnd (the grant's time plus the validity), then settles it: the
-- hits it used are added at the time of the newest of them (the replica
-- says how long ago that was; see swRecord), and the rest is given back.
-- One that is not settled by exp (useEnd plus a grace the replica
-- chooses, at least the validity, so that its sweep settles an idle block
-- before then) is taken as used in full, at useEnd (or dropped, if a
-- window has passed since useEnd). So every hit spent from a block counts
-- for at least a window from its own time, and no window admits more than
-- the limit.

-- Blocks are only for keys far from their limit: a grant (or a top-up's
-- growth) is made only if the demand it is sized for, over a window, from
-- as many replicas as hold blocks, fits in what the limit has left; it
-- takes at most 1/RES_SHARE of that, so blocks shrink to nothing as a
-- counter approaches its limit; and grants under RES_MIN are not made. A
-- held block that would keep more than 1/RES_SHARE of what the limit has
-- left besides it is not renewed: it keeps its useEnd and the replica
-- gives it back at once (RES_CUT). A key near its limit (or a burst that
-- would reach it) goes to Redis hit by hit, as without blocks.
local RES_SHARE, RES_MIN = 8, 4

-- The status a reservation answers with (its allowed field): the block was
-- not held (a new one, or one Redis lost or took as spent), held and
-- renewed, or held and cut (not renewed: to be given back at once).
local RES_NEW, RES_RENEWED, RES_CUT = 0, 1, 2

-- swRecord records hits spent from a block, the newest of them at t (us):
-- not at all if a window has passed since t (they have left); else at t,
-- but never before the newest hits already counted (the log's stamps stay
-- in order, and hits only ever count longer for it) nor after st.t.
local function swRecord(st, t, hits)
  if t + st.w <= st.t or hits <= 0 then
    return
  end
  local newest = CP.newestStamp(st)
  if newest ~= nil and t < newest then
    t = newest
  end
  if t > st.t then
    t = st.t
  end
  CP.add(st, t, math.min(hits, MAX_LIMIT - math.min(CP.estimate(st), MAX_LIMIT)))
  st.dirty = true
end

-- swExpire takes the reservations past their exp as used. After advance
-- and resize.
local function swExpire(st)
  if #st.res == 0 then
    return
  end
  local kept = {}
  for _, r in ipairs(st.res) do
    if st.now < r.exp then
      kept[#kept + 1] = r
    else
      swRecord(st, r.useEnd, r.hits) -- no hit of it was spent later
      st.dirty = true
    end
  end
  st.res = kept
end

-- swReserved is the hits the reservations hold.
local function swReserved(st)
  if #st.res == 0 then
    return 0
  end
  local o = 0
  for _, r in ipairs(st.res) do
    o = o + r.hits
  end
  return o
end

-- swRetry is the time (ns) until need more hits fit under limit, with est
-- hits counted and o reserved: when enough blocks leave the window, or, if
-- the reservations alone leave too little room, when the first of them
-- must be settled.
local function swRetry(st, est, o, need, limit)
  if o == 0 or need > limit then
    return CP.retryAfter(st, est, need, limit)
  elseif need <= limit - o then
    return CP.retryAfter(st, est, need, limit - o)
  end
  local soonest = math.huge
  for _, r in ipairs(st.res) do
    soonest = math.min(soonest, r.exp)
  end
  return math.max(soonest - st.now, 0) * 1000
end

function SlidingWindow.allow(st, hits, limit, always)
  CP.resize(st, CP.quotaFor(limit))
  swExpire(st)
  local own, o = CP.estimate(st), swReserved(st)
  local est = own + o
  local r = {remaining = limit - math.min(est, limit), bucket = st.t}
  local need = math.max(hits, 1)
  if always and hits > 0 and (est > limit or hits > limit - est) then
    -- a debt: every hit is counted, up to what the fields hold
    CP.add(st, st.t, math.min(hits, MAX_LIMIT - math.min(own, MAX_LIMIT)))
    st.dirty, st.added = true, true
    r.recorded, r.remaining = true, 0
    r.reset = swRetry(st, CP.estimate(st), o, 1, limit)
  elseif est > limit or need > limit - est then
    r.reset = swRetry(st, own, o, need, limit)
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

-- reserve settles holder's block (used: the hits spent since the last
-- settling, the newest of them age us ago; -1 for a new block), then, if
-- want > 0, tops it up to want hits (what is left of it, plus up to
-- 1/RES_SHARE of what the limit has left), valid for validity us from now
-- and settled within grace us after that (else taken as spent); with want
-- 0 the rest is given back. A held block whose rest is more than
-- 1/RES_SHARE of what the limit has left besides it is cut: kept as it
-- was (its useEnd, its exp), for the replica to give back at once. Its answer: allowed the status (RES_NEW, RES_RENEWED,
-- RES_CUT), recorded the hits the block now holds (0: none), remaining
-- what the limit has left after it, reset when everything counted has
-- aged out, and bucket the time of the grant (us).
function SlidingWindow.reserve(st, limit, holder, used, want, validity, grace, age)
  CP.resize(st, CP.quotaFor(limit))
  swExpire(st)
  local held, rest = nil, 0
  for i, r in ipairs(st.res) do
    if r.holder == holder then
      held = r
      rest = r.hits - math.min(math.max(used, 0), r.hits)
      table.remove(st.res, i)
      break
    end
  end
  -- The hits spent are recorded even when the block is gone: taken as
  -- spent in full at exp (they then count twice, which only costs
  -- capacity), or lost with Redis's data (they must count). The newest
  -- was spent age us ago by the replica's clock, so no later than st.t -
  -- age by Redis's, and before the block's useEnd.
  if used > 0 then
    local at = st.t - age
    if held ~= nil then
      at = math.min(at, held.useEnd)
    end
    swRecord(st, at, used)
  end
  if held ~= nil or used > 0 then
    st.dirty = true
  end
  if want == 0 then
    rest = 0 -- given back
  end
  local room = limit - math.min(CP.estimate(st) + swReserved(st) + rest, limit)
  -- A block that would hold more than 1/RES_SHARE of what the limit has
  -- left besides it (the key came near its limit) is cut.
  if held ~= nil and rest > 0 and want > 0 and rest * RES_SHARE > room then
    held.hits = rest
    st.res[#st.res + 1] = held
    return {allowed = RES_CUT, recorded = rest, remaining = room, reset = CP.newestAgeOut(st),
            bucket = held.useEnd - validity}
  end
  -- Only a key far from its limit gets more: at the demand want stands
  -- for (two validities' worth, on this replica), this replica and as
  -- many as hold blocks would not use up the room within a window.
  local g = 0
  if want > rest and (held ~= nil or #st.res < RES_MAX) and want * st.w / validity * (#st.res + 1) <= 2 * room then
    g = math.min(want - rest, idiv(room, RES_SHARE))
    if g < RES_MIN then
      g = 0
    end
  end
  local total = rest + g
  if total > 0 then
    if st.res == NO_RES then
      st.res = {}
    end
    st.res[#st.res + 1] = {holder = holder, hits = total, useEnd = st.t + validity, exp = st.t + validity + math.max(grace, validity)}
    st.dirty = true
  end
  local status = RES_NEW
  if held ~= nil then
    status = RES_RENEWED
  end
  return {allowed = status, recorded = total, remaining = room - g, reset = CP.newestAgeOut(st), bucket = st.t}
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

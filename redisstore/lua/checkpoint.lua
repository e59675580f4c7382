-- The default sliding window (window.Counter, a count-quantised checkpoint
-- log) as one fixed-size string per key, used by sliding_window.lua: the Go
-- side puts this file after common.lua and the constants it injects
-- (BLOCKS = window.Blocks, EXACT = window.ExactLimit, CP_TICKS =
-- window.TicksPerWindow; see scripts.go). Every step is the one of
-- window.Counter, in microseconds (Redis's TIME), so both give the same
-- answers at the same instants; see window/counter.go for why it never
-- undercounts and overcounts by less than one block.
--
-- The value is struct.pack('<dI4I4HBB', newest, quota, open, openTick, head,
-- n) followed by the closed blocks' times, oldest first (ring slots head ..
-- head+n-1 mod the ring's capacity): newest is the newest time written
-- (us), quota the limit the block sizes divide (at least BLOCKS) or, below
-- BLOCKS, the limit of an exact log (at most EXACT), open the hits of the
-- open block and openTick the tick of its newest hit. The times are n
-- 16-bit ticks, or, for an exact log, n doubles (us). At most 20 + 2*BLOCKS
-- bytes. The blocks of quota that replicas hold (reservations, see
-- sliding_window.lua) follow, when there are any: their number (one byte),
-- then per reservation struct.pack('<dI4dd', holder, hits, useEnd, exp),
-- at most RES_MAX of them.

local CP = {}

-- ticks per window at most, and the 16-bit tick range
local CP_RANGE = 65536 -- (CP_TICKS, ticks per window at most, is window.TicksPerWindow)

-- cpTick is window.TickLength in microseconds for a window of w us.
local function cpTick(w)
  return math.max(idiv(w + CP_TICKS - 1, CP_TICKS), 1)
end

-- cpAbs is t (us) rounded up to a whole tick, in ticks.
local function cpAbs(st, t)
  return idiv(t + st.u - 1, st.u)
end

-- cpLift turns a 16-bit tick into the full tick at or before anchor.
local function cpLift(tick, anchor)
  return anchor - ((anchor - tick) % CP_RANGE)
end

-- cpExact reports whether st's ring holds full times (an exact log).
local function cpExact(st)
  return st.quota < BLOCKS
end

-- cpSlots is the ring's capacity in closed blocks.
local function cpSlots(st)
  if cpExact(st) then
    return EXACT
  end
  return BLOCKS
end

-- cpFormat is the struct format of n stored times.
local function cpFormat(st, n)
  if cpExact(st) then
    return '<' .. string.rep('d', n)
  end
  return '<' .. string.rep('H', n)
end

-- cpStamp is the time (us) of the i-th oldest closed block.
local function cpStamp(st, i, anchor)
  if cpExact(st) then
    return st.ring[i]
  end
  return cpLift(st.ring[i], anchor) * st.u
end

-- CP.quotaFor is the quota of an empty window under limit.
function CP.quotaFor(limit)
  if limit <= EXACT then
    return limit
  end
  return math.max(limit, BLOCKS)
end

-- cpFilled is the hits of the size cycle's slots 0 .. x-1:
-- floor(x*q/BLOCKS), q at least BLOCKS (an exact log has blocks of one hit).
local function cpFilled(st, x)
  return idiv(x * math.max(st.quota, BLOCKS), BLOCKS)
end

local function cpSize(st, x)
  return cpFilled(st, x + 1) - cpFilled(st, x)
end

-- RES_MAX is the most reservations one counter holds (the tail is one
-- byte of count and 28 bytes per reservation).
local RES_MAX = 8

-- NO_RES is the reservations of a counter that has none, shared (never
-- added to: SlidingWindow.reserve makes a table of its own), so that the
-- common case allocates nothing.
local NO_RES = {}

-- cpDecodeReservations reads the reservations at pos of v into st.res.
local function cpDecodeReservations(st, v, pos)
  local r
  r, pos = struct.unpack('B', v, pos)
  st.res = {}
  for i = 1, r do
    local holder, hits, useEnd, exp
    holder, hits, useEnd, exp, pos = struct.unpack('<dI4dd', v, pos)
    st.res[i] = {holder = holder, hits = hits, useEnd = useEnd, exp = exp}
  end
end

-- cpEncodeReservations is the tail that holds st.res.
local function cpEncodeReservations(st)
  local parts = {struct.pack('B', #st.res)}
  for i, r in ipairs(st.res) do
    parts[i + 1] = struct.pack('<dI4dd', r.holder, r.hits, r.useEnd, r.exp)
  end
  return table.concat(parts)
end

-- CP.decode reads key's value (or an empty counter) for a window of w us,
-- to be answered at now (us).
function CP.decode(key, w, now)
  local st = {w = w, u = cpTick(w), now = now, newest = 0, quota = BLOCKS, open = 0, otick = 0,
              head = 0, n = 0, ring = {}, res = NO_RES}
  local v = redis.call('GET', key)
  st.exists = v ~= false
  if v then
    st.newest, st.quota, st.open, st.otick, st.head, st.n = struct.unpack('<dI4I4HBB', v)
    local pos = 21
    if st.n > 0 then
      st.ring = {struct.unpack(cpFormat(st, st.n), v, 21)}
      pos = st.ring[st.n + 1]
      st.ring[st.n + 1] = nil -- unpack's last value is the next position
    end
    if #v >= pos then
      cpDecodeReservations(st, v, pos)
    end
  end
  return st
end

-- CP.encode writes st back; its TTL covers the newest block's departure.
function CP.encode(key, st)
  local ring = {}
  for i = 1, st.n do
    ring[i] = st.ring[i]
  end
  local v = struct.pack('<dI4I4HBB', st.newest, st.quota, st.open, st.otick, st.head, st.n)
  if st.n > 0 then
    v = v .. struct.pack(cpFormat(st, st.n), unpack(ring))
  end
  local last = st.newest + st.u + st.w -- when the newest block leaves
  if #st.res > 0 then
    v = v .. cpEncodeReservations(st)
    for _, r in ipairs(st.res) do
      last = math.max(last, r.exp, r.useEnd + st.w)
    end
  end
  local ttl = math.ceil((last - st.now) / 1000) + 1
  redis.call('SET', key, v, 'PX', math.max(ttl, 1))
end

-- CP.openTime is the time (us) the open block is stamped at.
function CP.openTime(st)
  return cpLift(st.otick, cpAbs(st, st.newest)) * st.u
end

-- CP.stampAt is the time (us) of the i-th oldest closed block, after
-- advance.
function CP.stampAt(st, i)
  return cpStamp(st, i, cpAbs(st, st.newest))
end

-- CP.advance clamps now to the newest time written, drops the blocks that
-- left the window ending there and returns that time (window.Counter's
-- advance).
function CP.advance(st)
  local t = st.now
  local prev = st.newest
  if t <= prev then
    t = prev
  end
  local edge = t - st.w
  local anchor = cpAbs(st, prev)
  if edge >= anchor * st.u then
    st.n, st.open, st.ring = 0, 0, {}
  else
    local drop = 0
    while drop < st.n and cpStamp(st, drop + 1, anchor) <= edge do
      drop = drop + 1
    end
    if drop > 0 then
      local ring = {}
      for i = drop + 1, st.n do
        ring[#ring + 1] = st.ring[i]
      end
      st.ring, st.n = ring, st.n - drop
      st.head = (st.head + drop) % cpSlots(st)
    end
    if st.open > 0 and cpLift(st.otick, anchor) * st.u <= edge then
      st.open = 0
    end
  end
  if st.n == 0 and st.open == 0 then
    st.head = 0
  end
  if t > prev then
    st.newest = t
  end
  return t
end

-- CP.resize sizes the blocks for quota q (window.Counter's resize): the
-- hits counted are regrouped, oldest first, into the size cycle of q from
-- slot 0, each new block stamped with the time of the newest old block it
-- takes hits from; the rest is the open block. After advance.
function CP.resize(st, q)
  if q == st.quota then
    return
  end
  if st.n == 0 and st.open == 0 then
    st.quota = q
    return
  end
  local anchor = cpAbs(st, st.newest)
  local sizes, stamps = {}, {}
  for i = 1, st.n do
    sizes[i], stamps[i] = cpSize(st, st.head + i - 1), cpStamp(st, i, anchor)
  end
  local k = st.n
  if st.open > 0 then
    k = k + 1
    sizes[k], stamps[k] = st.open, CP.openTime(st)
  end
  st.quota, st.head, st.n, st.open, st.ring = q, 0, 0, 0, {}
  local exact, slots = cpExact(st), cpSlots(st)
  local pending, at = 0, 0
  for i = 1, k do
    pending, at = pending + sizes[i], stamps[i]
    while st.n < slots do
      local b = cpSize(st, st.n)
      if pending < b then
        break
      end
      st.n = st.n + 1
      if exact then
        st.ring[st.n] = at
      else
        st.ring[st.n] = cpAbs(st, at) % CP_RANGE
      end
      pending = pending - b
    end
  end
  st.open, st.otick = pending, cpAbs(st, at) % CP_RANGE
  st.dirty = true
end

function CP.estimate(st)
  return cpFilled(st, st.head + st.n) - cpFilled(st, st.head) + st.open
end

-- CP.add records hits at t, the newest time (window.Counter's add): a
-- block made only of hits the open block already held keeps the open
-- block's own time; any other is stamped at t. t may be earlier than
-- st.t, but never earlier than CP.newestStamp (the stamps stay in order).
function CP.add(st, t, hits)
  local tick = cpAbs(st, t) % CP_RANGE
  local stamp, oldStamp = tick, st.otick
  if cpExact(st) then
    stamp, oldStamp = t, CP.openTime(st)
  end
  local old, total = st.open, st.open + hits
  while st.n < cpSlots(st) do
    local b = cpSize(st, st.head + st.n)
    if total < b then
      break
    end
    st.n = st.n + 1
    if old >= b then
      st.ring[st.n] = oldStamp
      old = old - b
    else
      st.ring[st.n] = stamp
      old = 0
    end
    total = total - b
  end
  st.open, st.otick = total, tick
end

-- CP.takeBack removes hits, newest first (window.Counter's takeBack).
function CP.takeBack(st, hits)
  local take = math.min(st.open, hits)
  st.open = st.open - take
  hits = hits - take
  local anchor = cpAbs(st, st.newest)
  while hits > 0 and st.n > 0 do
    st.otick = cpAbs(st, cpStamp(st, st.n, anchor)) % CP_RANGE
    st.ring[st.n] = nil
    st.n = st.n - 1
    local b = cpSize(st, st.head + st.n)
    take = math.min(b, hits)
    st.open = b - take
    hits = hits - take
  end
end

-- CP.ageOut is the time (ns) from now until a block stamped at (us) leaves.
function CP.ageOut(st, at)
  local d = at + st.w - st.now
  if d < 0 then
    d = 0
  end
  return d * 1000
end

-- CP.retryAfter is the time (ns) until need more hits fit under limit.
function CP.retryAfter(st, est, need, limit)
  if need > limit then
    return st.w * 1000
  end
  local excess = est + need - limit
  local q = math.max(st.quota, BLOCKS)
  local x = idiv((excess + cpFilled(st, st.head)) * BLOCKS + q - 1, q)
  local k = x - st.head
  if k <= st.n then
    return CP.ageOut(st, CP.stampAt(st, k))
  end
  return CP.ageOut(st, CP.openTime(st))
end

-- CP.newestStamp is the time (us) the newest hits counted are stamped at,
-- or nil when none are counted. After advance.
function CP.newestStamp(st)
  if st.open > 0 then
    return CP.openTime(st)
  elseif st.n > 0 then
    return CP.stampAt(st, st.n)
  end
  return nil
end

function CP.newestAgeOut(st)
  local at = CP.newestStamp(st)
  if at == nil then
    return 0
  end
  return CP.ageOut(st, at)
end

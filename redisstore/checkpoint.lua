-- The default sliding window (window.Counter, a count-quantised checkpoint
-- log) as one fixed-size string per key, shared by allow.lua and undo.lua:
-- the Go side prepends this file (after common.lua and a line defining
-- BLOCKS = window.Blocks) to each of them. Every step is the one of
-- window.Counter, in microseconds (Redis's TIME), so both give the same
-- answers at the same instants; see window/counter.go for why it never
-- undercounts and overcounts by less than one block.
--
-- The value is struct.pack('<dI4I4HBB', newest, quota, open, openTick, head,
-- n) followed by n 16-bit ticks, the closed blocks oldest first (ring slots
-- head .. head+n-1 mod BLOCKS): newest is the newest time written (us),
-- quota the limit the block sizes divide, open the hits of the open block
-- and openTick the tick of its newest hit. At most 20 + 2*BLOCKS bytes.

local CP = {}

-- ticks per window at most, and the 16-bit tick range
local CP_TICKS, CP_RANGE = 64000, 65536

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

-- cpFilled is the hits of the size cycle's slots 0 .. x-1: floor(x*q/BLOCKS).
local function cpFilled(st, x)
  return idiv(x * st.quota, BLOCKS)
end

local function cpSize(st, x)
  return cpFilled(st, x + 1) - cpFilled(st, x)
end

-- CP.decode reads key's value (or an empty counter) for a window of w us,
-- to be answered at now (us).
function CP.decode(key, w, now)
  local st = {w = w, u = cpTick(w), now = now, newest = 0, quota = BLOCKS, open = 0, otick = 0,
              head = 0, n = 0, ring = {}}
  local v = redis.call('GET', key)
  st.exists = v ~= false
  if v then
    st.newest, st.quota, st.open, st.otick, st.head, st.n = struct.unpack('<dI4I4HBB', v)
    if st.n > 0 then
      st.ring = {struct.unpack('<' .. string.rep('H', st.n), v, 21)}
      st.ring[st.n + 1] = nil -- unpack's last value is the next position
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
    v = v .. struct.pack('<' .. string.rep('H', st.n), unpack(ring))
  end
  local ttl = math.ceil((st.newest - st.now + st.u + st.w) / 1000) + 1
  redis.call('SET', key, v, 'PX', math.max(ttl, 1))
end

-- CP.at is the time (us) a stored tick stands for.
function CP.at(st, tick)
  return cpLift(tick, cpAbs(st, st.newest)) * st.u
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
    while drop < st.n and cpLift(st.ring[drop + 1], anchor) * st.u <= edge do
      drop = drop + 1
    end
    if drop > 0 then
      local ring = {}
      for i = drop + 1, st.n do
        ring[#ring + 1] = st.ring[i]
      end
      st.ring, st.n = ring, st.n - drop
      st.head = (st.head + drop) % BLOCKS
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

function CP.estimate(st)
  return cpFilled(st, st.head + st.n) - cpFilled(st, st.head) + st.open
end

-- CP.add records hits at time t (window.Counter's add).
function CP.add(st, t, hits)
  local tick = cpAbs(st, t) % CP_RANGE
  local total = st.open + hits
  while st.n < BLOCKS do
    local b = cpSize(st, st.head + st.n)
    if total < b then
      break
    end
    st.n = st.n + 1
    st.ring[st.n] = tick
    total = total - b
  end
  st.open, st.otick = total, tick
end

-- CP.takeBack removes hits, newest first (window.Counter's takeBack).
function CP.takeBack(st, hits)
  local take = math.min(st.open, hits)
  st.open = st.open - take
  hits = hits - take
  while hits > 0 and st.n > 0 do
    st.otick = st.ring[st.n]
    st.ring[st.n] = nil
    st.n = st.n - 1
    local b = cpSize(st, st.head + st.n)
    take = math.min(b, hits)
    st.open = b - take
    hits = hits - take
  end
end

-- CP.ageOut is the time (ns) from now until a block stamped tick leaves.
function CP.ageOut(st, tick)
  local d = CP.at(st, tick) + st.w - st.now
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
  local x = idiv((excess + cpFilled(st, st.head)) * BLOCKS + st.quota - 1, st.quota)
  local k = x - st.head
  if k <= st.n then
    return CP.ageOut(st, st.ring[k])
  end
  return CP.ageOut(st, st.otick)
end

function CP.newestAgeOut(st)
  if st.open > 0 then
    return CP.ageOut(st, st.otick)
  elseif st.n > 0 then
    return CP.ageOut(st, st.ring[st.n])
  end
  return 0
end

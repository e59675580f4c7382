-- The concurrency limit (algorithm concurrency of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- window.LeaseCounter as a sorted set: one member per lease, "h<id>" for a
-- holder's (id: window.HolderID) scored by its start (us), "~<start>" for
-- slots held by nobody scored by its start plus CC_NOBODY (so that those
-- leases form a range of their own, oldest first); "#<lease>" scored by
-- minus its slots when it holds more than one; "#held" by minus the slots
-- held; "#seen" by minus the newest time written. A lease ends a window
-- after its start. Every step is O(log n) in the number of leases, plus the
-- leases it ends, changes or walks past (at most the slots it asks for):
-- counts are kept, the oldest leases are a ZRANGEBYSCORE away, and changes
-- are deferred to write, so that a vetoed batch records nothing.
local Concurrency = {}

-- Nobody's leases are scored start + CC_NOBODY: 2^52 us (142 years) keeps
-- every score an exact double.
local CC_NOBODY = 4503599627370496

local function ccNum(v, default)
  if v then
    return -tonumber(v)
  end
  return default
end

-- ccStored returns lease f as stored, {start, n}, or nil.
local function ccStored(key, f)
  local s = redis.call('ZSCORE', key, f)
  if not s then
    return nil
  end
  s = tonumber(s)
  if string.sub(f, 1, 1) == '~' then
    s = s - CC_NOBODY
  end
  return {start = s, n = ccNum(redis.call('ZSCORE', key, '#' .. f), 1)}
end

function Concurrency.load(key, b, k)
  local w = k * b
  local seen = redis.call('ZSCORE', key, '#seen') -- false when the key is missing
  local t = now -- a clock that steps back stands still
  if seen and -tonumber(seen) > t then
    t = -tonumber(seen)
  end
  local st = {alg = ALG_CONCURRENCY, key = key, w = w, t = t, exists = seen ~= false,
              held = ccNum(redis.call('ZSCORE', key, '#held'), 0), pend = {}, ended = {},
              changed = false, added = false}
  -- leases that ended by t (start <= t - W): gone, their slots no longer held
  local edge = t - w
  for _, r in ipairs({{0, edge}, {CC_NOBODY, CC_NOBODY + edge}}) do
    for _, f in ipairs(redis.call('ZRANGEBYSCORE', key, r[1], field(r[2]))) do
      st.ended[#st.ended + 1] = f
      st.held = st.held - ccNum(redis.call('ZSCORE', key, '#' .. f), 1)
    end
  end
  st.edge = edge
  return st
end

-- ccLease returns lease f as this batch sees it, {start, n}, or nil: its
-- change in this batch, else the stored lease if it has not ended.
local function ccLease(st, f)
  local p = st.pend[f]
  if p ~= nil then
    return p or nil
  end
  local l = ccStored(st.key, f)
  if l and l.start > st.edge then
    return l
  end
  return nil
end

-- ccSet records lease f's new slots n (0: the lease is gone), leased from
-- start.
local function ccSet(st, f, start, n)
  if n > 0 then
    st.pend[f] = {start = start, n = n}
  else
    st.pend[f] = false
  end
  st.changed = true
end

-- ccWalk calls fn(f, lease) for the live leases oldest first, the stored
-- ones of the ranges given (holders', nobody's or both, merged by start)
-- and then this batch's new or moved ones (which start at st.t, the newest
-- time), until fn returns true. A stored lease this batch only reduced is
-- visited in its place, as reduced; one it removed or moved, not there.
local function ccWalk(st, holders, nobody, fn)
  local ranges = {}
  if holders then
    ranges[#ranges + 1] = {lo = '(' .. field(st.edge), hi = field(CC_NOBODY - 1), off = 0}
  end
  if nobody then
    ranges[#ranges + 1] = {lo = '(' .. field(CC_NOBODY + st.edge), hi = '+inf', off = CC_NOBODY}
  end
  for _, r in ipairs(ranges) do
    r.buf, r.i, r.next = {}, 1, 0
  end
  local function peek(r)
    if r.i > #r.buf and not r.done then
      local got = redis.call('ZRANGEBYSCORE', st.key, r.lo, r.hi, 'WITHSCORES', 'LIMIT', r.next, 16)
      r.buf, r.i, r.next = {}, 1, r.next + 16
      for j = 1, #got, 2 do
        r.buf[#r.buf + 1] = {f = got[j], start = tonumber(got[j + 1]) - r.off}
      end
      r.done = #r.buf < 16
    end
    return r.buf[r.i]
  end
  local visited = {}
  while true do
    local best, br = nil, nil
    for _, r in ipairs(ranges) do
      local e = peek(r)
      if e and (best == nil or e.start < best.start) then
        best, br = e, r
      end
    end
    if best == nil then
      break
    end
    br.i = br.i + 1
    local p = st.pend[best.f]
    local l = nil
    if p == nil then
      l = {start = best.start, n = ccNum(redis.call('ZSCORE', st.key, '#' .. best.f), 1)}
    elseif p and p.start == best.start then
      l = p
    end
    if l then
      visited[best.f] = true
      if fn(best.f, l) then
        return
      end
    end
  end
  for f, l in pairs(st.pend) do
    local isNobody = string.sub(f, 1, 1) == '~'
    if l and not visited[f] and ((isNobody and nobody) or (not isNobody and holders)) then
      if fn(f, l) then
        return
      end
    end
  end
end

-- ccLastEnd is the time (ns) until every lease held has ended.
local function ccLastEnd(st)
  if st.held <= 0 then
    return 0
  end
  for _, l in pairs(st.pend) do
    if l and l.start == st.t then
      return clamp0(st.t + st.w - now) * 1000 -- a lease this batch added: the newest
    end
  end
  local newest = nil
  for _, r in ipairs({{field(CC_NOBODY - 1), '(' .. field(st.edge), 0}, {'+inf', '(' .. field(CC_NOBODY + st.edge), CC_NOBODY}}) do
    -- the newest stored lease of the range that this batch did not remove
    local off = 0
    while true do
      local got = redis.call('ZREVRANGEBYSCORE', st.key, r[1], r[2], 'WITHSCORES', 'LIMIT', off, 8)
      local found = false
      for j = 1, #got, 2 do
        if st.pend[got[j]] ~= false then -- not removed by this batch
          local s = tonumber(got[j + 1]) - r[3]
          if newest == nil or s > newest then
            newest = s
          end
          found = true
          break
        end
      end
      if found or #got < 16 then
        break
      end
      off = off + 8
    end
  end
  if newest == nil then
    return 0
  end
  return clamp0(newest + st.w - now) * 1000
end

local function ccRetryAfter(st, need, limit)
  if need > limit then
    return st.w * 1000
  end
  local held, reset = st.held, nil
  ccWalk(st, true, true, function(_, l)
    held = held - l.n
    if held + need <= limit then
      reset = clamp0(l.start + st.w - now) * 1000
      return true
    end
    return false
  end)
  return reset or ccLastEnd(st)
end

local function ccHolderField(holder, t)
  if holder ~= 0 then
    return 'h' .. field(holder)
  end
  return '~' .. field(t)
end

function Concurrency.allow(st, hits, limit, _, holder)
  local r = {remaining = limit - math.min(st.held, limit), bucket = st.t}
  local need = math.max(hits, 1)
  if st.held > limit or need > limit - st.held then
    r.reset = ccRetryAfter(st, need, limit)
    return r
  end
  if hits == 0 then
    r.allowed = true
    r.reset = ccLastEnd(st)
    return r
  end
  local f = ccHolderField(holder, st.t)
  local l = ccLease(st, f)
  ccSet(st, f, st.t, hits + (l and l.n or 0))
  st.held = st.held + hits
  st.added = true
  r.allowed, r.recorded = true, true
  r.remaining = limit - st.held
  r.reset = ccLastEnd(st)
  return r
end

-- ccTake takes up to hits slots off lease f (as ccLease sees it) and
-- returns how many it took.
local function ccTake(st, f, l, hits)
  local took = math.min(hits, l.n)
  ccSet(st, f, l.start, l.n - took)
  st.held = st.held - took
  return took
end

-- refund gives back the holder's slots, or the oldest held by nobody.
function Concurrency.refund(st, hits, _, holder)
  if holder ~= 0 then
    local f = ccHolderField(holder, 0)
    local l = ccLease(st, f)
    if l then
      ccTake(st, f, l, hits)
    end
    return
  end
  local taken = {}
  ccWalk(st, false, true, function(f, l)
    local took = math.min(hits, l.n)
    taken[#taken + 1] = {f = f, l = l, n = took}
    hits = hits - took
    return hits == 0
  end)
  for _, x in ipairs(taken) do
    ccTake(st, x.f, x.l, x.n)
  end
end

-- takeBack takes back hits slots recorded by allow at st.t, as
-- window.LeaseCounter's undoAt does.
function Concurrency.takeBack(st, hits, holder)
  local f = ccHolderField(holder, st.t)
  local l = ccLease(st, f)
  if l then
    ccTake(st, f, l, hits)
  end
end

-- ccStore writes lease f: n slots from start, or none.
local function ccStore(key, f, start, n)
  if n <= 0 then
    redis.call('ZREM', key, f, '#' .. f)
    return
  end
  local score = start
  if string.sub(f, 1, 1) == '~' then
    score = start + CC_NOBODY
  end
  redis.call('ZADD', key, score, f)
  if n == 1 then
    redis.call('ZREM', key, '#' .. f)
  else
    redis.call('ZADD', key, -n, '#' .. f)
  end
end

function Concurrency.write(key, st)
  if not st.changed then
    return false
  end
  for _, f in ipairs(st.ended) do
    if st.pend[f] == nil then
      redis.call('ZREM', key, f, '#' .. f)
    end
  end
  for f, l in pairs(st.pend) do
    if l then
      ccStore(key, f, l.start, l.n)
    else
      ccStore(key, f, 0, 0)
    end
  end
  if st.held <= 0 then
    redis.call('DEL', key)
    return true
  end
  redis.call('ZADD', key, -st.held, '#held', -st.t, '#seen')
  local reset = ccLastEnd(st)
  redis.call('PEXPIRE', key, math.ceil(reset / 1000000) + 1)
  return true
end

-- rollback gives q's slots back in a vetoed batch: a holder admitted again
-- keeps its newer lease, as in window.Store.
function Concurrency.rollback(st, q, dry)
  if not dry then
    Concurrency.takeBack(st, q.hits, q.holder)
    st.undone = true
  end
end

-- settle writes what a vetoed batch leaves of the leases.
function Concurrency.settle(key, st)
  if st.undone and not st.keep then
    Concurrency.write(key, st)
  end
end

-- undo takes the slots off the lease that f names.
function Concurrency.undo(key, f, hits)
  local l = ccStored(key, f)
  if not l or hits <= 0 then
    return
  end
  local took = math.min(hits, l.n)
  ccStore(key, f, l.start, l.n - took)
  local held = ccNum(redis.call('ZSCORE', key, '#held'), 0) - took
  if held <= 0 then
    redis.call('DEL', key)
  else
    redis.call('ZADD', key, -held, '#held')
  end
end

ALGS[ALG_CONCURRENCY] = Concurrency

-- The concurrency limit (algorithm concurrency of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
-- window.LeaseCounter: a hash with one field per lease, "h<id>" for a
-- holder's (id: window.HolderID) and "~<start>" for slots held by nobody
-- leased at start, valued "<start> <slots>" (start in microseconds), plus
-- "seen" (the newest time written). A lease ends a window after its start.
local Concurrency = {}

function Concurrency.load(key, b, k)
  local fields = redis.call('HGETALL', key)
  local w = k * b
  local seen, ls = nil, {}
  for j = 1, #fields, 2 do
    if fields[j] == 'seen' then
      seen = tonumber(fields[j + 1])
    else
      local s0, n = string.match(fields[j + 1], '^(%d+) (%d+)$')
      if s0 then
        ls[#ls + 1] = {f = fields[j], start = tonumber(s0), n = tonumber(n)}
      end
    end
  end
  local t = now -- a clock that steps back stands still
  if seen and seen > t then
    t = seen
  end
  table.sort(ls, function(x, y)
    if x.start ~= y.start then
      return x.start < y.start
    end
    return x.f < y.f
  end)
  local st = {alg = ALG_CONCURRENCY, w = w, t = t, ls = {}, held = 0, exists = #fields > 0, dirty = {},
              changed = false, added = false}
  for _, l in ipairs(ls) do
    if l.start <= t - w then
      st.dirty[l.f] = true -- ended: deleted with the next write
    else
      st.ls[#st.ls + 1] = l
      st.held = st.held + l.n
    end
  end
  return st
end

local function ccLastEnd(st)
  if #st.ls == 0 then
    return 0
  end
  return clamp0(st.ls[#st.ls].start + st.w - now) * 1000
end

local function ccRetryAfter(st, need, limit)
  if need > limit then
    return st.w * 1000
  end
  local held = st.held
  for _, l in ipairs(st.ls) do
    held = held - l.n
    if held + need <= limit then
      return clamp0(l.start + st.w - now) * 1000
    end
  end
  return ccLastEnd(st)
end

local function ccFind(st, f)
  for i, l in ipairs(st.ls) do
    if l.f == f then
      return i
    end
  end
  return nil
end

-- ccTake removes up to hits slots of lease i, and the lease once empty.
local function ccTake(st, i, hits)
  local l = st.ls[i]
  local took = math.min(hits, l.n)
  l.n = l.n - took
  st.held = st.held - took
  st.dirty[l.f], st.changed = true, true
  if l.n == 0 then
    table.remove(st.ls, i)
    return true
  end
  return false
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
  local n = hits
  local i = ccFind(st, f)
  if i then
    n = n + st.ls[i].n
    table.remove(st.ls, i)
  end
  st.ls[#st.ls + 1] = {f = f, start = st.t, n = n}
  st.held = st.held + hits
  st.dirty[f], st.changed, st.added = true, true, true
  r.allowed, r.recorded = true, true
  r.remaining = limit - st.held
  r.reset = ccLastEnd(st)
  return r
end

-- refund gives back the holder's slots, or the oldest held by nobody.
function Concurrency.refund(st, hits, _, holder)
  if holder ~= 0 then
    local i = ccFind(st, ccHolderField(holder, 0))
    if i then
      ccTake(st, i, hits)
    end
    return
  end
  local i = 1
  while i <= #st.ls and hits > 0 do
    local l = st.ls[i]
    if string.sub(l.f, 1, 1) == '~' then
      local took = math.min(hits, l.n)
      hits = hits - took
      if not ccTake(st, i, took) then
        i = i + 1
      end
    else
      i = i + 1
    end
  end
end

-- takeBack takes back hits slots recorded by allow at st.t, as
-- window.LeaseCounter's undoAt does.
function Concurrency.takeBack(st, hits, holder)
  local i = ccFind(st, ccHolderField(holder, st.t))
  if i then
    ccTake(st, i, hits)
  end
end

function Concurrency.write(key, st)
  if not st.changed then
    return false
  end
  if #st.ls == 0 then
    redis.call('DEL', key)
    return true
  end
  local live = {}
  for _, l in ipairs(st.ls) do
    live[l.f] = true
    if st.dirty[l.f] then
      redis.call('HSET', key, l.f, field(l.start) .. ' ' .. field(l.n))
    end
  end
  for f in pairs(st.dirty) do
    if not live[f] then
      redis.call('HDEL', key, f)
    end
  end
  redis.call('HSET', key, 'seen', field(st.t))
  redis.call('PEXPIRE', key, math.ceil((st.ls[#st.ls].start + st.w - now) / 1000) + 1)
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

-- undo takes the slots off the lease that field names.
function Concurrency.undo(key, field, hits)
  local v = redis.call('HGET', key, field)
  local s0, n = nil, nil
  if v then
    s0, n = string.match(v, '^(%d+) (%d+)$')
  end
  if s0 and hits > 0 then
    n = tonumber(n) - hits
    if n > 0 then
      redis.call('HSET', key, field, s0 .. ' ' .. string.format('%.0f', n))
    else
      redis.call('HDEL', key, field)
    end
  end
end

ALGS[ALG_CONCURRENCY] = Concurrency

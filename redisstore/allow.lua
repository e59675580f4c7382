-- Check-and-add (or refund) for a batch of counters, atomically, with
-- Redis's clock. Each counter uses one of window's algorithms, with the
-- same answers as the in-memory window.Store:
--
--   0 sliding window (window.Counter): KEYS[i] is the fixed-size string of
--     checkpoint.lua.
--   1 token bucket (window.GCRA): KEYS[i] is a hash with fields "tat" (the
--     theoretical arrival time, ns since the Unix epoch) and "seen" (the
--     newest time written, ns).
--   2 fixed window (window.FixedCounter): KEYS[i] is a hash with one field,
--     the window number floor(now / W), whose value is the hits counted in
--     that window.
--   3 sliding log (window.LogCounter): KEYS[i] is a hash whose fields are
--     the times (microseconds) hits were admitted at, valued with the hits
--     admitted then, plus "seen" (the newest time written, microseconds).
--   4 time buckets (window.BucketCounter): KEYS[i] is a hash whose fields
--     are bucket epochs floor(now / b) and whose values are the hits
--     recorded in that bucket.
--   5 concurrency (window.LeaseCounter): KEYS[i] is a hash of leases (see
--     CC below); the lease length is the window.
--
-- The call answers one or more groups, each the batch of one Store.Do (its
-- requests all-or-nothing), in order, at one instant:
--
-- ARGV[1]  the time in microseconds, or "" to read Redis's TIME (the
--          default: every replica then agrees whatever its own clock says).
-- Then, per group: n (its counters), dry ("1": record nothing, answers
-- only, as if vetoed), and its counters' arguments, KEYS taken in order,
-- packed in one string as struct.pack('<ddddBBB', ...) per counter: bucket
-- length b in microseconds, buckets per window k (the window W is k*b),
-- limit, hits (0: check whether one more hit would fit), veto (1/0),
-- algorithm (0/1/2/3/4/5), flags (1: a refund; 2: charge always, hits are
-- recorded even when they do not fit: window.Request.ChargeAlways, served
-- by the sliding and the fixed window only); for algorithm 5, one more
-- double: the holder (window.HolderID, 0 for nobody).
--
-- Returns 5 integers per counter, groups in order: allowed (0/1), recorded (0/1), remaining,
-- reset in nanoseconds, bucket (sliding window and sliding log: the time in
-- microseconds; time buckets: epoch; fixed: window number; token bucket: 0).
--
-- Within a group, as in window.Store.DoAt: requests that add hits are answered in order,
-- each seeing the earlier ones of the batch; then refunds are applied, in
-- order; if a veto request was refused (or on a dry run), nothing is
-- written and the answers of recorded requests become unrecorded, their
-- hits given back to remaining, except always-charged ones, which are
-- written all the same. A refund is never refused; in a vetoed batch it is
-- answered as a check.
--
-- Numbers are Lua doubles: exact integers up to 2^53. Times are kept in
-- microseconds (Redis's TIME resolution); token bucket arithmetic is in
-- nanoseconds relative to now, and its absolute times are stored as decimal
-- strings.

-- now and KEYS_ are the call's time and keys, set by main: the script runs
-- as EVAL (Go appends "return main(KEYS, ARGV)") or, loaded once, as a
-- Redis function (Go appends its registration), whose helpers are then
-- defined once rather than on every call.
local now, KEYS_

local function clamp0(x)
  if x < 0 then
    return 0
  end
  return x
end

-- field names a bucket or window number (tostring would switch to an
-- exponent beyond 14 digits).
local function field(x)
  return string.format('%.0f', x)
end

------------------------------------------------------------ sliding window
-- window.Counter (the default): checkpoint.lua's fixed-size string.
local CW = {}

function CW.load(key, b, k)
  local st = CP.decode(key, b * k, now)
  st.alg = 0
  st.t = CP.advance(st)
  st.dirty, st.added = false, false
  return st
end

function CW.allow(st, hits, limit, always)
  if st.n == 0 and st.open == 0 then
    st.quota = CP.quotaFor(limit)
  end
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

function CW.refund(st, hits)
  CP.takeBack(st, hits)
  st.dirty = true
end

-- write stores the counter only when its hits changed: the pruning a read
-- does is done again by the next one, and answers do not depend on it.
function CW.write(key, st)
  if not st.dirty then
    return false
  end
  CP.encode(key, st)
  return true
end

------------------------------------------------------------- time buckets
-- window.BucketCounter: a hash of bucket epochs and their counts.
local SW = {}

function SW.load(key, b, k)
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
  return {alg = 4, e = e, b = b, k = k, counts = counts, sum = sum,
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

function SW.allow(st, hits, limit)
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
function SW.refund(st, hits)
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

function SW.write(key, st)
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

-------------------------------------------------------------- token bucket
local TB = {}

function TB.load(key, b, k)
  local v = redis.call('HMGET', key, 'tat', 'seen')
  local seenUs = parseNs(v[2])
  local t = now -- clamp: a clock that steps back stands still
  if seenUs and seenUs > t then
    t = seenUs
  end
  local d = -1 -- tat - t in ns; <= 0 means a full bucket
  local tatUs, tatRem = parseNs(v[1])
  if tatUs then
    d = (tatUs - t) * 1000 + tatRem
  end
  return {alg = 1, t = t, tn = (t - now) * 1000, d = d, w = k * b * 1000,
          exists = v[1] ~= false and v[1] ~= nil, dirty = false, added = false}
end

-- interval is the emission interval: W / limit rounded up (ns).
local function tbInterval(st, limit)
  return idiv(st.w + limit - 1, limit)
end

function TB.allow(st, hits, limit)
  if limit == 0 or hits > limit then
    return {remaining = 0, reset = st.w, bucket = 0}
  end
  local iv = tbInterval(st, limit)
  local tau = limit * iv
  local db = clamp0(st.d) -- base - t
  local n = hits
  if n == 0 then
    n = 1
  end
  local nx = db + n * iv -- next - t
  if nx > tau or hits == 0 then
    local r = {allowed = nx <= tau, remaining = clamp0(idiv(clamp0(tau - db), iv)), bucket = 0}
    if r.allowed then
      r.reset = clamp0(db + st.tn)
    else
      r.reset = clamp0(nx - tau + st.tn)
    end
    return r
  end
  st.d = nx
  st.dirty, st.added = true, true
  return {allowed = true, recorded = true, remaining = idiv(tau - nx, iv),
          reset = clamp0(nx + st.tn), bucket = 0}
end

-- refund returns hits tokens, never filling the bucket beyond full.
function TB.refund(st, hits, limit)
  if hits == 0 or limit == 0 or st.d <= 0 then
    return
  end
  st.d = clamp0(st.d - math.min(hits, limit) * tbInterval(st, limit))
  st.dirty = true
end

function TB.write(key, st)
  if not st.dirty then
    return false
  end
  local d = clamp0(st.d)
  local rem = math.fmod(d, 1000)
  redis.call('HSET', key, 'tat', formatNs(st.t + (d - rem) / 1000, rem), 'seen', formatNs(st.t, 0))
  -- the bucket is full again at tat; kept at least a window, so that an
  -- existing counter keeps answering as one (as in window.Store)
  redis.call('PEXPIRE', key, math.ceil(math.max(d + st.tn, st.w) / 1000000) + 1)
  return true
end

-------------------------------------------------------------- fixed window
local FW = {}

function FW.load(key, b, k)
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
  return {alg = 2, w = w, cur = cur, cnt = cnt, stale = stale,
          exists = #fields > 0, dirty = false, added = false}
end

function FW.allow(st, hits, limit, always)
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

function FW.refund(st, hits)
  if st.cnt > 0 then
    st.cnt = st.cnt - math.min(st.cnt, hits)
    st.dirty = true
  end
end

function FW.write(key, st)
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

--------------------------------------------------------------- sliding log
-- The exact log (window.LogCounter), one field per admission time; a call
-- reads the whole log (at most limit fields).
local LG = {}

function LG.load(key, b, k)
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
  local st = {alg = 3, w = k * b, t = t, cnt = cnt, ts = {}, n = 0,
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

function LG.allow(st, hits, limit)
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
function LG.refund(st, hits)
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

function LG.write(key, st)
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

------------------------------------------------------------- concurrency
-- window.LeaseCounter: a hash with one field per lease, "h<id>" for a
-- holder's (id: window.HolderID) and "~<start>" for slots held by nobody
-- leased at start, valued "<start> <slots>" (start in microseconds), plus
-- "seen" (the newest time written). A lease ends a window after its start.
local CC = {}

function CC.load(key, b, k)
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
  local st = {alg = 5, w = w, t = t, ls = {}, held = 0, exists = #fields > 0, dirty = {},
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

function CC.allow(st, hits, limit, _, holder)
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
function CC.refund(st, hits, _, holder)
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

-- undo takes back hits slots recorded by allow at st.t, as
-- window.LeaseCounter's undoAt does.
function CC.undo(st, hits, holder)
  local i = ccFind(st, ccHolderField(holder, st.t))
  if i then
    ccTake(st, i, hits)
  end
end

function CC.write(key, st)
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

----------------------------------------------------------------- the batch
local algs = {[0] = CW, [1] = TB, [2] = FW, [3] = LG, [4] = SW, [5] = CC}

-- answer is a request's answer on its counter, with window.Store's answers
-- for a key that holds no counter (created only by hits that may fit).
local function answer(q, hits)
  local st, limit = q.st, q.limit
  if not st.exists then
    if hits == 0 then
      return {allowed = limit > 0, remaining = limit, reset = 0, bucket = 0}
    elseif hits > limit and not q.always then
      return {remaining = limit, reset = q.winNs, bucket = 0}
    end
    st.exists = true
    st.created = true
  end
  return q.impl.allow(st, hits, limit, q.always and hits > 0, q.holder)
end

-- runGroup answers one group: its n counters are KEYS[kb+1 .. kb+n], their
-- arguments packed; it appends 5 integers per counter to reply, and returns
-- an error message, or nil.
local function runGroup(kb, packed, n, dry, reply)
  local states = {}
  local reqs = {}
  local pos = 1
  for i = 1, n do
    local b, k, limit, hits, veto, alg, flags
    b, k, limit, hits, veto, alg, flags, pos = struct.unpack('<ddddBBB', packed, pos)
    local impl = algs[alg]
    if impl == nil then
      return 'unknown algorithm ' .. tostring(alg)
    end
    local always = flags >= 2
    if always and alg ~= 0 and alg ~= 2 then
      return 'charge always is served only by the sliding and the fixed window'
    end
    local holder = 0
    if alg == 5 then
      holder, pos = struct.unpack('<d', packed, pos)
    end
    local key = KEYS_[kb + i]
    local st = states[key]
    if st == nil then
      st = impl.load(key, b, k)
      states[key] = st
    end
    reqs[i] = {
      limit = limit, hits = hits, veto = veto == 1, neg = flags % 2 == 1, always = always,
      holder = holder, st = st, impl = impl, winNs = k * b * 1000,
    }
  end

  local vetoed = false
  local out = {}
  for i = 1, n do
    local q = reqs[i]
    if not q.neg then
      local r = answer(q, q.hits)
      out[i] = r
      if q.veto and not r.allowed then
        vetoed = true
      end
      if q.always and r.recorded then
        q.st.keep = true -- written whatever the batch's fate
      end
    end
  end
  for i = 1, n do
    local q = reqs[i]
    if q.neg then
      if vetoed or dry or not q.st.exists then
        out[i] = answer(q, 0)
      else
        q.impl.refund(q.st, q.hits, q.limit, q.holder)
        out[i] = q.impl.allow(q.st, 0, q.limit, false, q.holder)
      end
    end
  end

  if vetoed or dry then
    for i = 1, n do
      local r, q = out[i], reqs[i]
      if r.recorded and not q.always then
        if q.st.alg == 2 and q.st.keep then
          q.st.cnt = q.st.cnt - q.hits
        end
        if q.st.alg == 0 and (not dry or q.st.keep) then
          -- as window.Store does (record, then take back): the open block
          -- keeps the newer stamp, so both backends hold the same state
          CP.takeBack(q.st, q.hits)
          q.st.undone = true
        elseif q.st.alg == 5 and not dry then
          -- likewise: a holder admitted again keeps its newer lease
          CC.undo(q.st, q.hits, q.holder)
          q.st.undone = true
        end
        r.recorded = false
        r.remaining = math.min(r.remaining + q.hits, q.limit)
      end
    end
    -- a counter created by hits that were then taken back stays, empty, as
    -- in window.Store (its answers differ from a missing key's)
    for key, st in pairs(states) do
      if st.keep then
        algs[st.alg].write(key, st)
      end
    end
    if not dry then
      for key, st in pairs(states) do
        if st.undone and not st.keep then
          if st.alg == 0 then
            CP.encode(key, st)
          else
            CC.write(key, st)
          end
        end
        if st.created and st.alg == 1 then
          redis.call('HSET', key, 'tat', formatNs(st.t, 0), 'seen', formatNs(st.t, 0))
          redis.call('PEXPIRE', key, math.ceil(st.w / 1000000) + 1)
        elseif st.created and st.alg == 2 and not st.keep then
          -- (a kept charge was written above: it is not reset to 0)
          st.cnt, st.dirty = 0, true
          FW.write(key, st)
        end
      end
    end
  else
    for key, st in pairs(states) do
      algs[st.alg].write(key, st)
    end
  end

  for i = 1, n do
    local r, a = out[i], #reply
    reply[a + 1] = r.allowed and 1 or 0
    reply[a + 2] = r.recorded and 1 or 0
    reply[a + 3] = r.remaining
    reply[a + 4] = r.reset
    reply[a + 5] = r.bucket
  end
  return nil
end

-- main answers the groups, each on the counters as the groups before it
-- left them: every group loads its counters afresh.
local function main(keys, argv)
  KEYS_, now = keys, nowMicros(argv[1])
  local reply = {}
  local kb = 0
  for p = 2, #argv, 3 do
    local n, dry = tonumber(argv[p]), argv[p + 1] == '1'
    local err = runGroup(kb, argv[p + 2], n, dry, reply)
    if err then
      return redis.error_reply(err)
    end
    kb = kb + n
  end
  return reply
end

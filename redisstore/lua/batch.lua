-- allow: check-and-add (or refund) for a batch of counters, atomically,
-- with Redis's clock; undo: take back hits an earlier allow recorded. Each
-- counter uses one of window's algorithms (its own file, its table in
-- ALGS), with the same answers as the in-memory window.Store. The key
-- layouts, by algorithm number (ALG_* in common.lua's prelude):
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
-- algorithm (its ALG_* number), flags (1: a refund; 2: charge always, hits are
-- recorded even when they do not fit: window.Request.ChargeAlways, served
-- by the algorithms in CHARGEABLE only; 4: a reservation, see below); for an algorithm in
-- HOLDS (concurrency), one more double: the holder (window.HolderID, 0 for nobody).
--
-- A reservation (sliding window only: SlidingWindow.reserve) has six more
-- doubles: the replica's holder number, the hits it spent of the block it
-- holds (-1: none held), the hits it wants, the validity, the grace and
-- how long ago the newest hit spent was (us). Its answer's allowed is its
-- status (0: a new block, 1: renewed, 2: cut, to be given back), recorded
-- the hits the block holds (0: none), bucket the grant's time; it is never
-- refused in the veto sense, and its group holds nothing else.
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
    local impl = ALGS[alg]
    if impl == nil then
      return 'unknown algorithm ' .. tostring(alg)
    end
    local always = flags % 4 >= 2
    if always and not CHARGEABLE[alg] then
      return 'charge always is not served by algorithm ' .. tostring(alg)
    end
    local holder = 0
    if HOLDS[alg] then
      holder, pos = struct.unpack('<d', packed, pos)
    end
    local reserve
    if flags >= 4 then
      if impl.reserve == nil then
        return 'reservations are not served by algorithm ' .. tostring(alg)
      end
      reserve = {}
      reserve.holder, reserve.used, reserve.want, reserve.validity, reserve.grace, reserve.age, pos =
        struct.unpack('<dddddd', packed, pos)
    end
    local key = KEYS_[kb + i]
    local st = states[key]
    if st == nil then
      st = impl.load(key, b, k)
      states[key] = st
    end
    reqs[i] = {
      limit = limit, hits = hits, veto = veto == 1, neg = flags % 2 == 1, always = always,
      holder = holder, st = st, impl = impl, winNs = k * b * 1000, reserve = reserve,
    }
  end

  local vetoed = false
  local out = {}
  for i = 1, n do
    local q = reqs[i]
    if q.reserve then
      local v = q.reserve
      out[i] = q.impl.reserve(q.st, q.limit, v.holder, v.used, v.want, v.validity, v.grace, v.age)
    elseif not q.neg then
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
        q.impl.rollback(q.st, q, dry)
        r.recorded = false
        r.remaining = math.min(r.remaining + q.hits, q.limit)
      end
    end
    -- a counter created by hits that were then taken back stays, empty, as
    -- in window.Store (its answers differ from a missing key's)
    for key, st in pairs(states) do
      if st.keep then
        ALGS[st.alg].write(key, st)
      end
    end
    if not dry then
      for key, st in pairs(states) do
        ALGS[st.alg].settle(key, st)
      end
    end
  else
    for key, st in pairs(states) do
      ALGS[st.alg].write(key, st)
    end
  end

  for i = 1, n do
    local r, a = out[i], #reply
    if type(r.allowed) == 'number' then
      reply[a + 1] = r.allowed -- a reservation's status
    else
      reply[a + 1] = r.allowed and 1 or 0
    end
    if type(r.recorded) == 'number' then
      reply[a + 2] = r.recorded -- a reservation's grant
    else
      reply[a + 2] = r.recorded and 1 or 0
    end
    reply[a + 3] = r.remaining
    reply[a + 4] = r.reset
    reply[a + 5] = r.bucket
  end
  return nil
end

-- allow answers the groups, each on the counters as the groups before it
-- left them: every group loads its counters afresh.
local function allow(keys, argv)
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

-- undo takes back hits recorded by allow, never below zero, as
-- window.Store's Undo does, each counter by its algorithm's undo:
--
-- ARGV[1]  the time in microseconds, or "" to read Redis's TIME.
-- KEYS[i]  counter i
-- ARGV[2+6*(i-1) .. 7+6*(i-1)], for counter i: algorithm (its ALG_*
--          number), the bucket the hits were recorded in (Result.Bucket;
--          for concurrency, the field of their lease), the hits, the
--          limit, bucket length in microseconds, buckets per window.
local function undo(keys, argv)
  KEYS_, now = keys, nowMicros(argv[1])
  for i = 1, #keys do
    local a = 2 + 6 * (i - 1)
    local impl = ALGS[tonumber(argv[a])]
    if impl == nil then
      return redis.error_reply('unknown algorithm ' .. tostring(argv[a]))
    end
    impl.undo(keys[i], argv[a + 1], tonumber(argv[a + 2]), tonumber(argv[a + 3]),
      tonumber(argv[a + 4]), tonumber(argv[a + 5]))
  end
  return 0
end

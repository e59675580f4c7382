-- The token bucket (algorithm token_bucket of window's table; the Go side
-- prepends this file, after common.lua and checkpoint.lua, to the scripts).
-- Its table has load/allow/refund/write for a batch (batch.lua), rollback and
-- settle for a vetoed one, and undo for Limiter.Undo.
local TokenBucket = {}

function TokenBucket.load(key, b, k)
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
  return {alg = ALG_TOKEN_BUCKET, t = t, tn = (t - now) * 1000, d = d, w = k * b * 1000,
          exists = v[1] ~= false and v[1] ~= nil, dirty = false, added = false}
end

-- interval is the emission interval: W / limit rounded up (ns).
local function tbInterval(st, limit)
  return idiv(st.w + limit - 1, limit)
end

function TokenBucket.allow(st, hits, limit)
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
function TokenBucket.refund(st, hits, limit)
  if hits == 0 or limit == 0 or st.d <= 0 then
    return
  end
  st.d = clamp0(st.d - math.min(hits, limit) * tbInterval(st, limit))
  st.dirty = true
end

function TokenBucket.write(key, st)
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

-- rollback: a vetoed batch writes nothing of a token bucket's hits.
function TokenBucket.rollback() end

-- settle keeps a bucket created by the vetoed batch, full (as window.Store
-- keeps the counter it created).
function TokenBucket.settle(key, st)
  if st.created then
    redis.call('HSET', key, 'tat', formatNs(st.t, 0), 'seen', formatNs(st.t, 0))
    redis.call('PEXPIRE', key, math.ceil(st.w / 1000000) + 1)
  end
end

-- undo moves the TAT back by the hits' emission intervals, never before
-- now (a bucket never fills beyond full).
function TokenBucket.undo(key, _, hits, limit, b, k)
  local v = redis.call('HMGET', key, 'tat', 'seen')
  local tatUs, tatRem = parseNs(v[1])
  local seenUs = parseNs(v[2])
  if tatUs and hits > 0 and limit > 0 then
    local t = now
    if seenUs and seenUs > t then
      t = seenUs
    end
    local d = (tatUs - t) * 1000 + tatRem -- tat - t, ns
    if d > 0 then
      d = d - math.min(hits, limit) * tbInterval({w = k * b * 1000}, limit)
      if d < 0 then
        d = 0
      end
      local rem = math.fmod(d, 1000)
      redis.call('HSET', key, 'tat', formatNs(t + (d - rem) / 1000, rem), 'seen', formatNs(t, 0))
    end
  end
end

ALGS[ALG_TOKEN_BUCKET] = TokenBucket

-- Takes back hits recorded by allow.lua, never below zero, as window.Store's
-- Undo does for each algorithm (see allow.lua for the key layouts).
--
-- ARGV[1]  the time in microseconds, or "" to read Redis's TIME.
-- KEYS[i]  counter i
-- ARGV[2+6*(i-1) .. 7+6*(i-1)], for counter i: algorithm (0 sliding
--          window, 1 token bucket, 2 fixed window, 3 sliding log, 4 time
--          buckets, 5 concurrency), the bucket the hits were recorded in
--          (Result.Bucket; for concurrency, the field of their lease),
--          the hits, the limit, bucket length in microseconds, buckets per
--          window.
--
-- Sliding window: the newest hits are taken back, unless the hits were
-- recorded a window or more before the newest time written (they have left
-- already), as window.Counter.UndoAt does. Time buckets: the hits come off
-- the bucket they were recorded in; a bucket that already left the window
-- (pruned or expired) holds nothing to take back. Token bucket: the TAT moves back by the hits' emission
-- intervals, never before now (a bucket never fills beyond full). Fixed
-- window: the hits come off the window they were recorded in, if it is
-- still the newest. Sliding log: up to the hits come off the entries stamped
-- with the time they were recorded at.

local now = nowMicros(ARGV[1])

for i = 1, #KEYS do
  local a = 2 + 6 * (i - 1)
  local key, alg, field = KEYS[i], ARGV[a], ARGV[a + 1]
  local hits, limit = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local b, k = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  if alg == '0' then
    local st = CP.decode(key, b * k, now)
    if st.exists and st.newest - tonumber(field) < st.w and hits > 0 then
      CP.takeBack(st, hits)
      CP.encode(key, st)
    end
  elseif alg == '5' then
    -- field names the lease (allow.lua's CC): its slots come off it
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
  elseif alg == '4' then
    local c = tonumber(redis.call('HGET', key, field))
    if c then
      if c > hits then
        redis.call('HINCRBY', key, field, -hits)
      else
        redis.call('HDEL', key, field)
      end
    end
  elseif alg == '1' then
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
        local w = k * b * 1000
        local iv = idiv(w + limit - 1, limit)
        d = d - math.min(hits, limit) * iv
        if d < 0 then
          d = 0
        end
        local rem = math.fmod(d, 1000)
        redis.call('HSET', key, 'tat', formatNs(t + (d - rem) / 1000, rem), 'seen', formatNs(t, 0))
      end
    end
  elseif alg == '2' then
    -- only while the window recorded in is the newest one
    local w = k * b
    local cur = idiv(now, w)
    local fields = redis.call('HGETALL', key)
    for j = 1, #fields, 2 do
      local f = tonumber(fields[j])
      if f and f > cur then
        cur = f
      end
    end
    if tonumber(field) == cur then
      local c = tonumber(redis.call('HGET', key, field))
      if c and c > 0 then
        redis.call('HINCRBY', key, field, -math.min(c, hits))
      end
    end
  elseif alg == '3' then
    -- the entries stamped at the time the hits were recorded at
    local c = tonumber(redis.call('HGET', key, field))
    if c then
      if c > hits then
        redis.call('HINCRBY', key, field, -hits)
      else
        redis.call('HDEL', key, field)
      end
    end
  else
    return redis.error_reply('unknown algorithm ' .. tostring(alg))
  end
end
return 0

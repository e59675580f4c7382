-- Helpers shared by allow.lua and undo.lua: the Go side prepends this file
-- to each of them (see store.go), so both scripts read time and encode
-- nanosecond values the same way.

-- (A function library, LIBRARY, always replicates effects, and may not
-- even look the field up.)
if not LIBRARY and redis.replicate_commands then
  pcall(redis.replicate_commands) -- effects replication (a no-op from Redis 7)
end

-- nowMicros returns arg as microseconds, or Redis's TIME when arg is ''.
local function nowMicros(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end

-- idiv is floor(a / c) for a >= 0, c > 0, exact.
local function idiv(a, c)
  return (a - math.fmod(a, c)) / c
end

-- ns strings <-> (microseconds, nanosecond remainder)
local function parseNs(s)
  if s == nil or s == false then
    return nil
  end
  if #s <= 3 then
    return 0, tonumber(s)
  end
  return tonumber(string.sub(s, 1, -4)), tonumber(string.sub(s, -3))
end

local function formatNs(us, rem)
  if us == 0 then
    return string.format('%d', rem)
  end
  return string.format('%.0f%03d', us, rem)
end


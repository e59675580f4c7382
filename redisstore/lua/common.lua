-- Helpers shared by every algorithm's file and batch.lua: the Go side
-- (scripts.go) prepends its constants, then this file, checkpoint.lua, one
-- file per algorithm and batch.lua, so that every script and function reads
-- time and encodes nanosecond values the same way.

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


-- now and KEYS_ are the call's time and keys, set by allow and undo
-- (batch.lua): a script runs as EVAL (Go appends "return allow(KEYS, ARGV)"
-- or the same for undo) or, loaded once, as a Redis function (Go appends
-- their registration), whose helpers are then defined once rather than on
-- every call.
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

-- undoField takes up to hits off the count in field of the hash at key,
-- deleting the field when nothing is left (time buckets, sliding log).
local function undoField(key, field, hits)
  local c = tonumber(redis.call('HGET', key, field))
  if c then
    if c > hits then
      redis.call('HINCRBY', key, field, -hits)
    else
      redis.call('HDEL', key, field)
    end
  end
end

-- ALGS is every algorithm's table by its number (ALG_* above), each
-- registered by its own file.
local ALGS = {}

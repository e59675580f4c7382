-- Takes back hits recorded by allow.lua, never below zero.
--
-- KEYS[i]        counter i (a hash of bucket epoch -> hits)
-- ARGV[2*i-1]    the bucket epoch the hits were recorded in
-- ARGV[2*i]      the hits to take back
--
-- A bucket that already left the window (and was pruned or expired) holds
-- nothing to take back.
for i = 1, #KEYS do
  local key, field, hits = KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local c = tonumber(redis.call('HGET', key, field))
  if c then
    if c > hits then
      redis.call('HINCRBY', key, field, -hits)
    else
      redis.call('HDEL', key, field)
    end
  end
end
return 0

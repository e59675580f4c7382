-- The RLQS ledger: one hash per limit (KEYS[1]), one field per replica
-- holding its claim as "expiry fixed committed d1 w1 d2 w2 ...". One call
-- records this replica's claim, forgets the claims of replicas that did not
-- renew theirs in time, divides the limit max-min fairly over every claim's
-- weighted demand points, and grants this replica as much of a raise as
-- the limit leaves once every replica's committed cost is counted; the
-- grant is recorded as committed at once, so that no other replica can be
-- granted the same capacity. A claim with no demand and nothing fixed,
-- committed or wanted withdraws the replica's claim.
--
-- ARGV: replica, hold_ms, limit, reserve, fixed, committed, want,
-- min_burst, burst_share, then demand and weight pairs.
-- Returns {level ('inf' when every demand fits), spare, grant, replicas}.
local key, me = KEYS[1], ARGV[1]
local hold = tonumber(ARGV[2])
local limit, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local fixed, committed, want = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local min_burst, burst_share = tonumber(ARGV[8]), tonumber(ARGV[9])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local demands, weights = {}, {}
local total_fixed, others_committed, replicas = fixed, 0, 1
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local f = fields[i]
  if f ~= me then
    local parts = {}
    for p in string.gmatch(fields[i + 1], '%S+') do parts[#parts + 1] = tonumber(p) end
    if parts[1] < now then
      redis.call('HDEL', key, f)
    else
      replicas = replicas + 1
      total_fixed = total_fixed + parts[2]
      others_committed = others_committed + parts[3]
      for j = 4, #parts, 2 do
        demands[#demands + 1] = parts[j]
        weights[#weights + 1] = parts[j + 1]
      end
    end
  end
end
local mine = {}
for i = 10, #ARGV, 2 do
  demands[#demands + 1] = tonumber(ARGV[i])
  weights[#weights + 1] = tonumber(ARGV[i + 1])
  mine[#mine + 1] = ARGV[i]
  mine[#mine + 1] = ARGV[i + 1]
end
local total_weight = 0
local order = {}
for j = 1, #weights do
  total_weight = total_weight + weights[j]
  order[j] = j
end
table.sort(order, function(a, b) return demands[a] < demands[b] end)

-- fill divides capacity: the level (nil when every demand fits) and the
-- spare each claim gets on top.
local function fill(capacity)
  local left, w = math.max(capacity, 0), total_weight
  for _, j in ipairs(order) do
    if w <= 0 then break end
    local fair = left / w
    if demands[j] > fair then return fair, 0 end
    left = left - math.max(demands[j], 0) * weights[j]
    w = w - weights[j]
  end
  if total_weight <= 0 then return nil, 0 end
  return nil, left / total_weight
end

local capacity = limit - reserve - total_fixed - min_burst * total_weight
local level, spare = fill(capacity)
local extra = 0
for j = 1, #demands do
  local share = demands[j]
  if level and level < share then share = level end
  extra = extra + weights[j] * math.max(0, math.floor(burst_share * (share + spare)) - min_burst)
end
if extra > 0 then level, spare = fill(capacity - extra) end

local room = limit - reserve - total_fixed - others_committed - committed
local grant = math.max(0, math.min(want, room))
if #mine == 0 and fixed == 0 and committed == 0 and want == 0 then
  -- a withdrawal: this replica no longer serves the limit
  redis.call('HDEL', key, me)
  replicas = replicas - 1
else
  local entry = {string.format('%d', now + hold), ARGV[5], string.format('%.17g', committed + grant)}
  for _, v in ipairs(mine) do entry[#entry + 1] = v end
  redis.call('HSET', key, me, table.concat(entry, ' '))
  redis.call('PEXPIRE', key, hold)
end
local lv = 'inf'
if level then lv = string.format('%.17g', level) end
return {lv, string.format('%.17g', spare), string.format('%.17g', grant), replicas}

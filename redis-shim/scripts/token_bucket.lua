-- token_bucket.lua: every token-bucket check of one HTTP request, all or nothing.
--
-- Contract: each key is a bucket of capacity `limit` refilled continuously at
-- `limit / period`; a request of cost c passes when every bucket holds c tokens, and
-- then (and only then) every bucket is charged. Over any interval of length t a key
-- admits at most limit + limit * t / period tokens.
--
-- State per key: one number, as GCRA keeps it: the theoretical arrival time (TAT, in
-- microseconds of Redis time) at which the bucket is full again. tokens(now) =
-- (period - (TAT - now)) / interval, with interval = period / limit. The key expires
-- exactly when the bucket is full, so idle clients cost no memory.
--
-- KEYS[i]        counter key of check i
-- ARGV[3i-2]     limit of check i (tokens)
-- ARGV[3i-1]     period of check i (microseconds)
-- ARGV[3i]       cost of check i (tokens)
-- Reply: one {allowed, remaining, reset_ms, retry_after_ms, granted} per key, in KEYS
-- order; `allowed` is 1 when that bucket alone would admit the request, `granted` the
-- tokens charged to it.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
-- Float rounding must never turn 3.9999999 tokens into 3 remaining.
local epsilon = 1e-6

local buckets = {}
local every_bucket_admits = true
for i = 1, #KEYS do
  local limit = tonumber(ARGV[3 * i - 2])
  local period = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local interval = period / limit
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local new_tat = tat + cost * interval
  local allow_at = new_tat - period
  buckets[i] = {period = period, interval = interval, tat = tat, new_tat = new_tat, allow_at = allow_at}
  if allow_at > now then every_bucket_admits = false end
end

local results = {}
for i = 1, #KEYS do
  local b = buckets[i]
  local admits = b.allow_at <= now
  -- Nothing is charged unless every bucket admits; an uncharged bucket reports its
  -- state as it was.
  local tat = b.tat
  if every_bucket_admits then
    tat = math.ceil(b.new_tat)
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  end
  local granted = 0
  if every_bucket_admits then granted = tonumber(ARGV[3 * i]) end
  local retry_after_ms = 0
  if not admits then retry_after_ms = math.ceil((b.allow_at - now) / 1000) end
  results[i] = {
    admits and 1 or 0,
    math.floor((b.period - (tat - now)) / b.interval + epsilon),
    math.ceil((tat - now) / 1000),
    retry_after_ms,
    granted,
  }
end
return results

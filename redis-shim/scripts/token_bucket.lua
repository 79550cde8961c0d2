-- token_bucket.lua: the token bucket, kept as GCRA (the generic cell rate algorithm).
--
-- Contract: a key is a bucket of capacity `limit` refilled continuously at
-- `limit / period`. Over any interval of length t a key admits at most
-- limit + limit * t / period tokens: a full bucket's burst, then the refill rate.
--
-- State per key: one number, the theoretical arrival time (TAT, microseconds of Redis
-- time) at which the bucket is full again, as a string. tokens(now) =
-- (period - (TAT - now)) / interval, with interval = period / limit. The key expires
-- exactly when the bucket is full again. A refund moves the TAT back by the refunded
-- tokens' intervals: exact, up to a microsecond of rounding.

algorithms.token_bucket = {}
local token_bucket = algorithms.token_bucket

function token_bucket.load(key, c, now)
  local tat = tonumber(redis.call('GET', key)) or now
  -- A TAT in the past is a full bucket: idle time earns no credit beyond capacity.
  if tat < now then tat = now end
  return {tat = tat}
end

function token_bucket.available(c, st, now)
  local tokens = math.floor((c.period - (st.tat - now)) / c.interval + EPSILON)
  if tokens < 0 then return 0 end
  return tokens
end

function token_bucket.charge(key, c, st, amount, now)
  st.tat = math.ceil(st.tat + amount * c.interval)
  -- At extreme rates (over ~4 tokens per microsecond) a charge is below the precision
  -- of the time itself and the TAT does not move; Redis refuses PX 0.
  redis.call('SET', key, st.tat, 'PX', math.max(1, ms_ceil(st.tat - now)))
  return 0
end

function token_bucket.report(c, st, now)
  return token_bucket.available(c, st, now), ms_ceil(st.tat - now)
end

function token_bucket.retry_after(c, st, now)
  return ms_ceil(st.tat + c.cost * c.interval - c.period - now)
end

function token_bucket.refund(key, c, amount, stamp, now)
  local tat = tonumber(redis.call('GET', key))
  if not tat then return end
  tat = tat - amount * c.interval
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(tat), 'PX', int(ms_ceil(tat - now)))
  end
end

-- In debt the TAT lies more than a period ahead; at most MAX_DEBT_LIMITS periods more.
function token_bucket.debt_room(c, st, now)
  local latest = now + (1 + MAX_DEBT_LIMITS) * c.period
  return math.max(0, math.floor((latest - st.tat) / c.interval + EPSILON))
end

-- A bucket has no windows: a leased token spent later only moves its admission in
-- time, within the lease's ttl.
function token_bucket.lease_window(c, st, now)
  return 0
end

-- sliding_window_log.lua: one log entry per admitted token.
--
-- Contract: at most `limit` tokens in any trailing period of Redis time, exactly. A
-- token taken at t counts during [t, t + period).
--
-- State per key: a sorted set with one member per token taken in the last period,
-- scored by its time (microseconds), so up to `limit` members (the shim caps the limit
-- of this algorithm at MAX_LOG_LIMIT for that reason). Entries older than the period
-- are trimmed when the key is charged; the key expires one period after its newest
-- entry. A refund removes `amount` entries carrying the charge's timestamp: exact, as
-- entries with equal timestamps are interchangeable.

algorithms.sliding_window_log = {}
local sliding_window_log = algorithms.sliding_window_log

-- The last string made by each of the two functions below, by the number it was made
-- of: the checks of one call share `now` and mostly their period, so one is formatted
-- per call, not per check.
local floor_of, floor_string, score_of, score_string

-- The exclusive lower bound of the trailing window, as a score range bound.
local function window_floor(c, now)
  local bound = now - c.period
  if bound ~= floor_of then floor_of, floor_string = bound, '(' .. int(bound) end
  return floor_string
end

-- `now` as a score and the first part of a member.
local function score(now)
  if now ~= score_of then score_of, score_string = now, int(now) end
  return score_string
end

function sliding_window_log.load(key, c, now)
  return {key = key, used = redis.call('ZCOUNT', key, window_floor(c, now), '+inf')}
end

function sliding_window_log.available(c, st, now)
  local tokens = c.limit - st.used
  if tokens < 0 then return 0 end
  return tokens
end

function sliding_window_log.charge(key, c, st, amount, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - c.period)
  -- Members must be unique: a member already present (same microsecond, after a
  -- refund) would be re-scored instead of added, losing a token.
  local seq, at = st.used, score(now)
  for _ = 1, amount do
    repeat
      seq = seq + 1
    until redis.call('ZADD', key, 'NX', at, at .. '-' .. seq) == 1
  end
  redis.call('PEXPIRE', key, c.period_ms)
  st.used = st.used + amount
  -- Redis time does not go back: the entries just added are the newest.
  st.newest = now
  return now
end

function sliding_window_log.report(c, st, now)
  local reset_ms = 0
  local newest = st.newest
  if not newest and st.used > 0 then
    newest = tonumber(redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')[2])
  end
  if newest then reset_ms = ms_ceil(newest + c.period - now) end
  return sliding_window_log.available(c, st, now), reset_ms
end

function sliding_window_log.retry_after(c, st, now)
  -- The request fits once the oldest (used - (limit - cost)) entries have left the
  -- window: wait for the last of those.
  local must_leave = st.used - (c.limit - c.cost)
  local entry = redis.call('ZRANGEBYSCORE', st.key, window_floor(c, now), '+inf',
    'WITHSCORES', 'LIMIT', must_leave - 1, 1)
  return ms_ceil(tonumber(entry[2]) + c.period - now)
end

function sliding_window_log.refund(key, c, amount, stamp, now)
  local members = redis.call('ZRANGEBYSCORE', key, int(stamp), int(stamp), 'LIMIT', 0, amount)
  for _, member in ipairs(members) do
    redis.call('ZREM', key, member)
  end
end

-- A leased token leaves the log one period after it was charged: spent later, it would
-- no longer count against the requests it is admitted among.
function sliding_window_log.lease_window(c, st, now)
  return c.period_ms
end

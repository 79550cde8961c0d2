-- sliding_window_counter.lua: two fixed-window counters, the previous one weighted.
--
-- Contract: admits while previous * (1 - elapsed / period) + current + cost <= limit,
-- where `current` counts the aligned window holding now, `previous` the one before it
-- and `elapsed` the time since the current window began. It approximates the sliding
-- log (it assumes the previous window's tokens were spread evenly): at most `limit` in
-- any trailing period when traffic is even, and never more than 2 * limit; a burst at
-- the end of one window and the start of the next passes about `limit` plus the
-- elapsed fraction of it.
--
-- State per key: a hash {w = start of the current window (ms), c = current count,
-- p = previous count}, expiring two periods after `w`. A refund decrements whichever
-- counter the charge went to, while it still counts: exact.

algorithms.sliding_window_counter = {}
local sliding_window_counter = algorithms.sliding_window_counter

function sliding_window_counter.load(key, c, now)
  local start = window_start_ms(now, c.period_ms)
  local stored = redis.call('HMGET', key, 'w', 'c', 'p')
  local stored_start = tonumber(stored[1])
  local current, previous = 0, 0
  if stored_start == start then
    current = tonumber(stored[2]) or 0
    previous = tonumber(stored[3]) or 0
  elseif stored_start == start - c.period_ms then
    previous = tonumber(stored[2]) or 0
  end
  local weight = 1 - (now - start * 1000) / c.period
  return {start = start, current = current, previous = previous, weight = weight}
end

function sliding_window_counter.available(c, st, now)
  local tokens = math.floor(c.limit - st.previous * st.weight - st.current + EPSILON)
  if tokens < 0 then return 0 end
  return tokens
end

function sliding_window_counter.charge(key, c, st, amount, now)
  st.current = st.current + amount
  redis.call('HSET', key, 'w', st.start, 'c', st.current, 'p', st.previous)
  redis.call('PEXPIREAT', key, st.start + 2 * c.period_ms)
  return st.start
end

function sliding_window_counter.report(c, st, now)
  local reset_ms = 0
  if st.current > 0 then
    reset_ms = ms_ceil((st.start + 2 * c.period_ms) * 1000 - now)
  elseif st.previous > 0 then
    reset_ms = ms_ceil((st.start + c.period_ms) * 1000 - now)
  end
  return sliding_window_counter.available(c, st, now), reset_ms
end

function sliding_window_counter.retry_after(c, st, now)
  local window_us = st.start * 1000
  -- Within this window, once the previous count's weight has fallen far enough.
  local room = c.limit - c.cost - st.current
  if room >= 0 and st.previous > 0 then
    return ms_ceil(window_us + c.period * (1 - room / st.previous) - now)
  end
  -- Otherwise in the next window, where today's count becomes the weighted one.
  local room_next = c.limit - c.cost
  local elapsed = 0
  if st.current > room_next then elapsed = c.period * (1 - room_next / st.current) end
  return ms_ceil(window_us + c.period + elapsed - now)
end

function sliding_window_counter.refund(key, c, amount, stamp, now)
  local stored = redis.call('HMGET', key, 'w', 'c', 'p')
  local stored_start = tonumber(stored[1])
  local field
  if stored_start == stamp then
    field = 'c'
  elseif stored_start == stamp + c.period_ms then
    field = 'p'
  else
    return
  end
  local count = (tonumber(stored[field == 'c' and 2 or 3]) or 0) - amount
  if count < 0 then count = 0 end
  redis.call('HSET', key, field, int(count))
end

-- In debt the current window counts past the limit; at most MAX_DEBT_LIMITS limits past.
function sliding_window_counter.debt_room(c, st, now)
  return math.max(0, (1 + MAX_DEBT_LIMITS) * c.limit - st.current)
end

-- Tokens charged to the current window are spent in it, or not at all.
function sliding_window_counter.lease_window(c, st, now)
  return ms_ceil((st.start + c.period_ms) * 1000 - now)
end

-- fixed_window.lua: a counter per aligned window.
--
-- Contract: at most `limit` tokens per window [k * period, (k + 1) * period) of Redis
-- time (milliseconds since the Unix epoch), or, for a check with a calendar
-- (`c.calendar`, see calendar.lua), per calendar window [start, finish): a day, week or
-- month at a fixed UTC offset. Windows are fixed, not sliding: `limit` at the end of one
-- window and `limit` at the start of the next pass, 2 * limit within a moment. reset_ms,
-- retry_after_ms and the lease window all end exactly at the window's end.
--
-- State per key: a hash {w = start of the window counted (ms), n = tokens taken in it},
-- expiring at the end of that window. A count from an older window reads as 0 even
-- before the key expires. A refund decrements `n` if the charged window is still the
-- stored one: exact (a charge in a window that has ended needs no refund).

algorithms.fixed_window = {}
local fixed_window = algorithms.fixed_window

-- The window holding `now`: [start, finish) in ms.
local function fixed_window_bounds(c, now)
  if c.calendar then return calendar_window(c.calendar, math.floor(now / 1000)) end
  local start = window_start_ms(now, c.period_ms)
  return start, start + c.period_ms
end

function fixed_window.load(key, c, now)
  local start, finish = fixed_window_bounds(c, now)
  local stored = redis.call('HMGET', key, 'w', 'n')
  local used = 0
  if tonumber(stored[1]) == start then used = tonumber(stored[2]) or 0 end
  return {start = start, finish = finish, used = used}
end

function fixed_window.available(c, st, now)
  local tokens = c.limit - st.used
  if tokens < 0 then return 0 end
  return tokens
end

function fixed_window.charge(key, c, st, amount, now)
  st.used = st.used + amount
  redis.call('HSET', key, 'w', st.start, 'n', st.used)
  redis.call('PEXPIREAT', key, st.finish)
  return st.start
end

local function until_window_end(c, st, now)
  return ms_ceil(st.finish * 1000 - now)
end

function fixed_window.report(c, st, now)
  local reset_ms = 0
  if st.used > 0 then reset_ms = until_window_end(c, st, now) end
  return fixed_window.available(c, st, now), reset_ms
end

function fixed_window.retry_after(c, st, now)
  -- cost <= limit, so the next window always admits.
  return until_window_end(c, st, now)
end

function fixed_window.refund(key, c, amount, stamp, now)
  local stored = redis.call('HMGET', key, 'w', 'n')
  -- Without `n`, not this algorithm's counter (a replicated one's): nothing to give back.
  if tonumber(stored[1]) ~= stamp or not stored[2] then return end
  local used = (tonumber(stored[2]) or 0) - amount
  if used <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'n', int(used))
  end
end

-- In debt the window counts past its limit; at most MAX_DEBT_LIMITS limits past it.
function fixed_window.debt_room(c, st, now)
  return math.max(0, (1 + MAX_DEBT_LIMITS) * c.limit - st.used)
end

-- Tokens charged to this window are spent in it, or not at all.
function fixed_window.lease_window(c, st, now)
  return until_window_end(c, st, now)
end

-- common.lua: the prelude of the shim's function library (redis-shim/src/store/scripts.rs puts it
-- first, then calendar.lua, one file per algorithm and request.lua, then registers each
-- driver, check.lua, check_batch.lua and refund.lua, as a function reading KEYS and ARGV).
--
-- Each algorithm file adds one table to `algorithms`, keyed by the wire name of the
-- algorithm, with the same seven functions; `c` is one check's parameters, parsed once
-- per Redis by request.lua's params and shared by every check naming them (never
-- written: limit, period_ms, period and interval = period / limit in microseconds,
-- cost, lease, shadow, and calendar: see calendar.lua, nil for none), and `now` the
-- Redis time in microseconds, read once per call by the driver so every check sees the
-- same instant. `st` is one key's state, a small table of the algorithm's own:
--   load(key, c, now)                 -> st     reads the key, writes nothing
--   available(c, st, now)             -> whole tokens the key admits now (>= 0)
--   charge(key, c, st, amount, now)   -> stamp  takes `amount` tokens, updates st
--   report(c, st, now)                -> remaining, reset_ms
--   retry_after(c, st, now)           -> ms until `c.cost` tokens are available
--   refund(key, c, amount, stamp, now)          gives back a charge (see refund.lua)
--   lease_window(c, st, now)          -> ms a lease charged now may be spent (0: any)
-- and, for the algorithms a response's reported cost can settle (refund.lua):
--   debt_room(c, st, now)             -> tokens that may still be charged before the
--                                        key's debt passes MAX_DEBT_LIMITS limits
-- `stamp` identifies where a charge went (a window, an instant) so a refund can find it.
-- Every key written gets an expiry: an idle client costs no memory.

local algorithms = {}

-- Float rounding must never turn 3.9999999 tokens into 3.
local EPSILON = 1e-6

-- Deepest debt of one key, in limits, however many settlements charge it (the wire
-- crate's MAX_DEBT_LIMITS; redis-shim/src/store/scripts.rs checks that they agree).
local MAX_DEBT_LIMITS = 100

-- A whole Lua number below 1e17 (every time, count and duration here) goes to Redis as
-- an argument of redis.call written as a plain integer (Redis writes it with %.17g, or
-- as an integer); Lua's own conversion to a string, in a concatenation, may use an
-- exponent. Strings that carry numbers are built with int(), which rounds.
local function int(x)
  return string.format('%.0f', x)
end

-- Microseconds to whole milliseconds, rounded up, never negative.
local function ms_ceil(us)
  local ms = math.ceil(us / 1000)
  if ms < 0 then return 0 end
  return ms
end

local function redis_now_us()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end

-- The start (ms of Redis time) of the window of length period_ms that holds `now`,
-- windows being aligned to multiples of period_ms since the Unix epoch.
local function window_start_ms(now, period_ms)
  local now_ms = math.floor(now / 1000)
  return now_ms - (now_ms % period_ms)
end

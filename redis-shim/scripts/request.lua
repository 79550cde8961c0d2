-- request.lua: the checks of one request, all or nothing, and their parameters; what check.lua and check_batch.lua run for each request (their contract is in
-- check.lua).
--
-- Each check's parameters (algorithm, limit, period, cost, lease, shadow, calendar)
-- come as one ARGV value, parsed once and kept with what its algorithm derives from
-- them: the checks of one rule for many clients share one value, so a check costs a
-- table lookup, not a parse.

-- One parameter set from its seven values, or an error message.
local function check_params(name, limit, period_ms, cost, lease, shadow, calendar_arg)
  local algorithm = algorithms[name]
  if not algorithm then return 'unknown algorithm ' .. tostring(name) end
  local calendar, calendar_error = parse_calendar(calendar_arg)
  if calendar_error then return calendar_error end
  limit, period_ms = tonumber(limit), tonumber(period_ms)
  return {
    algorithm = algorithm, name = name, limit = limit, period_ms = period_ms,
    period = period_ms * 1000, interval = period_ms * 1000 / limit,
    cost = tonumber(cost), lease = tonumber(lease), shadow = shadow == '1', calendar = calendar,
  }
end

-- Parsed parameter sets by their ARGV value, kept across calls (they hold nothing but
-- what the value says); emptied when it reaches PARAMS_CACHE_SIZE, so a shim that
-- sends ever new limits cannot grow it without bound.
local params_cache, params_cached = {}, 0
local PARAMS_CACHE_SIZE = 1000

-- One check's parameter set from its ARGV value, `<algorithm> <limit> <period_ms> <cost>
-- <lease> <shadow> <calendar>` (the calendar empty for none), or an error message.
local function params(arg)
  local c = params_cache[arg]
  if c then return c end
  local name, limit, period_ms, cost, lease, shadow, calendar =
    string.match(arg or '', '^(%S+) (%d+) (%d+) (%d+) (%d+) ([01]) (%S*)$')
  if not name then return 'bad parameter set ' .. tostring(arg) end
  c = check_params(name, limit, period_ms, cost, lease, shadow, calendar)
  if type(c) == 'table' then
    if params_cached >= PARAMS_CACHE_SIZE then params_cache, params_cached = {}, 0 end
    params_cache[arg], params_cached = c, params_cached + 1
  end
  return c
end

-- One check's seven reply values (check.lua's contract), after index n of `reply`.
local function append_row(reply, n, admits, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms)
  reply[n + 1] = admits and 1 or 0
  reply[n + 2] = remaining
  reply[n + 3] = reset_ms
  reply[n + 4] = retry_after_ms
  reply[n + 5] = granted
  reply[n + 6] = stamp
  reply[n + 7] = lease_ms
end

-- Phase 2 of one check (see check.lua): charges it when `charge` is true, then appends
-- its seven reply values to `reply` after index n.
local function finish_check(key, c, st, available, charge, now, reply, n)
  local admits = available >= c.cost
  local granted, stamp, lease_ms, retry_after_ms = 0, 0, 0, 0
  local algorithm = c.algorithm
  if charge and admits then
    granted = c.cost
    if c.lease > 0 then
      granted = math.max(c.cost, math.min(c.lease, math.floor(available / 2)))
    end
    stamp = algorithm.charge(key, c, st, granted, now)
    if granted > 0 then lease_ms = algorithm.lease_window(c, st, now) end
  end
  local remaining, reset_ms = algorithm.report(c, st, now)
  -- A refusal always names a wait of at least 1 ms, whatever the rounding.
  if not admits then retry_after_ms = math.max(1, algorithm.retry_after(c, st, now)) end
  append_row(reply, n, admits, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms)
end

-- check_request(first_key, count, base, charging, now, reply): the request's checks are
-- KEYS[first_key .. first_key + count - 1], their parameter sets ARGV[base .. base +
-- count - 1]. Appends seven values per check to `reply` and returns true, or returns
-- nil and an error message before anything is written (then `reply` is untouched). A
-- Redis command failing raises, possibly with this request's first rows appended:
-- check_batch.lua removes them.
local function check_request(first_key, count, base, charging, now, reply)
  local n = #reply
  if count == 1 then
    -- Most requests hold one check: no phase tables.
    local c = params(ARGV[base])
    if type(c) ~= 'table' then return nil, c end
    local key = KEYS[first_key]
    local st = c.algorithm.load(key, c, now)
    finish_check(key, c, st, c.algorithm.available(c, st, now), charging, now, reply, n)
    return true
  end
  local cs, states, availables = {}, {}, {}
  local every_enforcing_check_admits = true
  for i = 1, count do
    local c = params(ARGV[base + i - 1])
    if type(c) ~= 'table' then return nil, c end
    local st = c.algorithm.load(KEYS[first_key + i - 1], c, now)
    local available = c.algorithm.available(c, st, now)
    if not c.shadow and available < c.cost then every_enforcing_check_admits = false end
    cs[i], states[i], availables[i] = c, st, available
  end
  local charge = charging and every_enforcing_check_admits
  for i = 1, count do
    finish_check(KEYS[first_key + i - 1], cs[i], states[i], availables[i], charge, now, reply, n)
    n = n + 7
  end
  return true
end

-- decide_requests(first_key, mode_at): what check_batch.lua and check_node.lua run. The
-- requests' keys are KEYS[first_key ..], request after request; ARGV[mode_at] is the
-- mode, then per request its number of checks n followed by each check's parameters.
-- Returns check_batch.lua's reply: per request its seven values per check, or the error
-- that stopped it as one string; the other requests are decided all the same.
local function decide_requests(first_key, mode_at)
  local now = redis_now_us()
  local charging = ARGV[mode_at] == 'charge'
  local reply = {}
  local a, last = mode_at + 1, #ARGV
  while a <= last do
    local count = tonumber(ARGV[a])
    local mark = #reply
    local ran, ok, err = pcall(check_request, first_key, count, a + 1, charging, now, reply)
    if not ran or not ok then
      -- A failed redis.call raises a table holding `err`; other errors a string.
      if not ran then err = type(ok) == 'table' and ok.err or tostring(ok) end
      for j = #reply, mark + 1, -1 do reply[j] = nil end
      reply[mark + 1] = err
    end
    first_key = first_key + count
    a = a + 1 + count
  end
  return reply
end

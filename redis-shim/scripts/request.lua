-- request.lua: the checks of one request, all or nothing; what check.lua and
-- check_batch.lua run for each request (their contract is in check.lua).
--
-- check_request(first_key, count, base, charging, now): the request's checks are
-- KEYS[first_key .. first_key + count - 1], their arguments the 7 ARGV values per check
-- starting at ARGV[base]. Returns the reply rows, or nil and an error message (before
-- anything is written).

local function check_request(first_key, count, base, charging, now)
  local checks = {}
  local every_enforcing_check_admits = true
  for i = 1, count do
    local key = KEYS[first_key + i - 1]
    local b = base + 7 * (i - 1)
    local c = parse_check(b)
    c.cost = tonumber(ARGV[b + 3])
    c.lease = tonumber(ARGV[b + 4])
    c.shadow = ARGV[b + 5] == '1'
    local calendar_error
    c.calendar, calendar_error = parse_calendar(ARGV[b + 6])
    if calendar_error then return nil, calendar_error end
    local algorithm = algorithms[c.algorithm]
    if not algorithm then
      return nil, 'unknown algorithm ' .. tostring(c.algorithm)
    end
    local st = algorithm.load(key, c, now)
    local available = algorithm.available(c, st, now)
    local admits = available >= c.cost
    if not admits and not c.shadow then every_enforcing_check_admits = false end
    checks[i] = {key = key, c = c, algorithm = algorithm, st = st, available = available, admits = admits}
  end

  local reply = {}
  for i = 1, count do
    local check = checks[i]
    local c, algorithm, st = check.c, check.algorithm, check.st
    local granted, stamp = 0, 0
    if charging and every_enforcing_check_admits and check.admits then
      granted = c.cost
      if c.lease > 0 then
        granted = math.max(c.cost, math.min(c.lease, math.floor(check.available / 2)))
      end
      stamp = algorithm.charge(check.key, c, st, granted, now)
    end
    local remaining, reset_ms = algorithm.report(c, st, now)
    local retry_after_ms = 0
    -- A refusal always names a wait of at least 1 ms, whatever the rounding.
    if not check.admits then retry_after_ms = math.max(1, algorithm.retry_after(c, st, now)) end
    local lease_ms = 0
    if granted > 0 then lease_ms = algorithm.lease_window(c, st, now) end
    reply[i] = {check.admits and 1 or 0, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms}
  end
  return reply
end

-- check.lua: the checks of one request (or of one cluster slot of it), all or nothing.
--
-- Contract: reads every key first (phase 1), then, when every enforcing check admits
-- and the mode is `charge`, charges each enforcing check and each shadow check that
-- itself admits (phase 2); otherwise writes nothing. A shadow check never changes the
-- decision. A check with a lease (lease >= cost) is granted min(lease, available / 2),
-- at least its cost: leases shrink as the counter nears its limit, so the last tokens
-- are not parked in one Envoy while others are refused. Each check runs its own algorithm; all see one Redis time. Mode
-- `peek` reports the state and charges nothing (the shim uses it for the slots of a
-- request after a slot that refused).
--
-- KEYS[i]          counter key of check i
-- ARGV[1]          mode: 'charge' or 'peek'
-- ARGV[7i-5]       algorithm of check i (token_bucket, fixed_window, ...)
-- ARGV[7i-4]       limit (tokens)
-- ARGV[7i-3]       period (milliseconds)
-- ARGV[7i-2]       cost (tokens)
-- ARGV[7i-1]       lease (tokens; 0 for none)
-- ARGV[7i]         shadow: 1 or 0
-- ARGV[7i+1]       calendar: '<unit>:<offset minutes>' (calendar.lua), '' for none
-- Reply: one {admits, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms}
-- per key, in KEYS order; `admits` is 1 when that check alone would admit the request,
-- `granted` the tokens charged to it, `stamp` what refund.lua needs to give them back,
-- `lease_ms` how long granted tokens may be spent before they would cross into a window
-- they were not charged to (0: no such bound).

local now = redis_now_us()
local charging = ARGV[1] == 'charge'

local checks = {}
local every_enforcing_check_admits = true
for i = 1, #KEYS do
  local base = 7 * (i - 1) + 2
  local c = parse_check(base)
  c.cost = tonumber(ARGV[base + 3])
  c.lease = tonumber(ARGV[base + 4])
  c.shadow = ARGV[base + 5] == '1'
  local calendar_error
  c.calendar, calendar_error = parse_calendar(ARGV[base + 6])
  if calendar_error then return redis.error_reply(calendar_error) end
  local algorithm = algorithms[c.algorithm]
  if not algorithm then
    return redis.error_reply('unknown algorithm ' .. tostring(c.algorithm))
  end
  local st = algorithm.load(KEYS[i], c, now)
  local available = algorithm.available(c, st, now)
  local admits = available >= c.cost
  if not admits and not c.shadow then every_enforcing_check_admits = false end
  checks[i] = {c = c, algorithm = algorithm, st = st, available = available, admits = admits}
end

local reply = {}
for i = 1, #KEYS do
  local check = checks[i]
  local c, algorithm, st = check.c, check.algorithm, check.st
  local granted, stamp = 0, 0
  if charging and every_enforcing_check_admits and check.admits then
    granted = c.cost
    if c.lease > 0 then
      granted = math.max(c.cost, math.min(c.lease, math.floor(check.available / 2)))
    end
    stamp = algorithm.charge(KEYS[i], c, st, granted, now)
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

-- refund.lua: gives back the charges check.lua made on one cluster slot, when a later
-- slot of the same request refused it.
--
-- Contract: each key gets back `amount` tokens of the charge identified by `stamp`, as
-- far as its algorithm can still find that charge (see each algorithm's header); the
-- counter never goes below empty. Not atomic with the charge: between the two, other
-- requests see the tokens as taken.
--
-- KEYS[i]          counter key of check i
-- ARGV[6i-5]       algorithm of check i
-- ARGV[6i-4]       limit (tokens)
-- ARGV[6i-3]       period (milliseconds)
-- ARGV[6i-2]       amount to give back (the `granted` of check.lua's reply)
-- ARGV[6i-1]       stamp (from check.lua's reply)
-- ARGV[6i]         calendar: '<unit>:<offset minutes>' (calendar.lua), '' for none
-- Reply: one {1, remaining, reset_ms, 0, 0, 0, 0} per key, its state after the refund,
-- shaped like check.lua's reply.

local now = redis_now_us()
local reply = {}
for i = 1, #KEYS do
  local base = 6 * (i - 1) + 1
  local c = parse_check(base)
  local calendar_error
  c.calendar, calendar_error = parse_calendar(ARGV[base + 5])
  if calendar_error then return redis.error_reply(calendar_error) end
  local algorithm = algorithms[c.algorithm]
  if not algorithm then
    return redis.error_reply('unknown algorithm ' .. tostring(c.algorithm))
  end
  algorithm.refund(KEYS[i], c, tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), now)
  local remaining, reset_ms = algorithm.report(c, algorithm.load(KEYS[i], c, now), now)
  reply[i] = {1, remaining, reset_ms, 0, 0, 0, 0}
end
return reply

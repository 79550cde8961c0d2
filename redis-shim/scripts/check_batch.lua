-- check_batch.lua: the checks of several requests (from one Envoy worker's batch) in one
-- script: on a standalone Redis the whole batch, on a cluster the requests whose keys
-- all lie in one slot. Each
-- request is decided exactly as check.lua would decide it alone (request.lua), all or
-- nothing on its own; all see one Redis time. One script instead of one per request
-- costs Redis less than half the CPU per check.
--
-- KEYS             every request's keys, request after request
-- ARGV[1]          mode: 'charge' or 'peek'
-- then per request ARGV[a] = its number of checks n, followed by check.lua's 7 values
--                  per check (algorithm, limit, period, cost, lease, shadow, calendar)
-- Reply: per request, check.lua's rows; or, for a request whose arguments a check
-- cannot use, the error as a string: it is decided by nothing and charges nothing,
-- and the other requests are decided all the same.

local now = redis_now_us()
local charging = ARGV[1] == 'charge'
local replies = {}
local first_key, a = 1, 2
while a <= #ARGV do
  local count = tonumber(ARGV[a])
  local reply, err = check_request(first_key, count, a + 1, charging, now)
  replies[#replies + 1] = reply or err
  first_key = first_key + count
  a = a + 1 + 7 * count
end
return replies

-- check_batch.lua: the checks of several requests (from one Envoy worker's batch) in one
-- call: on a standalone Redis the whole batch, on a cluster the requests whose keys
-- all lie in one slot. Each
-- request is decided exactly as check.lua would decide it alone (request.lua), all or
-- nothing on its own; all see one Redis time. One call instead of one per request
-- costs Redis less than half the CPU per check.
--
-- KEYS             every request's keys, request after request
-- ARGV[1]          mode: 'charge' or 'peek'
-- then per request ARGV[a] = its number of checks n, followed by check.lua's 7 values
--                  per check (algorithm, limit, period, cost, lease, shadow, calendar)
-- Reply: per request, check.lua's rows; or the error that stopped it, as a string (its
-- arguments unusable, or a command failing on one of its keys): the other requests are
-- decided all the same, as they would be by scripts of their own.

local now = redis_now_us()
local charging = ARGV[1] == 'charge'
local replies = {}
local first_key, a = 1, 2
while a <= #ARGV do
  local count = tonumber(ARGV[a])
  local ran, reply, err = pcall(check_request, first_key, count, a + 1, charging, now)
  if not ran then
    -- A failed redis.call raises a table holding `err`; other errors a string.
    err = type(reply) == 'table' and reply.err or tostring(reply)
    reply = nil
  end
  replies[#replies + 1] = reply or err
  first_key = first_key + count
  a = a + 1 + 7 * count
end
return replies

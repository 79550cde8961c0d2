-- check.lua: the checks of one request (or of one cluster slot of it), all or nothing.
--
-- Contract: reads every key first (phase 1), then, when every enforcing check admits
-- and the mode is `charge`, charges each enforcing check and each shadow check that
-- itself admits (phase 2); otherwise writes nothing. A shadow check never changes the
-- decision. A check with a lease (lease >= cost) is granted min(lease, available / 2),
-- at least its cost: leases shrink as the counter nears its limit, so the last tokens
-- are not parked in one Envoy while others are refused. Each check runs its own
-- algorithm; all see one Redis time. Mode `peek` reports the state and charges nothing
-- (the shim uses it for the slots of a request after a slot that refused).
--
-- KEYS[i]          counter key of check i
-- ARGV[1]          mode: 'charge' or 'peek'
-- ARGV[1+i]        check i's parameters, '<algorithm> <limit> <period> <cost> <lease>
--                  <shadow> <calendar>': algorithm (token_bucket, fixed_window, ...),
--                  limit (tokens), period (milliseconds), cost (tokens), lease (tokens; 0
--                  for none), shadow (1 or 0), calendar ('<unit>:<offset minutes>',
--                  calendar.lua; empty for none)
-- Reply: a flat array, for each key in KEYS order the seven values admits, remaining,
-- reset_ms, retry_after_ms, granted, stamp, lease_ms; `admits` is 1 when that check
-- alone would admit the request, `granted` the tokens charged to it, `stamp` what
-- refund.lua needs to give them back, `lease_ms` how long granted tokens may be spent
-- before they would cross into a window they were not charged to (0: no such bound).

local reply = {}
local ok, err = check_request(1, #KEYS, 2, ARGV[1] == 'charge', redis_now_us(), reply)
if not ok then return redis.error_reply(err) end
return reply

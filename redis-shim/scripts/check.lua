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

local reply, err = check_request(1, #KEYS, 2, ARGV[1] == 'charge', redis_now_us())
if not reply then return redis.error_reply(err) end
return reply

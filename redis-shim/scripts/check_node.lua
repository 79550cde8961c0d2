-- check_node.lua: check_batch.lua for the requests bound for one Redis Cluster master,
-- whatever slots their keys lie in. A function call's declared keys must share a slot
-- (Redis refuses them with CROSSSLOT otherwise, whatever the function's flags), so the
-- keys come as arguments and the function is registered with `allow-cross-slot-keys`,
-- which lets it touch keys of any slot the node holds. Redis still checks each key as it
-- is touched: a key whose slot is not on this node (moved since the shim read the
-- cluster's map) fails its request when it is read, and every request reads all its keys
-- before it writes any, so such a request fails with nothing written and the shim
-- decides it again slot by slot.
--
-- ARGV[1]          the number of keys k
-- ARGV[2 .. k+1]   every request's keys, request after request
-- then             check_batch.lua's arguments: the mode, and per request its number of
--                  checks followed by each check's parameters
-- Reply: check_batch.lua's.

KEYS = ARGV
return decide_requests(2, tonumber(ARGV[1]) + 2)

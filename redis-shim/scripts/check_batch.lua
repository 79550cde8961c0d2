-- check_batch.lua: the checks of several requests (from one Envoy worker's batch) in one
-- call: on a standalone Redis the whole batch, on a cluster the requests whose keys
-- all lie in one slot (check_node.lua takes those of one master, whatever their slots:
-- the shim uses it once it knows which master holds which slot). Each request is
-- decided exactly as check.lua would decide it alone (request.lua), all or nothing on
-- its own; all see one Redis time. One call instead of one per request costs Redis less
-- than half the CPU per check.
--
-- KEYS             every request's keys, request after request
-- ARGV[1]          mode: 'charge' or 'peek'
-- then per request its number of checks n, followed by each check's parameters as
--                  check.lua takes them
-- Reply: a flat array, per request either check.lua's seven values per check, or the
-- error that stopped it as one string (its arguments unusable, or a command failing on
-- one of its keys): the other requests are decided all the same, as they would be by
-- calls of their own.

return decide_requests(1, 1)

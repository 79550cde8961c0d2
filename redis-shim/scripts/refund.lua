-- refund.lua: adjusts counters outside a request's check: gives back the charges
-- check.lua made on one cluster slot when a later slot of the same request refused it,
-- leased tokens an Envoy did not spend, and the part of an estimated cost a response
-- showed was not used; or charges what a response showed was used beyond it.
--
-- Contract: with `amount` > 0, each key gets back `amount` tokens of the charge
-- identified by `stamp`, as far as its algorithm can still find that charge (see each
-- algorithm's header); the counter never goes below empty. With `amount` < 0, -amount
-- tokens are charged now, whatever the counter holds: it may go into debt (a token
-- bucket's TAT moves past a full period ahead, a window counts past its limit), and
-- checks are refused until the debt is repaid (the window ends, the bucket refills).
-- The debt stops at MAX_DEBT_LIMITS limits per key (the algorithm's debt_room), however
-- many settlements arrive: what would go deeper is not charged.
-- Not atomic with the charge: between the two, other requests see the first charge.
--
-- KEYS[i]          counter key of check i
-- ARGV[6i-5]       algorithm of check i
-- ARGV[6i-4]       limit (tokens)
-- ARGV[6i-3]       period (milliseconds)
-- ARGV[6i-2]       amount to give back (at most the `granted` of check.lua's reply);
--                  negative: the amount to charge
-- ARGV[6i-1]       stamp (from check.lua's reply)
-- ARGV[6i]         calendar: '<unit>:<offset minutes>' (calendar.lua), '' for none
-- Reply: 1, remaining, reset_ms, 0, 0, 0, 0 per key, its state after the refund, in
-- check.lua's flat shape.

local now = redis_now_us()
local reply = {}
for i = 1, #KEYS do
  local base = 6 * (i - 1) + 1
  local c = check_params(ARGV[base], ARGV[base + 1], ARGV[base + 2], 1, 0, '0', ARGV[base + 5])
  if type(c) ~= 'table' then return redis.error_reply(c) end
  local algorithm = c.algorithm
  local amount = tonumber(ARGV[base + 3])
  if amount > 0 then
    algorithm.refund(KEYS[i], c, amount, tonumber(ARGV[base + 4]), now)
  elseif amount < 0 then
    if not algorithm.debt_room then
      return redis.error_reply(c.name .. ' takes no settlement')
    end
    local st = algorithm.load(KEYS[i], c, now)
    local charge = math.min(-amount, algorithm.debt_room(c, st, now))
    if charge > 0 then algorithm.charge(KEYS[i], c, st, charge, now) end
  end
  local remaining, reset_ms = algorithm.report(c, algorithm.load(KEYS[i], c, now), now)
  local n = 7 * (i - 1)
  reply[n + 1], reply[n + 2], reply[n + 3] = 1, remaining, reset_ms
  for j = n + 4, n + 7 do reply[j] = 0 end
end
return reply

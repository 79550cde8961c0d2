-- apply.lua: a peer region's entries (replicated.lua), applied as that region's component
-- of each key, with the position of the peer's stream they end at, in one call: an entry
-- is never applied twice, nor skipped, however many shims of this region read the peer.
--
-- KEYS[1]          where this region keeps its position in the peer's stream
-- KEYS[2]          where it keeps the number of the last entry applied
-- KEYS[2+i]        entry i's counter key
-- ARGV[1]          the peer region's name
-- ARGV[2]          the position the entries follow: nothing is applied unless KEYS[1]
--                  still holds it (another shim applied them first)
-- ARGV[3]          the position of the last entry
-- ARGV[4], ARGV[5] the numbers of the first and the last entry
-- ARGV[6+5(i-1)..] entry i: w, c, p, x (as the peer wrote them), then its period (ms) when
--                  the key is a sliding window counter's, else 0
-- Reply: {-1, 0, 0} when the position had moved, else {the tokens the entries added to
-- the peer's components (what this region learned it had spent), the entries missed
-- before the first (trimmed before this region read them), the entries skipped (their
-- key holds something else than a counter of this kind)}.

-- Applies one entry of `peer` to `key`; the tokens it added to the peer's component.
local function apply_entry(key, peer, w, count, before, expires, period)
  local stored = redis.call('HMGET', key, 'w', 'c:' .. peer, 'p:' .. peer)
  local stored_start = tonumber(stored[1])
  if stored_start == nil or stored_start < w then
    -- A window this region has not reached yet: it starts here, every component of the
    -- stored one shifted back (sliding window counter) or gone.
    local fields = redis.call('HGETALL', key)
    redis.call('DEL', key)
    local kept = {'w', w}
    if stored_start ~= nil and period > 0 and stored_start == w - period then
      for f = 1, #fields, 2 do
        local name, value = fields[f], fields[f + 1]
        local region = string.match(name, '^c:(.+)$')
        if region then kept[#kept + 1] = 'p:' .. region; kept[#kept + 1] = value end
        if name == 't' or name == 'cf' or name == 'q' or name == 'qi' or name == 'li' then
          kept[#kept + 1] = name; kept[#kept + 1] = value
        end
      end
    end
    redis.call('HSET', key, unpack(kept))
    stored, stored_start = {w, 0, 0}, w
  end
  if stored_start == w then
    redis.call('HSET', key, 'c:' .. peer, count, 'p:' .. peer, before)
    if redis.call('PTTL', key) < 0 then redis.call('PEXPIREAT', key, expires) end
    return math.max(0, count - (tonumber(stored[2]) or 0))
  end
  if period > 0 and stored_start == w + period then
    -- The peer's current window is this region's previous one.
    redis.call('HSET', key, 'p:' .. peer, count)
  end
  return 0
end

local position = redis.call('GET', KEYS[1]) or '0-0'
if position ~= ARGV[2] then return {-1, 0, 0} end
local peer = ARGV[1]
local added, skipped = 0, 0
local missed = math.max(0, tonumber(ARGV[4]) - 1 - (tonumber(redis.call('GET', KEYS[2])) or 0))
for i = 3, #KEYS do
  local a = 6 + 5 * (i - 3)
  local ok, tokens = pcall(apply_entry, KEYS[i], peer, tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]))
  if ok then
    added = added + tokens
  else
    -- A key of another type (regions disagreeing on a rule during a rollout): skipped,
    -- counted, and the stream goes on.
    skipped = skipped + 1
  end
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[5])
return {added, missed, skipped}

-- apply.lua: a peer region's entries (replicated.lua), applied as that region's component
-- of each key, with the position of the peer's stream they end at, in one call: an entry
-- is never applied twice, nor skipped, however many shims of this region read the peer.
--
-- KEYS[1]          where this region keeps its position in the peer's stream
-- KEYS[1+i]        entry i's counter key
-- ARGV[1]          the peer region's name
-- ARGV[2]          the position the entries follow: nothing is applied unless KEYS[1]
--                  still holds it (another shim applied them first)
-- ARGV[3]          the position of the last entry
-- ARGV[4+5(i-1)..] entry i: w, c, p, x (as the peer wrote them), then its period (ms) when
--                  the key is a sliding window counter's, else 0
-- Reply: -1 when the position had moved, else the tokens the entries added to the peer's
-- components (what this region learned it had spent).

local position = redis.call('GET', KEYS[1]) or '0-0'
if position ~= ARGV[2] then return -1 end
local peer = ARGV[1]
local added = 0
for i = 2, #KEYS do
  local key = KEYS[i]
  local a = 4 + 5 * (i - 2)
  local w, count, before = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local expires, period = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
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
        local region = string.match(fields[f], '^c:(.+)$')
        if region then kept[#kept + 1] = 'p:' .. region; kept[#kept + 1] = fields[f + 1] end
        if fields[f] == 't' or fields[f] == 'cf' or fields[f] == 'q' or fields[f] == 'qi' or fields[f] == 'li' then
          kept[#kept + 1] = fields[f]; kept[#kept + 1] = fields[f + 1]
        end
      end
    end
    redis.call('HSET', key, unpack(kept))
    stored = {w, 0, 0}
    stored_start = w
  end
  if stored_start == w then
    added = added + math.max(0, count - (tonumber(stored[2]) or 0))
    redis.call('HSET', key, 'c:' .. peer, count, 'p:' .. peer, before)
    if redis.call('PTTL', key) < 0 then redis.call('PEXPIREAT', key, expires) end
  elseif period > 0 and stored_start == w + period then
    -- The peer's current window is this region's previous one.
    redis.call('HSET', key, 'p:' .. peer, count)
  end
end
redis.call('SET', KEYS[1], ARGV[3])
return added

-- The floor of a sliding window counter check: one TIME per call, then the commands the
-- product runs for an admitted check (HMGET, HSET, PEXPIREAT on a hash {w, c, p}), the
-- weighted count, a constant reply row. Limit 1,000,000 per 60 s.
local t = redis.call('TIME'); local now = tonumber(t[1])*1000000 + tonumber(t[2])
local period_ms = 60000
local now_ms = math.floor(now / 1000)
local start = now_ms - now_ms % period_ms
local weight = 1 - (now - start * 1000) / (period_ms * 1000)
local out = {}
for i = 1, #KEYS do
  local s = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
  local stored, c, p = tonumber(s[1]), 0, 0
  if stored == start then c, p = tonumber(s[2]), tonumber(s[3])
  elseif stored == start - period_ms then p = tonumber(s[2]) end
  if p * weight + c + 1 <= 1000000 then c = c + 1 end
  redis.call('HSET', KEYS[i], 'w', string.format('%.0f', start), 'c', c, 'p', p)
  redis.call('PEXPIREAT', KEYS[i], string.format('%.0f', start + 2 * period_ms))
  out[i] = {1, 999, 1, 0}
end
return out

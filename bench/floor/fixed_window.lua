-- The floor of a fixed window check: one TIME per call, then the commands the product
-- runs for an admitted check (HMGET, HSET, PEXPIREAT on a hash {w, n}), a constant reply
-- row. Limit 1,000,000 per 60 s.
local t = redis.call('TIME'); local now = tonumber(t[1])*1000000 + tonumber(t[2])
local period_ms = 60000
local now_ms = math.floor(now / 1000)
local start = now_ms - now_ms % period_ms
local out = {}
for i = 1, #KEYS do
  local s = redis.call('HMGET', KEYS[i], 'w', 'n')
  local n = 0
  if tonumber(s[1]) == start then n = tonumber(s[2]) end
  n = n + 1
  redis.call('HSET', KEYS[i], 'w', string.format('%.0f', start), 'n', n)
  redis.call('PEXPIREAT', KEYS[i], string.format('%.0f', start + period_ms))
  out[i] = {1, 999, 1, 0}
end
return out

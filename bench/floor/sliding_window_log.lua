-- The floor of a sliding window log check: one TIME per call, then the commands the
-- product runs for an admitted check (ZCOUNT, ZREMRANGEBYSCORE, ZADD NX, PEXPIRE on a
-- sorted set of entries), a constant reply row. Limit 10,000 per 60 s.
local t = redis.call('TIME'); local now = tonumber(t[1])*1000000 + tonumber(t[2])
local period = 60000000
local oldest = string.format('%.0f', now - period)
local stamp = string.format('%.0f', now)
local out = {}
for i = 1, #KEYS do
  local used = redis.call('ZCOUNT', KEYS[i], '(' .. oldest, '+inf')
  if used < 10000 then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', oldest)
    redis.call('ZADD', KEYS[i], 'NX', stamp, stamp .. '-' .. (used + 1))
    redis.call('PEXPIRE', KEYS[i], 60000)
  end
  out[i] = {1, 999, 1, 0}
end
return out

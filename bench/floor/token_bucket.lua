-- The floor of a token bucket check (issue #29, verbatim): GCRA with one TIME per call,
-- then GET and SET ... PX per key, a constant reply row. Limit 1,000,000 per 60 s.
local t = redis.call('TIME'); local now = tonumber(t[1])*1000000 + tonumber(t[2])
local interval = 60000000 / 1000000
local out = {}
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  tat = tat + interval
  redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat-now)/1000))
  out[i] = {1, 999, 1, 0}
end
return out

-- concurrency.lua: requests in flight, each holding a slot until it is released.
--
-- Contract: at most `limit` slots taken at once per key. A slot is taken when a request
-- is admitted and given back by a refund naming it (the filter's release when the
-- request's stream ends); a slot whose release never comes (an Envoy that died, a lost
-- call) frees itself `period` after it was taken: here `period` is the rule's
-- max_duration, not a rate's window. `cost` is always 1 and there are no leases (the
-- shim refuses both).
--
-- State per key: a sorted set with one member per slot taken, the member its id and the
-- score the Redis time (microseconds) at which it frees itself. Ids are the Redis time
-- of the charge in microseconds, bumped while already taken: unique within the key, and
-- below 2^53 so Lua's numbers keep them exact. The id is the charge's `stamp`, which the
-- release carries back. Expired members no longer count; they are trimmed when the key is
-- charged, and the key expires `period` after its newest slot was taken, when every
-- member has expired, so an idle key costs no memory. A refund removes the named member:
-- exact, and a no-op for a slot that already expired (a late release frees nothing that
-- a newer request holds).

algorithms.concurrency = {}
local concurrency = algorithms.concurrency

-- The longest a refused request is told to wait: a slot can free at any moment, when a
-- request in flight ends, and nothing tells when that will be.
local CONCURRENCY_RETRY_MS = 1000

-- Members still holding a slot at `now`: expiry strictly after it.
local function live_floor(now)
  return '(' .. int(now)
end

function concurrency.load(key, c, now)
  return {key = key, used = redis.call('ZCOUNT', key, live_floor(now), '+inf')}
end

function concurrency.available(c, st, now)
  local slots = c.limit - st.used
  if slots < 0 then return 0 end
  return slots
end

function concurrency.charge(key, c, st, amount, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local id = now
  for _ = 1, amount do
    while redis.call('ZADD', key, 'NX', int(now + c.period), int(id)) == 0 do
      id = id + 1
    end
  end
  redis.call('PEXPIRE', key, int(c.period_ms))
  st.used = st.used + amount
  return id
end

-- The time until every slot now taken is free for sure: when the newest one would
-- expire. Requests usually end much sooner; nothing in flight resets at once.
function concurrency.report(c, st, now)
  local reset_ms = 0
  if st.used > 0 then
    local newest = redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')
    reset_ms = ms_ceil(tonumber(newest[2]) - now)
  end
  return concurrency.available(c, st, now), reset_ms
end

function concurrency.retry_after(c, st, now)
  -- A slot frees when a request ends (any moment) or, at the latest, when enough of the
  -- oldest slots expire to leave one free.
  local must_free = st.used - (c.limit - c.cost)
  local slot = redis.call('ZRANGEBYSCORE', st.key, live_floor(now), '+inf',
    'WITHSCORES', 'LIMIT', must_free - 1, 1)
  if slot[2] == nil then return CONCURRENCY_RETRY_MS end
  return math.min(CONCURRENCY_RETRY_MS, ms_ceil(tonumber(slot[2]) - now))
end

function concurrency.refund(key, c, amount, stamp, now)
  redis.call('ZREM', key, int(stamp))
end

-- Never leased (the shim refuses leases of concurrency checks).
function concurrency.lease_window(c, st, now)
  return 0
end

-- replicated.lua: counts that one region spends on its own Redis and the other regions
-- learn of asynchronously (docs/REGIONS.md), for fixed_window and
-- sliding_window_counter; what check_regions.lua runs for a check marked replicated.
--
-- Contract: a replicated check admits while (a) the count as this region knows it, every
-- region's component added, leaves room for its cost, and (b) this region's spending that
-- the other regions have not yet confirmed stays within its share of what remained when
-- that spending began: share(m) = floor(m / R) + (1 if rank < m mod R), where m is the
-- limit less the count known without that unconfirmed spending, R the number of regions
-- and rank this region's place among their sorted names. The shares of one remainder add
-- up to it exactly, so regions that all spend at once from the same knowledge admit at
-- most the limit. Confirmation comes from the shim (`ctx.acked`: the position of this
-- region's stream that every peer it counts on has applied).
--
-- State per key: a hash {w = start of the current window (ms), c:<region> = that
-- region's count in it, p:<region> = its count in the window before (sliding window
-- counter), t = this region's spending on the key since the key was made, cf = the part
-- of t confirmed, q and qi = a checkpoint (t when this region's entry qi was written), li
-- = this region's last entry for the key}. Each charge appends the region's new
-- component to its stream (ctx.stream, in the same call): {s = the entry's number in the
-- stream, k = key, w, c, p, x = when the key expires, P = the period of a sliding window
-- counter, 0 for a fixed window}; a reader finds entries trimmed before it read them from
-- a gap in the numbers. Peers apply the entry with apply.lua, absolute values, so an entry
-- applied twice changes nothing.

local replicated = {}

local function stream_id(id)
  local ms, seq = string.match(id or '', '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

-- Whether stream position `a` is at or after `b`.
local function at_or_after(a, b)
  local am, as = stream_id(a)
  local bm, bs = stream_id(b)
  return am > bm or (am == bm and as >= bs)
end

-- Start of the window holding `now` and when a key of it expires, for either algorithm.
local function replicated_window(c, now)
  if c.name == 'fixed_window' then
    local start, finish = fixed_window_bounds(c, now)
    return start, finish
  end
  local start = window_start_ms(now, c.period_ms)
  return start, start + 2 * c.period_ms
end

-- The key's state, every region's components shifted to the window holding `now`.
function replicated.load(key, c, ctx, now)
  local fields = {'w', 't', 'cf', 'q', 'qi', 'li'}
  for _, region in ipairs(ctx.regions) do
    fields[#fields + 1] = 'c:' .. region
    fields[#fields + 1] = 'p:' .. region
  end
  local stored = redis.call('HMGET', key, unpack(fields))
  local start, finish = replicated_window(c, now)
  local stored_start = tonumber(stored[1])
  if stored_start and stored_start > start then
    -- A peer whose clock is ahead started the next window here: it is the window counted
    -- (this region's spending goes to it), not one to wipe.
    start, finish = replicated_window(c, stored_start * 1000)
  end
  local st = {
    start = start, finish = finish, current = {}, previous = {},
    t = tonumber(stored[2]) or 0, cf = tonumber(stored[3]) or 0,
    q = tonumber(stored[4]) or 0, qi = stored[5] or '0-0', li = stored[6] or '0-0',
  }
  local sliding = c.name == 'sliding_window_counter'
  for i, region in ipairs(ctx.regions) do
    local count = tonumber(stored[5 + 2 * i]) or 0
    local before = tonumber(stored[6 + 2 * i]) or 0
    if stored_start == start then
      st.current[region], st.previous[region] = count, before
    elseif sliding and stored_start == start - c.period_ms then
      st.current[region], st.previous[region] = 0, count
    else
      st.current[region], st.previous[region] = 0, 0
    end
  end
  -- What the peers have confirmed: all of it once they have the last entry, else up to
  -- the checkpoint, which then moves to the last entry.
  if at_or_after(ctx.acked, st.li) then
    st.cf, st.q, st.qi = st.t, st.t, st.li
  elseif at_or_after(ctx.acked, st.qi) then
    st.cf, st.q, st.qi = st.q, st.t, st.li
  end
  return st
end

-- The count as this region knows it, every region's component added.
local function known_count(c, st, now)
  local count, before = 0, 0
  for region, n in pairs(st.current) do
    count = count + n
    before = before + st.previous[region]
  end
  if c.name == 'sliding_window_counter' then
    local weight = 1 - (now - st.start * 1000) / c.period
    return before * weight + count
  end
  return count
end

-- This region's share of a remainder `m` (whole tokens) split among the regions.
local function share(m, ctx)
  if m <= 0 then return 0 end
  local regions = #ctx.regions
  local extra = 0
  if ctx.rank < m % regions then extra = 1 end
  return math.floor(m / regions) + extra
end

function replicated.available(c, st, ctx, now)
  local known = known_count(c, st, now)
  local unconfirmed = math.max(0, st.t - st.cf)
  local remainder = math.floor(c.limit - math.max(0, known - unconfirmed) + EPSILON)
  local tokens = math.min(math.floor(c.limit - known + EPSILON), share(remainder, ctx) - unconfirmed)
  if tokens < 0 then return 0 end
  return tokens
end

function replicated.charge(key, c, st, ctx, amount, now)
  local own = ctx.own
  st.current[own] = st.current[own] + amount
  st.t = st.t + amount
  local fields = {'w', st.start, 't', st.t, 'cf', st.cf, 'q', st.q, 'qi', st.qi}
  for region, n in pairs(st.current) do
    fields[#fields + 1] = 'c:' .. region
    fields[#fields + 1] = n
    fields[#fields + 1] = 'p:' .. region
    fields[#fields + 1] = st.previous[region]
  end
  -- Entries older than twice the longest window any replicated check has had may go.
  local keep = tonumber(redis.call('GET', ctx.stream .. ':keep')) or 0
  if 2 * c.period_ms > keep then
    keep = 2 * c.period_ms
    redis.call('SET', ctx.stream .. ':keep', keep)
  end
  local seq = redis.call('INCR', ctx.stream .. ':seq')
  local id = redis.call('XADD', ctx.stream, 'MINID', '~', int(math.floor(now / 1000) - keep), '*',
    's', seq, 'k', key, 'w', st.start, 'c', st.current[own], 'p', st.previous[own], 'x', st.finish,
    'P', c.name == 'sliding_window_counter' and c.period_ms or 0)
  st.li = id
  fields[#fields + 1] = 'li'
  fields[#fields + 1] = id
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIREAT', key, st.finish)
  return st.start
end

function replicated.report(c, st, ctx, now)
  local known = known_count(c, st, now)
  local remaining = math.floor(c.limit - known + EPSILON)
  if remaining < 0 then remaining = 0 end
  local reset_ms = 0
  if known > 0 then reset_ms = ms_ceil(st.finish * 1000 - now) end
  return remaining, reset_ms
end

-- When the count itself is full, until the window ends (when the sliding counter's
-- previous window weighs less, at the latest); when only this region's share is spent, the
-- shim's estimate of when the peers confirm it (ctx.renew_ms).
function replicated.retry_after(c, st, ctx, now)
  if math.floor(c.limit - known_count(c, st, now) + EPSILON) >= c.cost then return ctx.renew_ms end
  if c.name == 'fixed_window' then return ms_ceil(st.finish * 1000 - now) end
  return ms_ceil((st.start + c.period_ms) * 1000 - now)
end

-- Phase 2 of one replicated check, as request.lua's finish_check: charges it when
-- `charge` is true, then appends its seven reply values after index n.
local function finish_replicated(key, c, st, ctx, available, charge, now, reply, n)
  local admits = available >= c.cost
  local granted, stamp, retry_after_ms = 0, 0, 0
  if charge and admits then
    granted = c.cost
    stamp = replicated.charge(key, c, st, ctx, granted, now)
  end
  local remaining, reset_ms = replicated.report(c, st, ctx, now)
  if not admits then retry_after_ms = math.max(1, replicated.retry_after(c, st, ctx, now)) end
  append_row(reply, n, admits, remaining, reset_ms, retry_after_ms, granted, stamp, 0)
end

-- check_regional_request(count, charging, now, ctx, reply): check.lua's contract over the
-- checks KEYS[1 .. count], each given by two values from ARGV[ctx.base]: 'r' (replicated)
-- or 'i' (independent), then its parameter set. Returns true, or nil and an error before
-- anything is written.
local function check_regional_request(count, charging, now, ctx, reply)
  local cs, states, availables, marked = {}, {}, {}, {}
  local every_enforcing_check_admits = true
  for i = 1, count do
    local c = params(ARGV[ctx.base + 2 * i - 1])
    if type(c) ~= 'table' then return nil, c end
    local key = KEYS[i]
    local st, available
    marked[i] = ARGV[ctx.base + 2 * i - 2] == 'r'
    if marked[i] then
      if c.name ~= 'fixed_window' and c.name ~= 'sliding_window_counter' then
        return nil, 'replicated does not serve ' .. c.name
      end
      st = replicated.load(key, c, ctx, now)
      available = replicated.available(c, st, ctx, now)
    else
      st = c.algorithm.load(key, c, now)
      available = c.algorithm.available(c, st, now)
    end
    if not c.shadow and available < c.cost then every_enforcing_check_admits = false end
    cs[i], states[i], availables[i] = c, st, available
  end
  local charge = charging and every_enforcing_check_admits
  local n = #reply
  for i = 1, count do
    if marked[i] then
      finish_replicated(KEYS[i], cs[i], states[i], ctx, availables[i], charge, now, reply, n)
    else
      finish_check(KEYS[i], cs[i], states[i], availables[i], charge, now, reply, n)
    end
    n = n + 7
  end
  return true
end

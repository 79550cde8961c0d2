-- check_regions.lua: one request's checks on this region's Redis when some of them are
-- replicated (replicated.lua), all or nothing, as check.lua decides them.
--
-- KEYS[i]          counter key of check i; KEYS[#KEYS] this region's stream
-- ARGV[1]          mode: 'charge' or 'peek'
-- ARGV[2]          this region's name
-- ARGV[3]          every region's name, this one's included, space-separated
-- ARGV[4]          this region's rank among the sorted names (0-based)
-- ARGV[5]          the position of this region's stream every counted peer has applied
-- ARGV[6]          milliseconds until the peers are expected to confirm what is spent now
--                  (the retry of a check refused only by this region's share)
-- ARGV[5+2i]       'r' when check i is replicated, 'i' when it is not
-- ARGV[6+2i]       check i's parameters, as check.lua takes them
-- Reply: check.lua's.

local regions = {}
for region in string.gmatch(ARGV[3], '%S+') do regions[#regions + 1] = region end
local ctx = {
  own = ARGV[2], regions = regions, rank = tonumber(ARGV[4]), acked = ARGV[5],
  renew_ms = tonumber(ARGV[6]), stream = KEYS[#KEYS], base = 7,
}
local reply = {}
local ok, err = check_regional_request(#KEYS - 1, ARGV[1] == 'charge', redis_now_us(), ctx, reply)
if not ok then return redis.error_reply(err) end
return reply

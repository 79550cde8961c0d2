-- calendar.lua: windows aligned to the civil calendar, for fixed_window checks that
-- carry a calendar (concatenated after common.lua, before the algorithms).
--
-- Contract: calendar_window(cal, now_ms) returns the window [start, finish) holding
-- now_ms, both in milliseconds of Redis time since the Unix epoch: a day from midnight,
-- a week from Monday's midnight, a month from the 1st's midnight, at the fixed UTC offset
-- cal.offset_ms (east positive; no daylight saving time). It is the Lua twin of the wire
-- crate's CalendarWindow::window_at (the shim's tests compare the two on a table of
-- boundaries and on random instants). The civil date conversions are Howard Hinnant's
-- days_from_civil / civil_from_days, in floored integer division: every value stays an
-- integer far below 2^53, so Lua's doubles hold them exactly.
--
-- parse_calendar(arg) reads the driver's ARGV value `<unit>:<offset minutes>` (as the
-- shim writes it, e.g. `month:-210`): the calendar, or nil for the empty string (no
-- calendar), or nil and an error message for anything else.

local MS_PER_DAY = 86400000

local function floor_div(a, b)
  return math.floor(a / b)
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor_div(y, 400)
  local yoe = y - era * 400
  local mp = m + 9
  if m > 2 then mp = m - 3 end
  local doy = floor_div(153 * mp + 2, 5) + d - 1
  local doe = yoe * 365 + floor_div(yoe, 4) - floor_div(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = floor_div(z, 146097)
  local doe = z - era * 146097
  local yoe = floor_div(doe - floor_div(doe, 1460) + floor_div(doe, 36524) - floor_div(doe, 146096), 365)
  local doy = doe - (365 * yoe + floor_div(yoe, 4) - floor_div(yoe, 100))
  local mp = floor_div(5 * doy + 2, 153)
  local d = doy - floor_div(153 * mp + 2, 5) + 1
  local m = mp - 9
  if mp < 10 then m = mp + 3 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

local function calendar_window(cal, now_ms)
  local day = floor_div(now_ms + cal.offset_ms, MS_PER_DAY)
  local first, next_first
  if cal.unit == 'day' then
    first, next_first = day, day + 1
  elseif cal.unit == 'week' then
    -- 1970-01-01 was a Thursday: day 0 is 3 days after a Monday.
    first = day - (day + 3) % 7
    next_first = first + 7
  else
    local y, m = civil_from_days(day)
    first = days_from_civil(y, m, 1)
    if m == 12 then
      next_first = days_from_civil(y + 1, 1, 1)
    else
      next_first = days_from_civil(y, m + 1, 1)
    end
  end
  return first * MS_PER_DAY - cal.offset_ms, next_first * MS_PER_DAY - cal.offset_ms
end

local CALENDAR_UNITS = {day = true, week = true, month = true}

local function parse_calendar(arg)
  if arg == nil or arg == '' then return nil end
  local unit, minutes = string.match(arg, '^(%a+):(-?%d+)$')
  if not unit or not CALENDAR_UNITS[unit] then
    return nil, 'bad calendar ' .. arg
  end
  return {unit = unit, offset_ms = tonumber(minutes) * 60000}
end

#!lua flags=no-writes
--[[
inspect (lua/inspect/skeleton.lua with each kind's `inspect-read` and `inspect-answer`
sections, lua/kinds/*.lua; assembled at build time as the deciding script is): read one bucket's
sliding windows for the admin inspector. READ-ONLY.

It never writes (the `no-writes` flag makes Redis refuse any write, and lets it run on a replica
or via EVALSHA_RO): no eviction, no TTL refresh, no entry. Reading a window a thousand times
changes nothing a decision of the sliding-window script (lua/sliding_window/skeleton.lua) will
see. Expired entries still in a list are skipped, not trimmed.

KEYS  (n = #KEYS >= 1; every key shares one hash tag, so one Cluster hash slot)
  KEYS[i]       the log or slot counters of limit i, named as by the deciding script

ARGV  (3n + 1 integers, in decimal)
  ARGV[3i-2]    requests of limit i (>= 1)
  ARGV[3i-1]    window of limit i, in MICROseconds
  ARGV[3i]      resolution of limit i in MICROseconds, 0 for a log (see SLOTS in
                lua/kinds/slots/, the deciding script)
  ARGV[3n+1]    the most entries to return per limit (the newest ones); >= 1

REPLY  an array of integers: now, then for each limit i a group of 4 + k values
  [1]           now: the script's clock, µs since the Unix epoch, with the same guard as the
                deciding script: max(Redis TIME, newest entry of any list of this call)
  count         entries in the window (t > now - window)
  remaining     max(requests - count, 0)
  reset         µs, the deciding script's `reset` (see its REPLY): the full window when
                the window is empty, else (entry[count - requests], or the oldest, + window - now)
  k             number of values that follow
  a log:        min(count, cap) values: the newest in-window entries, oldest first, µs since
                the Unix epoch
  slots:        2 values per non-empty slot overlapping the window, oldest first: its start
                (µs since the Unix epoch) and its counter (at most 1001 slots)
  A slotted limit's count is the sum of those counters and its reset the deciding script's.
--]]

local call = redis.call
local floor = math.floor

local n = #KEYS
local cap = tonumber(ARGV[3 * n + 1])
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Per limit: the list's length, or the slot counters as unpacked ({} when none).
local len = {}
for i = 1, n do
    local res = tonumber(ARGV[3 * i])
    -- @each-kind inspect-read
end

local reply = { now }
for i = 1, n do
    local key, c = KEYS[i], len[i]
    local r, w, res = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
    -- @each-kind inspect-answer
end
return reply

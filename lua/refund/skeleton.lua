--[[
refund (lua/refund/skeleton.lua with each kind's `refund` section, lua/kinds/*.lua): give back
one admission of the sliding-window script (lua/sliding_window/skeleton.lua), for a route's
`count_status` (the upstream answered with a status the route does not count) or `settle` (a
cost settled lower than charged), or charge a cost settled higher (`settle`). Assembled at
build time as the deciding script is (see ASSEMBLY there).

KEYS  (n = #KEYS >= 1) the keys of one admitted decision, as the deciding script got them: one
      per limit, one hash tag, so one Cluster hash slot
ARGV  (1 + 3n values, decimal integers)
  ARGV[1]       `at`: the admitted decision's status, i.e. its `now` in µs, which every entry it
                recorded carries
  ARGV[3i-1]    resolution of limit i in µs, 0 for a log (as the deciding script's ARGV)
  ARGV[3i]      what to give back in limit i: the weight the admission was charged (1; a cost
                limit's cost); a log gives back its one entry whatever it says. Negative: a
                charge of that much on top (a cost settled higher than charged), in a slotted
                limit only; a log ignores it
  ARGV[3i+1]    window of limit i in µs (a charge's slot and TTL)

A log loses one entry equal to `at`, searched from the newest end (LREM key -1 at), where a
request that just got its answer has its entry: that request's own entry (another admission in
the same µs has the same value, so which one goes does not matter). A slotted limit loses that amount
(at most what it holds) from the slot `at` falls in; a pair that reaches 0 is dropped, a key left with none is
deleted, and the rewritten string keeps its TTL (PTTL, then SET .. PX). A charge lands in the
slot of now (this script's TIME, never before the newest stored slot), with no room check, so the
limit may go over its quota (debt) until one window after the cost became known: not in the
admission's slot, which a response longer than the window would have seen leave (and its
charge with it). It drops the pairs that left the window, creates the slot (and the key) if
needed, caps the counter at 2^32 - 1 and sets the TTL a deciding admission sets. A give back
never moves the clock, never creates a key or a slot, and an entry that already left its
window (trimmed or expired) is left alone.

REPLY  the number of limits that gave an entry back or took a charge (0 ..= n)
--]]

local call = redis.call
local TTL_MARGIN_MS = 1000 -- as the deciding script's (lua/sliding_window/skeleton.lua)
local floor = math.floor
local at_s = ARGV[1]
local at = tonumber(at_s)
local given = 0
for i = 1, #KEYS do
    local key, res, amount = KEYS[i], tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
    local w = tonumber(ARGV[3 * i + 1])
    -- @each-kind refund
end
return given

--[[
refund (lua/refund/skeleton.lua with each kind's `refund` section, lua/kinds/*.lua): give back
one admission of the sliding-window script (lua/sliding_window/skeleton.lua), for a route's
`count_status` (the upstream answered with a status the route does not count). Assembled at
build time as the deciding script is (see ASSEMBLY there).

KEYS  (n = #KEYS >= 1) the keys of one admitted decision, as the deciding script got them: one
      per limit, one hash tag, so one Cluster hash slot
ARGV  (1 + 2n values, decimal integers)
  ARGV[1]       `at`: the admitted decision's status, i.e. its `now` in µs, which every entry it
                recorded carries
  ARGV[2i]      resolution of limit i in µs, 0 for a log (as the deciding script's ARGV)
  ARGV[2i+1]    what to give back in limit i: the weight the admission was charged (1; a cost
                limit's cost); a log gives back its one entry whatever it says. Negative: a
                charge of that much on top (a cost settled higher than charged), in a slotted
                limit only; a log ignores it

A log loses one entry equal to `at`, searched from the newest end (LREM key -1 at), where a
request that just got its answer has its entry: that request's own entry (another admission in
the same µs has the same value, so which one goes does not matter). A slotted limit loses that amount
(at most what it holds) from the slot `at` falls in; a pair that reaches 0 is dropped, a key left with none is
deleted, and the rewritten string keeps its TTL (PTTL, then SET .. PX). A charge adds to that
slot (capped at 2^32 - 1) with no room check, so the limit may go over its quota (debt), only
if the slot is still kept: the admission's own charge is in it (a settle route reserves at
least 1). Nothing else changes: a refund or charge never moves the clock, never creates a key
or a slot, and an entry that already left its window (trimmed or expired) is left alone.

REPLY  the number of limits that gave an entry back (0 ..= n)
--]]

local call = redis.call
local floor = math.floor
local at_s = ARGV[1]
local at = tonumber(at_s)
local given = 0
for i = 1, #KEYS do
    local key, res, amount = KEYS[i], tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    -- @each-kind refund
end
return given

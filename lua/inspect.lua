#!lua flags=no-writes
--[[
inspect.lua: read one bucket's sliding windows for the admin inspector. READ-ONLY.

It never writes (the `no-writes` flag makes Redis refuse any write, and lets it run on a replica
or via EVALSHA_RO): no eviction, no TTL refresh, no entry. Reading a window a thousand times
changes nothing a decision of lua/sliding_window.lua will see. Expired entries still in a list
are skipped, not trimmed.

KEYS  (n = #KEYS >= 1; every key shares one hash tag, so one Cluster slot)
  KEYS[i]       the log or slot counters of limit i, named as by the deciding script

ARGV  (3n + 1 integers, in decimal)
  ARGV[3i-2]    requests of limit i (>= 1)
  ARGV[3i-1]    window of limit i, in MICROseconds
  ARGV[3i]      resolution of limit i in MICROseconds, 0 for a log (see SLOTS in the deciding
                script)
  ARGV[3n+1]    the most entries to return per limit (the newest ones); >= 1

REPLY  an array of integers: now, then for each limit i a group of 4 + k values
  [1]           now: the script's clock, µs since the Unix epoch, with the same guard as the
                deciding script: max(Redis TIME, newest entry of any list of this call)
  count         entries in the window (t > now - window)
  remaining     max(requests - count, 0)
  reset         µs until one more slot frees, the deciding script's rule: the full window when
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
    if res > 0 then
        local s = call('GET', KEYS[i])
        local v = {}
        if s and #s >= 14 and (#s - 8) % 6 == 0 then
            local k = (#s - 8) / 6
            v = { struct.unpack('>d' .. string.rep('HI4', k), s) }
            v.k = k
            local newest = (v[1] + v[2 * k]) * res
            if newest > now then
                now = newest
            end
        end
        len[i] = v
    else
        local c = call('LLEN', KEYS[i])
        len[i] = c
        if c > 0 then
            local last = tonumber(call('LINDEX', KEYS[i], -1))
            if last > now then
                now = last
            end
        end
    end
end

local reply = { now }
for i = 1, n do
    local key, c = KEYS[i], len[i]
    local r, w, res = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
    if res > 0 then
        -- The counters of slots cur - n ..= cur (the deciding script's SLOTS rules).
        local oldest = floor(now / res) - w / res
        local count, pairs_ = 0, {}
        for p = 1, c.k or 0 do
            local slot = c[1] + c[2 * p]
            if slot >= oldest then
                count = count + c[2 * p + 1]
                pairs_[#pairs_ + 1] = slot * res
                pairs_[#pairs_ + 1] = c[2 * p + 1]
            end
        end
        local reset = w
        if count > 0 then
            local must, dropped = math.max(count + 1 - r, 1), 0
            for p = 2, #pairs_, 2 do
                dropped = dropped + pairs_[p]
                if dropped >= must then
                    reset = math.max(pairs_[p - 1] + res + w - now, 1)
                    break
                end
            end
        end
        reply[#reply + 1] = count
        reply[#reply + 1] = math.max(r - count, 0)
        reply[#reply + 1] = reset
        reply[#reply + 1] = #pairs_
        for p = 1, #pairs_ do
            reply[#reply + 1] = pairs_[p]
        end
    else
        local cutoff = now - w
        -- First in-window index: lists are sorted oldest first, so bisect (O(log c) reads).
        local lo, hi = 0, c
        while lo < hi do
            local mid = floor((lo + hi) / 2)
            if tonumber(call('LINDEX', key, mid)) <= cutoff then
                lo = mid + 1
            else
                hi = mid
            end
        end
        local first = lo
        local count = c - first
        local remaining, reset = r - count, w
        if remaining < 0 then
            remaining = 0
        end
        if count > 0 then
            local pivot = first
            if count > r then
                pivot = first + count - r
            end
            reset = tonumber(call('LINDEX', key, pivot)) + w - now
            if reset < 1 then
                reset = 1
            end
        end
        local k = count
        if k > cap then
            k = cap
        end
        reply[#reply + 1] = count
        reply[#reply + 1] = remaining
        reply[#reply + 1] = reset
        reply[#reply + 1] = k
        if k > 0 then
            local entries = call('LRANGE', key, c - k, -1)
            for j = 1, k do
                reply[#reply + 1] = tonumber(entries[j])
            end
        end
    end
end
return reply

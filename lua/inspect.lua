#!lua flags=no-writes
--[[
inspect.lua: read one bucket's sliding windows for the admin inspector. READ-ONLY.

It never writes (the `no-writes` flag makes Redis refuse any write, and lets it run on a replica
or via EVALSHA_RO): no eviction, no TTL refresh, no entry. Reading a window a thousand times
changes nothing a decision of lua/sliding_window.lua will see. Expired entries still in a list
are skipped, not trimmed.

KEYS  (n = #KEYS >= 1; every key shares one hash tag, so one Cluster slot)
  KEYS[i]       the log of limit i, "<prefix>:{<route>:<client>}:<window in ms>" (as the
                deciding script)

ARGV  (2n + 1 integers, in decimal)
  ARGV[2i-1]    requests of limit i (>= 1)
  ARGV[2i]      window of limit i, in MICROseconds
  ARGV[2n+1]    the most entries to return per limit (the newest ones); >= 1

REPLY  an array of integers: now, then for each limit i a group of 4 + k values
  [1]           now: the script's clock, µs since the Unix epoch, with the same guard as the
                deciding script: max(Redis TIME, newest entry of any list of this call)
  count         entries in the window (t > now - window)
  remaining     max(requests - count, 0)
  reset         µs until one more slot frees, the deciding script's rule: the full window when
                the window is empty, else (entry[count - requests], or the oldest, + window - now)
  k             number of entries that follow: min(count, cap)
  e1..ek        the newest k in-window entries, oldest first, µs since the Unix epoch
--]]

local call = redis.call
local floor = math.floor

local n = #KEYS
local cap = tonumber(ARGV[2 * n + 1])
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local len = {}
for i = 1, n do
    local c = call('LLEN', KEYS[i])
    len[i] = c
    if c > 0 then
        local last = tonumber(call('LINDEX', KEYS[i], -1))
        if last > now then
            now = last
        end
    end
end

local reply = { now }
for i = 1, n do
    local key, c = KEYS[i], len[i]
    local r, w = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
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
return reply

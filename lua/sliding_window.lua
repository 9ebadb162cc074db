--[[
sliding_window.lua: one exact sliding-window-log decision over every limit of a route.

Called once per request (EVALSHA), whatever the number of limits. The script is atomic, so
concurrent calls for the same bucket, from any number of proxies, never admit more than
`requests` in any window.

DATA
  One Redis LIST per limit. Each element is the Redis-clock timestamp, in integer microseconds
  since the Unix epoch, of one admitted request. New entries are appended at the tail (RPUSH)
  with a clock that never goes backwards within a bucket (see CLOCK), so every list is sorted
  oldest-first and the expired entries are always a prefix: eviction only ever trims the head.
  A list stores each entry as a listpack integer (about 10 bytes), against ~120 bytes for a
  sorted-set member, and duplicates are fine: two requests in the same microsecond are two
  entries.

KEYS  (n = #KEYS >= 1; every key must share one hash tag, so one Cluster slot)
  KEYS[i]       the log of limit i, "<prefix>:{<route>:<client>}:<window in ms>"

ARGV  (exactly 2n values, integers written in decimal)
  ARGV[2i-1]    requests of limit i: admitted requests allowed per window (>= 1)
  ARGV[2i]      window of limit i, in MICROseconds (>= 1000, a whole number of milliseconds)

REPLY  an array of 1 + 2n integers
  [1]           1 = admitted (recorded in every list), 0 = denied (recorded in none)
  [2i]          remaining of limit i: requests it would still admit right now, after this
                decision (0 when full)
  [2i+1]        reset of limit i, in MICROseconds from the script's `now`:
                  - list empty after the decision: the full window;
                  - limit full (remaining = 0): exactly the time until this limit admits
                    again, i.e. (oldest entry + window - now), or, when the list holds more
                    than `requests` entries because `requests` was lowered on a reload,
                    (entry[count - requests] + window - now);
                  - otherwise: (oldest entry + window - now), when one more slot frees.
                Always > 0 and <= window.

CLOCK
  now = max(Redis TIME, newest entry of any list of this call). Every proxy shares the one Redis
  clock; the max() keeps lists sorted if that clock steps backwards (NTP), at the price of
  freezing the window until the clock catches up. Because TTLs are measured on the wall clock
  (see TTL), a big step backwards heals after one window plus TTL_MARGIN_MS instead of lasting as
  long as the step.

TTL
  Every key written has a TTL of at most window + TTL_MARGIN_MS, and never expires while an
  entry is still in its window. PEXPIRE is a write that costs about as much as the RPUSH, so it
  is not sent on every admission but on the first push into each 500 ms epoch of the Redis
  clock (TTL_REFRESH_US), or into an empty list: the last PEXPIRE then happened less than
  500 ms before the newest entry, and window + TTL_MARGIN_MS from then is still more than
  400 ms after that entry leaves the window. A busy key gets at most 2 PEXPIREs a second.
  Denied calls write nothing and leave the TTL alone. Only the declared KEYS are touched.

WINDOW BOUNDS
  An entry at time t is in the window while t > now - window: it leaves exactly at t + window.
--]]

local TTL_MARGIN_MS = 1000
local TTL_REFRESH_US = 500000 -- 500 ms: must stay well below TTL_MARGIN_MS (see TTL)

local call = redis.call
local floor = math.floor

-- Redis 3.2 to 4.x replicate scripts verbatim and refuse writes after TIME unless told to
-- replicate effects. 5.0+ always do (7.x has no other mode); REDIS_VERSION_NUM exists from 7.0,
-- so on 7+ this costs one field lookup.
if redis.REDIS_VERSION_NUM == nil and redis.replicate_commands then
    redis.replicate_commands()
end

local n = #KEYS
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Pass 1: length, head and newest entry of every list (LLEN only when empty; LINDEX -1 only
-- when there are 2+ entries). `now` must be final before any eviction, and the clock guard
-- needs the newest entry of every list.
local len, head, newest = {}, {}, {}
for i = 1, n do
    local key = KEYS[i]
    local c = call('LLEN', key)
    len[i] = c
    if c > 0 then
        local h = tonumber(call('LINDEX', key, 0))
        local last = h
        if c > 1 then
            last = tonumber(call('LINDEX', key, -1))
        end
        head[i], newest[i] = h, last
        if last > now then
            now = last
        end
    end
end

-- Pass 2: evict each list's expired prefix, count, decide. Steady state costs nothing (head
-- still in the window) or one probe plus one LTRIM (one entry expired). A long expired prefix
-- is found by galloping then bisecting with LINDEX, so an idle client coming back to a full
-- 100k-entry list costs ~2 log2(100k) reads, not 100k pops.
local admitted = true
for i = 1, n do
    local c = len[i]
    if c > 0 then
        local cutoff = now - tonumber(ARGV[2 * i])
        if head[i] <= cutoff then
            local key = KEYS[i]
            if newest[i] <= cutoff then
                -- Everything expired.
                call('DEL', key)
                c = 0
            else
                -- Invariant: entry[lo] is expired, entry[hi] (value hv) is in the window.
                local lo, hi, hv = 0, c - 1, newest[i]
                local step = 1
                while lo + step < hi do
                    local v = tonumber(call('LINDEX', key, lo + step))
                    if v <= cutoff then
                        lo = lo + step
                        step = step * 2
                    else
                        hi, hv = lo + step, v
                        break
                    end
                end
                while hi - lo > 1 do
                    local mid = floor((lo + hi) / 2)
                    local v = tonumber(call('LINDEX', key, mid))
                    if v <= cutoff then
                        lo = mid
                    else
                        hi, hv = mid, v
                    end
                end
                -- entry[hi] is the first one in the window: drop the `hi` entries before it.
                call('LTRIM', key, hi, -1)
                c = c - hi
                head[i] = hv
            end
            len[i] = c
        end
    end
    if c >= tonumber(ARGV[2 * i - 1]) then
        admitted = false
    end
end

-- Pass 3: record in every list (admitted) or in none (denied), and build the reply.
local reply = { admitted and 1 or 0 }
for i = 1, n do
    local key = KEYS[i]
    local c, r, w = len[i], tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
    local oldest = head[i]
    if admitted then
        call('RPUSH', key, now)
        -- Refresh the TTL on the first push of each TTL_REFRESH_US epoch (see TTL).
        if c == 0 or floor(now / TTL_REFRESH_US) ~= floor(newest[i] / TTL_REFRESH_US) then
            call('PEXPIRE', key, math.ceil(w / 1000) + TTL_MARGIN_MS)
        end
        if c == 0 then
            oldest = now
        end
        c = c + 1
    end
    if c == 0 then
        reply[2 * i], reply[2 * i + 1] = r, w
    elseif c < r then
        reply[2 * i], reply[2 * i + 1] = r - c, oldest + w - now
    else
        -- Full: admits again once the count drops below r, i.e. when entry[c - r] leaves
        -- (the oldest, unless `requests` was lowered by a reload).
        if c > r then
            oldest = tonumber(call('LINDEX', key, c - r))
        end
        reply[2 * i], reply[2 * i + 1] = 0, oldest + w - now
    end
end
return reply

--[[
sliding_window.lua: exact sliding-window-log decisions, each over every limit of a route.

One call decides one request or a batch of them (the store coalesces the decisions pending at
the same instant for one Redis into one EVALSHA: one dispatch and one TIME for all). The script
is atomic, so concurrent calls for the same bucket, from any number of proxies, never admit more
than `requests` in any window. The decisions of one call run in order, each seeing the writes of
the ones before it (two requests of one client in a batch are two decisions, like two calls).

DATA
  One Redis LIST per limit. Each element is the Redis-clock timestamp, in integer microseconds
  since the Unix epoch, of one admitted request. New entries are appended at the tail (RPUSH)
  with a clock that never goes backwards within a bucket (see CLOCK), so every list is sorted
  oldest-first and the expired entries are always a prefix: eviction only ever trims the head.
  A list stores each entry as a listpack integer (about 10 bytes), against ~120 bytes for a
  sorted-set member, and duplicates are fine: two requests in the same microsecond are two
  entries.

KEYS  (the lists of every decision, in order; a Cluster call carries one decision, whose keys
      share one hash tag, so one slot)
  the n_d keys of decision d, one per limit: "<prefix>:{<route>:<client>}:<window in ms>" for
  a log, "...:<window in ms>@<resolution in ms>" for slots

ARGV  (per decision d, in the same order: 1 + 3 n_d values, integers written in decimal)
  n_d           number of limits of decision d (>= 1); its keys are the next n_d of KEYS
  then per limit i of d:
    requests    admitted requests allowed per window (>= 1)
    window      window length in MICROseconds (>= 1000, a whole number of milliseconds)
    resolution  0: the limit is an exact log (DATA); else its slot length in MICROseconds, a
                whole number of milliseconds dividing `window` (see SLOTS)
  ARGV that does not account for exactly every key is an error reply (a caller bug).

REPLY  one binary string of integers, each an IEEE 754 double, 8 bytes, big endian
       (struct.pack '>d': exact for integers below 2^53); when a decision failed, an array of
       that string then one error message per failed decision, in order. One string, not an
       array of RESP integers: the client parses one value instead of 3 per limit (redis-rs
       spends ~1.5k instructions per value), and packing Lua's numbers as doubles needs no
       decimal formatting in Redis. The integers are, per decision d, in order, 1 + 2 n_d:
  status        > 0: admitted (recorded in every limit of d), and the value is the decision's
                `now` in µs, the time every entry of it carries (what a refund names: see
                lua/refund.lua); 0 = denied (recorded in none); -1 = this decision failed
                (e.g. a key of another type; its message follows the string) and the rest
                are 0. Other decisions of the call are unaffected.
  then per limit i of d:
    remaining   requests it would still admit right now, after this decision (0 when full)
    reset       in MICROseconds from the decision's `now`:
                  - list empty after the decision: the full window;
                  - limit full (remaining = 0): exactly the time until this limit admits
                    again, i.e. (oldest entry + window - now), or, when the list holds more
                    than `requests` entries because `requests` was lowered on a reload,
                    (entry[count - requests] + window - now);
                  - otherwise: (oldest entry + window - now), when one more slot frees.
                Always > 0 and <= window (slots: <= window + resolution, see SLOTS).

CLOCK
  now = max(Redis TIME, newest entry of any list of this decision). Every proxy shares the one Redis
  clock; the max() keeps lists sorted if that clock steps backwards (NTP), at the price of
  freezing the window until the clock catches up. Redis keeps expiries as absolute wall-clock
  times, so a TTL does not shorten that: after a step back of X, a bucket that was full stays
  full for up to X longer (nothing is ever admitted beyond the limit; clients of that bucket wait).
  The newest entry is read only when it could be ahead of TIME. Every admission evicts what
  left the window before it pushes, so each list keeps the invariant newest < head + window
  (its window is fixed: it is part of the key). So when the head has left the window by TIME,
  i.e. head + window <= TIME, the newest entry is behind TIME and cannot move `now`: the steady
  state with eviction needs no read of the tail.

TTL
  Every key written has a TTL of at most window + TTL_MARGIN_MS, and never expires while an
  entry is still in its window. PEXPIRE is a write that costs about as much as the RPUSH, so it
  is not sent on every admission but on the first push into each 500 ms epoch of the Redis
  clock (TTL_REFRESH_US), or into an empty list: the last PEXPIRE then happened at or after the
  start of the newest entry's epoch, less than 500 ms before it, and window + TTL_MARGIN_MS from
  then is still more than 400 ms after that entry leaves the window. A busy key gets at most 2
  PEXPIREs a second. Whether the last PEXPIRE was in this epoch is known without a read when the
  newest entry was read, or when the first entry left in the window is already in this epoch
  (the newest is between the two); otherwise one PTTL (an integer reply, the cheapest call)
  tells when the TTL was last set. Only the declared KEYS are touched.

DENIAL
  A denied call writes nothing at all: it records nothing, refreshes no TTL and evicts nothing.
  Its counts and resets are computed from reads alone (expired entries are skipped, not
  trimmed); the next admitted call evicts them, or the key's TTL does.

SLOTS  (a limit with a resolution: bounded memory whatever the rate)
  One Redis STRING per limit, packed with struct.pack('>d' .. ('HI4' x k)): the index `first`
  of its oldest non-empty slot (slot s holds the admissions of [s res, (s+1) res) on the
  script's clock; 8 bytes, exact below 2^53), then k >= 1 pairs, oldest first, of a slot's
  offset from `first` (2 bytes) and its counter (> 0, 4 bytes), big endian: only non-empty
  slots are stored. With n = window / resolution, the slots that overlap (now - window, now]
  are cur - n ..= cur (cur = floor(now / res)): k <= n + 1 and offsets <= n <= 1000, so a
  client costs at most 8 + 6 (n + 1) bytes of value however fast it sends (74 B at 1 s /
  100 ms), and no more than 6 bytes per admission when it sends slowly.
  A decision admits only if the sum over those slots is below `requests`. Every admission in
  any window (a, a + window] is counted by the last of them, so no window ever holds more than
  `requests`; the oldest slot may hold admissions that already left the window, so a limit may
  refuse up to one slot early: a refusal at `now` means `requests` admissions in
  (now - window - resolution, now]. An admission rewrites the whole string with one
  SET .. PX (window + resolution in ms + TTL_MARGIN_MS): a counter stays counted until
  (s + 1) res + window, at most window + resolution after it was written. A denial writes
  nothing. `remaining` is requests - sum (0 when full); `reset` is when enough of the oldest
  slots have left for the sum to drop below `requests` (full), or when the oldest leaves (not
  full), or the window (empty): (s + 1) res + window - now, at least 1. The clock guard holds
  too: now >= the start of the newest slot of any limit of the decision. The memory store
  implements the same rules (src/limiter/slots.rs); a key of another type, or a string of
  another shape, fails the decision as for a log.
  Cost: GET, then SET when admitted (TIME once per call), and Lua work linear in k.

WINDOW BOUNDS
  An entry at time t is in the window while t > now - window: it leaves exactly at t + window.

COST
  Each redis.call is a full command inside Redis. Measured with callgrind on Redis 7.0: about 3k
  instructions for an integer reply (LLEN, PTTL), 4.5k for a string (LINDEX, LPOP) or a push,
  6.6k for TIME, 1k to turn a 16-digit string into a number, 1.2k per Lua table, against 21k
  for an EVALSHA that calls nothing (scripts/bench-script measures the whole in us): the
  dispatch and TIME are most of a one-limit decision's cost, which is why calls are batched. The
  sequence, per call, then per decision and list:
    TIME                  once per call
    LLEN                  count (0: nothing more to read)
    LINDEX 0              the head
    LINDEX -1             the newest entry, only with 2+ entries and a head that has not left
                          the window by TIME (the newest may then be ahead of TIME, see CLOCK)
    LINDEX 1              only when the head has left: is the next entry in the window?
  and, admitted, per list:
    LPOP                  one entry slid out (LTRIM when more did, DEL when all did)
    RPUSH
    PTTL                  when the newest entry was not read and the first entry left in the
                          window is in an earlier TTL epoch (windows of 500 ms and more)
    PEXPIRE               at most twice a second (see TTL)
  Steady state, one limit evicting one entry per decision: TIME LLEN LINDEX 0 LINDEX 1 LPOP RPUSH
  (+ PTTL for windows >= 500 ms); not evicting: TIME LLEN LINDEX 0 LINDEX -1 RPUSH; denied:
  TIME LLEN LINDEX 0 LINDEX -1. A longer expired prefix is found by reading the newest entry,
  then galloping and bisecting with LINDEX, so an idle client coming back to a full 100k-entry
  list costs ~2 log2(100k) reads, not 100k pops. Arguments of the hot calls are Lua strings: a
  Lua number argument costs a float-to-decimal conversion inside Redis, so `now` is pushed as
  the string it was read or built as.
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

local keys, argv = KEYS, ARGV
local t = call('TIME')
-- Arithmetic coerces the decimal strings; every value here is exact in a double (< 2^53).
local time = t[1] * 1000000 + t[2]
-- TIME as the decimal string of µs RPUSH stores (built once per call, when first needed).
local time_str = nil

-- Scratch, 6 slots per limit, shared by the decisions of this call (one table: each table is
-- an allocation plus GC work):
--   st[6i-5] entries in the list           st[6i-2] window (µs)
--   st[6i-4] head, then first entry left   st[6i-1] expired entries at the head
--            in the window (false: none)   st[6i]   requests
--   st[6i-3] newest entry (false: not read, because it cannot be ahead of TIME)
local st = { 0, 0, 0, 0, 0, 0 }
local reply = { 0, 0, 0 }
-- Messages of failed decisions (nil: none failed).
local errors = nil

-- The shape of ARGV is checked before anything is decided: a caller bug decides nothing. (No
-- function is defined and no pcall made per call: each closure is an allocation, and Redis runs
-- this whole body on every call.)
local nk, na = #keys, #argv
if na ~= 3 * nk + 1 or tonumber(argv[1]) ~= nk then
    local k0, a0 = 0, 0
    while a0 < na do
        local n = tonumber(argv[a0 + 1])
        if n == nil or n < 1 or k0 + n > nk or a0 + 1 + 3 * n > na then
            return redis.error_reply('sliding_window: ARGV does not match KEYS at ARGV[' .. (a0 + 1) .. ']')
        end
        k0, a0 = k0 + n, a0 + 1 + 3 * n
    end
    if k0 ~= nk then
        return redis.error_reply('sliding_window: ' .. nk .. ' KEYS, ARGV names ' .. k0)
    end
end

-- Decision by decision: the n keys KEYS[k0+1 .. k0+n], with (requests, window, resolution)
-- triples at ARGV[a0+1 .. a0+3n]; 1 + 2n reply values at reply[r0+1 .. r0+1+2n]. A log keeps
-- its scratch in st as described above; a slotted limit keeps there:
--   st[6i-5] its pairs as unpacked (false: no key)   st[6i-2] window (µs)
--   st[6i-4] k, the number of pairs                 st[6i-1] sum over the window
--   st[6i-3] the first pair in the window           st[6i]   requests
local k0, a0, r0 = 0, 1, 0
while a0 <= na do
    local n = argv[a0] + 0
    local now = time
    -- `now` as the decimal string RPUSH stores, when the clock guard set it (see pass 3).
    local now_s = nil

    local failed = false

    -- Pass 1: length, head and, when it may matter, newest entry of every list. `now` must be
    -- final before anything is compared with a cutoff.
    for i = 1, n do
        local key, j = keys[k0 + i], 6 * i
        local w, res = argv[a0 + 3 * i - 1] + 0, argv[a0 + 3 * i] + 0
        if res > 0 then
            -- SLOTS: one GET; a key of another type or shape fails this decision alone.
            local s = redis.pcall('GET', key)
            if type(s) == 'table' then
                failed = s.err or 'GET failed'
                break
            end
            local v, kk = false, 0
            if s then
                if #s < 14 or (#s - 8) % 6 ~= 0 then
                    failed = 'sliding_window: ' .. key .. ' holds no slot counters'
                    break
                end
                kk = (#s - 8) / 6
                v = { struct.unpack('>d' .. string.rep('HI4', kk), s) }
                local newest = (v[1] + v[2 * kk]) * res
                if newest > now then
                    -- Formatted when a log limit of this decision needs it (pass 3).
                    now, now_s = newest, nil
                end
            end
            st[j - 5], st[j - 4], st[j - 2] = v, kk, w
        else
            -- A key of another type fails this decision alone (it has written nothing yet);
            -- its neighbours in the same call still get their answers.
            local c = redis.pcall('LLEN', key)
            if type(c) == 'table' then
                failed = c.err or 'LLEN failed'
                break
            end
            local h, last = false, false
            if c > 0 then
                local s = call('LINDEX', key, '0')
                h = s + 0
                if c == 1 then
                    last = h
                elseif h + w > time then
                    -- The head is still in the window by TIME (or ahead of it): so may the newest
                    -- be.
                    s = call('LINDEX', key, '-1')
                    last = s + 0
                end
                -- Otherwise the head left the window by TIME, and the newest entry is before
                -- head + window (see CLOCK), so before TIME: it cannot move `now`.
                if last and last > now then
                    now, now_s = last, s
                end
            end
            st[j - 5], st[j - 4], st[j - 3], st[j - 2] = c, h, last, w
        end
    end

    if failed then
        reply[r0 + 1] = -1
        for j = r0 + 2, r0 + 1 + 2 * n do
            reply[j] = 0
        end
        errors = errors or {}
        errors[#errors + 1] = failed
    else
        -- Pass 2, reads only: expired entries at the head of each list, first entry left in the
        -- window, count, decision. Nothing is written yet, so a denial leaves every list as it is.
        local admitted = true
        for i = 1, n do
            local j = 6 * i
            local r, res = argv[a0 + 3 * i - 2] + 0, argv[a0 + 3 * i] + 0
            if res > 0 then
                -- SLOTS: the counters of cur - n ..= cur, i.e. from pair `from` on.
                local v, kk, sum, from = st[j - 5], st[j - 4], 0, 1
                if v then
                    local oldest = floor(now / res) - st[j - 2] / res
                    while from <= kk and v[1] + v[2 * from] < oldest do
                        from = from + 1
                    end
                    for p = from, kk do
                        sum = sum + v[2 * p + 1]
                    end
                end
                st[j - 3], st[j - 1], st[j] = from, sum, r
                if sum >= r then
                    admitted = false
                end
            else
                local c, h, last = st[j - 5], st[j - 4], st[j - 3]
                local e = 0
                if c > 0 and h <= now - st[j - 2] then
                    local key, cutoff = keys[k0 + i], now - st[j - 2]
                    if c == 1 then
                        e, h = 1, false
                    elseif last and last <= cutoff then
                        e, h = c, false
                    else
                        -- Invariant: entry[lo] is expired; entry[hi] (value hv) is in the window,
                        -- or hi = c when no entry is known to be.
                        local lo, hi, hv = 0, c, false
                        if last then
                            hi, hv = c - 1, last
                        end
                        if hi > 1 then
                            local v = call('LINDEX', key, '1') + 0
                            if v > cutoff then
                                hi, hv = 1, v
                            else
                                lo = 1
                                if not last then
                                    -- Two or more entries slid out: an idle client may come back to
                                    -- a long list that expired entirely, which the newest entry
                                    -- tells.
                                    last = call('LINDEX', key, '-1') + 0
                                    st[j - 3] = last
                                    if last <= cutoff then
                                        lo = c - 1
                                    else
                                        hi, hv = c - 1, last
                                    end
                                end
                                local step = 2
                                while lo + step < hi do
                                    v = call('LINDEX', key, lo + step) + 0
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
                                    v = call('LINDEX', key, mid) + 0
                                    if v <= cutoff then
                                        lo = mid
                                    else
                                        hi, hv = mid, v
                                    end
                                end
                            end
                        end
                        -- entry[hi] is the first one in the window: the `hi` entries before it are
                        -- gone.
                        e, h = hi, hv
                    end
                end
                st[j - 4], st[j - 1], st[j] = h, e, r
                if c - e >= r then
                    admitted = false
                end
            end
        end

        -- Pass 3: record in every list (admitted) or in none (denied), and build the reply.
        if admitted then
            reply[r0 + 1] = now
            if now_s == nil and now > time then
                -- A slot ahead of TIME moved the clock (see SLOTS).
                now_s = string.format('%.0f', now)
            elseif now_s == nil then
                if time_str == nil then
                    -- TIME's microseconds come without leading zeros.
                    local us = t[2]
                    if #us < 6 then
                        us = string.sub('00000', #us) .. us
                    end
                    time_str = t[1] .. us
                end
                now_s = time_str
            end
            local epoch = now - now % TTL_REFRESH_US -- start of the current TTL epoch
            for i = 1, n do
                local key, j = keys[k0 + i], 6 * i
                if argv[a0 + 3 * i] + 0 == 0 then
                    local c, h, last, w, e = st[j - 5], st[j - 4], st[j - 3], st[j - 2], st[j - 1]
                    local k = c - e -- in the window, before this push
                    if k == 0 then
                        if e > 0 then
                            call('DEL', key)
                        end
                    elseif e == 1 then
                        call('LPOP', key)
                    elseif e > 1 then
                        call('LTRIM', key, e, -1)
                    end
                    call('RPUSH', key, now_s)
                    -- Refresh the TTL on the first push of each epoch, or when the push created the
                    -- key (see TTL): the newest entry tells, or the first one left in the window
                    -- when it is already in this epoch; otherwise PTTL tells when the TTL was last
                    -- set.
                    local refresh
                    if k == 0 then
                        refresh = true
                    elseif last then
                        refresh = last < epoch
                    elseif h >= epoch then
                        refresh = false
                    else
                        refresh = time + call('PTTL', key) * 1000 - w - TTL_MARGIN_MS * 1000 < epoch
                    end
                    if refresh then
                        call('PEXPIRE', key, math.ceil(w / 1000) + TTL_MARGIN_MS)
                    end
                    -- Admitted means k < requests; when it is now full, the oldest entry is the one
                    -- whose leaving frees a slot.
                    reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = st[j] - k - 1, (h or now) + w - now
                end
            end
        else
            reply[r0 + 1] = 0
            for i = 1, n do
                local j = 6 * i
                if argv[a0 + 3 * i] + 0 == 0 then
                    local h, w, e, r = st[j - 4], st[j - 2], st[j - 1], st[j]
                    local k = st[j - 5] - e
                    if k == 0 then
                        reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = r, w
                    elseif k < r then
                        reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = r - k, h + w - now
                    else
                        -- Full: admits again once the count drops below r, i.e. when entry[k - r]
                        -- of the window leaves (the oldest, unless `requests` was lowered by a
                        -- reload). Nothing was trimmed, so it sits at index e + k - r of the stored
                        -- list.
                        if k > r then
                            h = call('LINDEX', keys[k0 + i], e + k - r) + 0
                        end
                        reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = 0, h + w - now
                    end
                end
            end
        end

        -- SLOTS, admitted or denied: rewrite the counters (admitted only) and answer.
        for i = 1, n do
            local res = argv[a0 + 3 * i] + 0
            if res > 0 then
                local j = 6 * i
                local v, kk, from, w = st[j - 5], st[j - 4], st[j - 3], st[j - 2]
                local sum, r, cur = st[j - 1], st[j], floor(now / res)
                if admitted then
                    -- The window's (slot, counter) pairs, plus one in slot `cur`; then the
                    -- slots as offsets from the first.
                    local o = {}
                    if v then
                        for p = from, kk do
                            o[#o + 1], o[#o + 2] = v[1] + v[2 * p], v[2 * p + 1]
                        end
                    end
                    if #o > 0 and o[#o - 1] == cur then
                        o[#o] = o[#o] + 1
                    else
                        o[#o + 1], o[#o + 2] = cur, 1
                    end
                    local first = o[1]
                    for q = 1, #o, 2 do
                        o[q] = o[q] - first
                    end
                    local packed = struct.pack('>d' .. string.rep('HI4', #o / 2), first, unpack(o))
                    local ttl = math.ceil((w + res) / 1000) + TTL_MARGIN_MS
                    call('SET', keys[k0 + i], packed, 'PX', ttl)
                    sum = sum + 1
                end
                -- Full: when enough of the oldest slots left for the sum to drop below r; else
                -- when the oldest leaves (the slot of this admission if it is the only one).
                local reset = w
                if sum > 0 then
                    local must, at, dropped = sum + 1 - r, cur, 0
                    if must < 1 then
                        must = 1
                    end
                    if v then
                        for p = from, kk do
                            dropped = dropped + v[2 * p + 1]
                            if dropped >= must then
                                at = v[1] + v[2 * p]
                                break
                            end
                        end
                    end
                    reset = (at + 1) * res + w - now
                    if reset < 1 then
                        reset = 1
                    end
                end
                if sum > r then
                    sum = r
                end
                reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = r - sum, reset
            end
        end
    end
    k0, a0, r0 = k0 + n, a0 + 1 + 3 * n, r0 + 1 + 2 * n
end

-- One binary string; an array only when a decision failed (one table less per call).
local packed = struct.pack('>' .. string.rep('d', #reply), unpack(reply))
if errors == nil then
    return packed
end
return { packed, unpack(errors) }

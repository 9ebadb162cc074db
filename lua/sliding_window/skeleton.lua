--[[
sliding_window (lua/sliding_window/skeleton.lua with lua/kinds/*.lua): exact sliding-window
decisions, each over every limit of a route, for every kind of limit (lua/kinds/log/: the
exact log; lua/kinds/slots/: slotted counters).

One call decides one request or a batch of them (the store coalesces the decisions pending at
the same instant for one Redis into one EVALSHA: one dispatch and one TIME for all). The script
is atomic, so concurrent calls for the same bucket, from any number of proxies, never admit more
than `requests` in any window. The decisions of one call run in order, each seeing the writes of
the ones before it (two requests of one client in a batch are two decisions, like two calls).

KEYS  (the lists of every decision, in order; a Cluster call carries one decision, whose keys
      are all in one Cluster hash slot)
  the n_d keys of decision d, one per limit, each in its limit's bucket (a limit with a key of
  its own counts in another bucket than the route's; on a Cluster the limits of other slots
  are decided in calls of their own): "<prefix>:{<bucket>}:<window in ms>" for a log,
  "...:<window in ms>@<resolution in ms>" for slots ("...c" for a cost limit),
  "...:<lease_ttl in ms>c" for a concurrency limit's leases, "...:<per>@<time zone>" for a
  calendar quota ("...c" for one of cost units)

ARGV  (per decision d, in the same order: 1 + 4 n_d values, integers written in decimal, or
      the one value "=")
  n_d           number of limits of decision d (>= 1); its keys are the next n_d of KEYS;
                or "=": decision d has the limits of decision d-1, the same number with the
                same values, and none follow (its keys still do). A batch is mostly one
                route's requests: each decision after the first then costs Redis one value to
                read instead of 1 + 4 n_d (about 1k instructions each, parsed, made an object,
                pushed into Lua). The first decision cannot be "=".
  then per limit i of d:
    requests    admitted requests allowed per window (>= 1)
    window      window length in MICROseconds (>= 1000, a whole number of milliseconds); a
                calendar quota's: the end of the proxy's period in ms (see CALENDAR)
    resolution  the kind of limit, and its parameter: 0, an exact log (DATA); 1, leases (the
                log's sections); >= 1000, slots of that length in MICROseconds, a whole number
                of milliseconds dividing `window` (see SLOTS); < 0, a calendar quota, the
                lengths of the proxy's period and the next (see CALENDAR); 2 to 999 are free
    weight      what this decision's admission counts in the limit (>= 0): 1, or in a cost
                limit (slots) the request's cost; the limit admits only if what it counts plus
                `weight` is at most `requests` (weight 1: count < requests), and a denied
                decision answers `remaining` 0 on a limit its weight did not fit. A log's is 1.
  ARGV that does not account for exactly every key is an error reply (a caller bug).

REPLY  one binary string of integers, each an IEEE 754 double, 8 bytes, big endian
       (struct.pack '>d': exact for integers below 2^53); when a decision failed, an array of
       that string then one error message per failed decision, in order. One string, not an
       decimal formatting in Redis. The integers are, per decision d, in order, 1 + 2 n_d:
  status        > 0: admitted (recorded in every limit of d), and the value is the decision's
                `now` in µs, the time every entry of it carries (what a refund names: see
                lua/refund/skeleton.lua); 0 = denied (recorded in none); -1 = this decision failed
                (e.g. a key of another type; its message follows the string) and the rest
                are 0. Other decisions of the call are unaffected.
  then per limit i of d:
    remaining   requests it would still admit right now, after this decision (0 when full)
    reset       in MICROseconds from the decision's `now`: the full window when nothing is
                counted after the decision; when the limit is full (remaining = 0), exactly
                the time until it admits again; otherwise when the oldest counted request
                leaves. Always > 0 and <= window (slots: <= window + resolution). Each kind
                details it (lua/kinds/log/: DATA; lua/kinds/slots/: SLOTS).
  These three are every field the reply carries (docs/redis.md names the same).

ASSEMBLY, REPEATS, RUNS, CLOCK, DENIAL and COST: lua/sliding_window/README.md (the design;
this header is the interface).
--]]
-- @each-kind doc

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

-- 10 cells per limit, shared by the decisions of this call (one table: each table is an
-- allocation plus GC work). Limit i's cells are st[j-9 .. j], j = 10i:
--   st[j-9 .. j-6]  its numbers, requests, window, kind and weight, converted from ARGV once
--                   when a decision is written in full and kept for the decisions written "="
--                   after it (an ARGV value is a string: each `+ 0` on one runs strtod, and the
--                   passes below read each number two or three times)
--   st[j-5 .. j]    its scratch, laid out by its kind (see the kind's file,
--                   lua/kinds/<kind>.lua)
local st = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
local reply = { 0, 0, 0 }
-- Messages of failed decisions (nil: none failed).
local errors = nil

-- The shape of ARGV is checked before anything is decided: a caller bug decides nothing. (No
-- function is defined and no pcall made per call: each closure is an allocation, and Redis runs
-- this whole body on every call.)
local nk, na = #keys, #argv
if na ~= 4 * nk + 1 or tonumber(argv[1]) ~= nk then
    local k0, a0, n = 0, 0, nil
    while a0 < na do
        if argv[a0 + 1] == '=' and n then
            -- One value, n more keys: counting too many keys is caught once, below.
            k0, a0 = k0 + n, a0 + 1
        else
            n = tonumber(argv[a0 + 1])
            local step = 1 + 4 * (n or 0)
            if n == nil or n < 1 or k0 + n > nk or a0 + step > na then
                return redis.error_reply('sliding_window: ARGV does not match KEYS at ARGV[' .. (a0 + 1) .. ']')
            end
            k0, a0 = k0 + n, a0 + step
        end
    end
    if k0 ~= nk then
        return redis.error_reply('sliding_window: ' .. nk .. ' KEYS, ARGV names ' .. k0)
    end
end

-- What a kind learned of a key from an earlier decision of this call, so that the next decision
-- on that key need not read it again (REPEATS): `seen[key]` is the index in `known` of its
-- cells, laid out by the kind. Only a batch has repeats, so a call of one decision allocates
-- neither table.
local seen, known = nil, nil
-- Entries a kind holds back to append in one RPUSH per key at the end of the call
-- (`pending[key]`: the values, in order); a kind appends what is held back before it reads the
-- key's stored entries.
local pending = nil
-- Commands a kind holds back to send once, in order, at the end of the call (`writes[q]`: a
-- command and its arguments, which the kind may still change in place until then): a key
-- rewritten whole by several decisions of the call is written once (see REPEATS).
local writes = nil
if na > 4 * (argv[1] + 0) + 1 then
    seen, known, pending, writes = {}, {}, {}, {}
end

-- Decision by decision: the n keys KEYS[k0+1 .. k0+n], with their numbers in `st`, read from
-- ARGV[a0+1 .. a0+4n] where ARGV[a0] is the count n of this decision or, when it is "=", kept
-- from the decision before (as n is); 1 + 2n reply values at reply[r0+1 .. r0+1+2n]. a0 moves
-- past the decision's ARGV as soon as it is read.
local k0, a0, r0, n = 0, 1, 0, 0
while a0 <= na do
    local n_d = argv[a0]
    if n_d == '=' then
        a0 = a0 + 1
    else
        n = n_d + 0
        for i = 1, n do
            local j, a = 10 * i, a0 + 4 * i
            st[j - 9], st[j - 8], st[j - 7], st[j - 6] = argv[a - 3] + 0, argv[a - 2] + 0, argv[a - 1] + 0, argv[a] + 0
        end
        a0 = a0 + 1 + 4 * n
    end
    local now = time
    -- `now` as the decimal string RPUSH stores, when the clock guard set it (see pass 3).
    local now_s = nil

    local failed = false

    -- Pass 1: what each limit holds, and the newest entry where it may matter. `now` must be
    -- final before anything is compared with a cutoff. A failure (a key of another type or
    -- shape) fails this decision alone, before it has written anything.
    for i = 1, n do
        local key, j = keys[k0 + i], 10 * i
        local w, res = st[j - 8], st[j - 7]
        -- @each-kind read
    end

    if failed then
        reply[r0 + 1] = -1
        for j = r0 + 2, r0 + 1 + 2 * n do
            reply[j] = 0
        end
        errors = errors or {}
        errors[#errors + 1] = failed
    else
        -- Pass 2, reads only: what each limit counts at `now`, and the decision. Nothing is
        -- written yet, so a denial leaves every key as it is.
        local admitted = true
        for i = 1, n do
            local j = 10 * i
            local r, res, wt = st[j - 9], st[j - 7], st[j - 6]
            -- @each-kind decide
        end

        -- Pass 3: record in every limit (admitted) or in none (denied), and answer.
        local epoch = 0
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
            epoch = now - now % TTL_REFRESH_US -- start of the current TTL epoch (see the log's TTL)
        else
            reply[r0 + 1] = 0
        end
        for i = 1, n do
            local key, j = keys[k0 + i], 10 * i
            local res, wt = st[j - 7], st[j - 6]
            -- @each-kind answer
        end

        -- RUNS (see the head): the decisions right after this one that repeat it ("=", the
        -- same keys).
        local m, kb = 0, k0 + n
        while argv[a0] == '=' do
            local i = 1
            while i <= n and keys[kb + i] == keys[k0 + i] do
                i = i + 1
            end
            if i <= n then
                break
            end
            m, kb, a0 = m + 1, kb + n, a0 + 1
        end
        if m > 0 then
            -- How many of them are admitted: every one after a denial is denied alike; after an
            -- admission, as many as each limit still admits (-1: a kind decides each in full).
            local fit = 0
            if admitted then
                fit = m
                for i = 1, n do
                    local j = 10 * i
                    local r, res, wt = st[j - 9], st[j - 7], st[j - 6]
                    -- @each-kind run-fit
                end
            end
            if fit < 0 then
                -- Not a run after all: the repeats are decided one by one, as any decision.
                a0 = a0 - m
            else
                local size = 1 + 2 * n
                for q = 1, m do
                    reply[r0 + q * size + 1] = q <= fit and now or 0
                end
                if admitted then
                    for i = 1, n do
                        local key, j = keys[k0 + i], 10 * i
                        local r, res, wt = st[j - 9], st[j - 7], st[j - 6]
                        -- @each-kind run-answer
                    end
                else
                    for q = 1, m do
                        for v = 2, size do
                            reply[r0 + q * size + v] = reply[r0 + v]
                        end
                    end
                end
                k0, r0 = k0 + m * n, r0 + m * size
            end
        end
    end
    k0, r0 = k0 + n, r0 + 1 + 2 * n
end

-- What was held back, one RPUSH per key, then each rewrite (see REPEATS).
if pending then
    for key, values in pairs(pending) do
        call('RPUSH', key, unpack(values))
    end
    for q = 1, #writes do
        call(unpack(writes[q]))
    end
end

-- One binary string; an array only when a decision failed (one table less per call).
local packed = struct.pack('>' .. string.rep('d', #reply), unpack(reply))
if errors == nil then
    return packed
end
return { packed, unpack(errors) }

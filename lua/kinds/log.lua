--[[
KIND log: the exact sliding-window log (ARGV resolution 0, the default; src/limiter/algo/log.rs)

DATA
  One Redis LIST per limit. Each element is the Redis-clock timestamp, in integer microseconds
  since the Unix epoch, of one admitted request. New entries are appended at the tail (RPUSH)
  with a clock that never goes backwards within a bucket (see CLOCK), so every list is sorted
  oldest-first and the expired entries are always a prefix: eviction only ever trims the head.
  A list stores each entry as a listpack integer (about 10 bytes), against ~120 bytes for a
  sorted-set member, and duplicates are fine: two requests in the same microsecond are two
  entries.

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

WINDOW BOUNDS
  An entry at time t is in the window while t > now - window: it leaves exactly at t + window.

COST  (TIME apart, see the head) The sequence, per decision and list:
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
  A later decision of the same call on a list this call admitted into reads nothing (REPEATS in
  the head): its length, head and newest entry are known from the admission, and its entry is
  held back, so a client's admissions in one call cost one RPUSH between them. Repeats right
  after an admission (RUNS in the head) are counted, not decided: the list admits until it holds
  `requests`, every answer's reset is when the oldest entry in the window leaves.
  Steady state, one limit evicting one entry per decision: TIME LLEN LINDEX 0 LINDEX 1 LPOP RPUSH
  (+ PTTL for windows >= 500 ms); not evicting: TIME LLEN LINDEX 0 LINDEX -1 RPUSH; denied:
  TIME LLEN LINDEX 0 LINDEX -1. A longer expired prefix is found by reading the newest entry,
  then galloping and bisecting with LINDEX, so an idle client coming back to a full 100k-entry
  list costs ~2 log2(100k) reads, not 100k pops.

CLOCK  The newest entry is read only when it could be ahead of TIME. Every admission evicts
  what left the window before it pushes, so each list keeps the invariant newest < head +
  window (its window is fixed: it is part of the key). So when the head has left the window by
  TIME, i.e. head + window <= TIME, the newest entry is behind TIME and cannot move `now`: the
  steady state with eviction needs no read of the tail.

  Scratch of limit i (its cells of `st`, j = 10i, see the skeleton):
    st[j-5] entries in the list          st[j-3] newest entry (false: not read, because
    st[j-4] head, then first entry left          it cannot be ahead of TIME)
            in the window (false: none)  st[j-1] expired entries at the head
  (its window and requests are the skeleton's st[j-8] and st[j-9])
--]]
-- @when default
-- @section read
            local m = seen and seen[key]
            local c, h, last, s
            if m then
                -- Admitted into earlier in this call (see REPEATS): its length, head and newest
                -- entry (with the string it was pushed as) are known.
                c, h, last, s = known[m], known[m + 1], known[m + 2], known[m + 3]
            else
                -- A key of another type fails this decision alone (it has written nothing yet);
                -- its neighbours in the same call still get their answers.
                c = redis.pcall('LLEN', key)
                if type(c) == 'table' then
                    failed = c.err or 'LLEN failed'
                    break
                end
                h, last = false, false
            end
            if m then
                if last > now then
                    now, now_s = last, s
                end
            elseif c > 0 then
                s = call('LINDEX', key, '0')
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
            st[j - 5], st[j - 4], st[j - 3] = c, h, last
-- @section decide
                -- Expired entries at the head of the list, first entry left in the window, count.
                local c, h, last = st[j - 5], st[j - 4], st[j - 3]
                local e = 0
                if c > 0 and h <= now - st[j - 8] then
                    local key, cutoff = keys[k0 + i], now - st[j - 8]
                    local held = pending and pending[key]
                    if held then
                        -- Entries are about to be read by index: append what was held back.
                        call('RPUSH', key, unpack(held))
                        pending[key] = nil
                    end
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
                st[j - 4], st[j - 1] = h, e
                if c - e >= r then
                    admitted = false
                end
-- @section answer
                if admitted then
                    local c, h, last, w, e = st[j - 5], st[j - 4], st[j - 3], st[j - 8], st[j - 1]
                    local k = c - e -- in the window, before this push
                    if e > 0 then
                        if k == 0 then
                            call('DEL', key)
                        elseif e == 1 then
                            call('LPOP', key)
                        else
                            -- '-1', not -1: a Lua number argument costs Redis a float formatting.
                            call('LTRIM', key, e, '-1')
                        end
                    end
                    local m = seen and seen[key]
                    if m then
                        -- Read from memory (see REPEATS): the entry is held back, appended with
                        -- the others of this key at the end of the call.
                        local held = pending[key]
                        if held == nil then
                            pending[key] = { now_s }
                        else
                            held[#held + 1] = now_s
                        end
                    else
                        call('RPUSH', key, now_s)
                    end
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
                    -- The oldest entry in the window after this push.
                    h = h or now
                    if seen then
                        -- What the list holds now, for a later decision of this call on it (the
                        -- decision's keys are distinct: validation gives no two limits of a
                        -- route one key).
                        if m == nil then
                            m = #known + 1
                            seen[key] = m
                        end
                        known[m], known[m + 1], known[m + 2], known[m + 3] = k + 1, h, now, now_s
                    end
                    -- Admitted means k < requests; when it is now full, the oldest entry is the one
                    -- whose leaving frees room.
                    local q = r0 + 2 * i
                    reply[q], reply[q + 1] = st[j - 9] - k - 1, h + w - now
                else
                    local h, w, e, r = st[j - 4], st[j - 8], st[j - 1], st[j - 9]
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
                            local held = pending and pending[key]
                            if held then
                                call('RPUSH', key, unpack(held))
                                pending[key] = nil
                            end
                            h = call('LINDEX', key, e + k - r) + 0
                        end
                        reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = 0, h + w - now
                    end
                end
-- @section run-fit
                        -- RUNS: each repeat counts one more at the same `now`, so nothing more
                        -- slides out: the list admits until it holds `requests`.
                        local room = r - (st[j - 5] - st[j - 1] + 1)
                        if room < fit then
                            fit = room
                        end
-- @section run-answer
                        -- What the admission before left (k in the window, the oldest at h),
                        -- then `fit` more entries, held back with the others of this key.
                        local k, h, w = st[j - 5] - st[j - 1] + 1, st[j - 4] or now, st[j - 8]
                        if fit > 0 then
                            local held = pending[key]
                            if held == nil then
                                held = {}
                                pending[key] = held
                            end
                            for _ = 1, fit do
                                held[#held + 1] = now_s
                            end
                            known[seen[key]] = k + fit
                        end
                        -- Admitted or not, the oldest entry in the window stays the one to leave
                        -- first; a denial finds the list full (or this limit was not the full one).
                        local reset = h + w - now
                        for q = 1, m do
                            local at = r0 + q * size + 2 * i
                            reply[at], reply[at + 1] = r - k - (q <= fit and q or fit), reset
                        end
-- @section inspect-read
        local c = call('LLEN', KEYS[i])
        len[i] = c
        if c > 0 then
            local last = tonumber(call('LINDEX', KEYS[i], -1))
            if last > now then
                now = last
            end
        end
-- @section inspect-answer
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
-- @section refund
        -- A log counts requests: a charge (amount < 0, cost limits only) has nothing to add.
        if amount >= 0 then
            given = given + call('LREM', key, -1, at_s)
        end

--[[
KIND log, eviction: which entries left the window (pass 2, reads only)

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
  the head): its length, head and newest entry are known from the admission. An entry is held
  back when the next decision is on the same list or the list is remembered (a run's first
  included), so a client's admissions in one call cost one RPUSH between them (a call of 6 that
  evicts nothing: 146k -> 143k instructions); otherwise it is pushed at once and nothing is
  remembered (a later decision on that list reads Redis, as in a call of its own). Repeats right
  after an admission (RUNS in the head) are counted, not decided: the list admits until it holds
  `requests`, every answer's reset is when the oldest entry in the window leaves.
  Steady state, one limit evicting one entry per decision: TIME LLEN LINDEX 0 LINDEX 1 LPOP RPUSH
  (+ PTTL for windows >= 500 ms); not evicting: TIME LLEN LINDEX 0 LINDEX -1 RPUSH; denied:
  TIME LLEN LINDEX 0 LINDEX -1. When two or more slid out, the next entries are read with one
  LRANGE 2 (1 + d), d the decisions of the call in a row on this key (2 to 16): under load a
  busy client's call evicts about as many entries as it pushes, so one read instead of a LINDEX
  per probe finds them (scripts/redis-instructions, `log x6 evicting`: 33.0k -> 30.0k
  instructions a decision). A longer expired prefix is then found by reading the newest entry,
  then galloping and bisecting with LINDEX, so an idle client coming back to a full 100k-entry
  list costs ~2 log2(100k) reads, not 100k pops.

--]]
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
                                if hi > 2 then
                                    -- Two or more slid out. A busy client's call evicts about as
                                    -- many entries as it pushes, one per decision of its run on
                                    -- this key (see COST): the next ones are read in one LRANGE,
                                    -- 2 to 16, and bisected in memory, where each LINDEX is a
                                    -- command.
                                    local d = 1
                                    while d < 16 and keys[k0 + d * n + i] == key do
                                        d = d + 1
                                    end
                                    if d < 2 then
                                        d = 2
                                    end
                                    local got = call('LRANGE', key, '2', string.format('%d', 1 + d))
                                    local got_n = #got
                                    if got_n > hi - 2 then
                                        got_n = hi - 2
                                    end
                                    -- got[a] is expired (a = 0: entry 1), got[b] in the window
                                    -- (b = got_n + 1: none read is); got[x] is entry x + 1.
                                    local a, b = 0, got_n + 1
                                    while b - a > 1 do
                                        local mid = floor((a + b) / 2)
                                        v = got[mid] + 0
                                        if v <= cutoff then
                                            a = mid
                                        else
                                            b, hv = mid, v
                                        end
                                    end
                                    if b <= got_n then
                                        lo, hi = a + 1, b + 1
                                    else
                                        lo = got_n + 1
                                    end
                                end
                                if hi - lo > 1 and not last then
                                    -- More slid out than were read: an idle client may come back
                                    -- to a long list that expired entirely, which the newest entry
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

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
  the head): its length, head and newest entry are known from the admission, and its entry is
  held back, so a client's admissions in one call cost one RPUSH between them. Repeats right
  after an admission (RUNS in the head) are counted, not decided: the list admits until it holds
  `requests`, every answer's reset is when the oldest entry in the window leaves.
  Steady state, one limit evicting one entry per decision: TIME LLEN LINDEX 0 LINDEX 1 LPOP RPUSH
  (+ PTTL for windows >= 500 ms); not evicting: TIME LLEN LINDEX 0 LINDEX -1 RPUSH; denied:
  TIME LLEN LINDEX 0 LINDEX -1. A longer expired prefix is found by reading the newest entry,
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

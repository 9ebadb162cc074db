--[[
KIND log, recording: trim, push, the TTL and what REPEATS remember (pass 3)

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

--]]
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
                            -- Strings: a Lua number argument costs Redis a float formatting.
                            call('LTRIM', key, string.format('%d', e), '-1')
                        end
                    end
                    local m = seen and seen[key]
                    local hold = m or (pending and keys[k0 + n + i] == key)
                    if hold then
                        -- Read from memory, or followed by a decision on the same key (see
                        -- REPEATS): the entry is held back, appended with the others of this key
                        -- at the end of the call, one RPUSH for all of them. (Not otherwise: a
                        -- held entry costs a table.)
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
                        -- A string: a Lua number argument costs Redis a float formatting (sent
                        -- by every list's first push).
                        local ttl = string.format('%d', math.ceil(w / 1000) + TTL_MARGIN_MS)
                        if hold then
                            -- After the held-back RPUSH, which may be what creates the key.
                            writes[#writes + 1] = { 'PEXPIRE', key, ttl }
                        else
                            call('PEXPIRE', key, ttl)
                        end
                    end
                    -- The oldest entry in the window after this push.
                    h = h or now
                    if hold then
                        -- What the list holds now, for a later decision of this call on it (the
                        -- decision's keys are distinct: validation gives no two limits of a
                        -- route one key). Only with its entry held back: a list pushed to at once
                        -- is read from Redis by a later decision, as in a call of its own (a
                        -- batch of distinct clients fills no tables).
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

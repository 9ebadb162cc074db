--[[
KIND slots, RUNS: repeats of an admitted decision counted, not decided (SLOTS and REPEATS in
1_decide.lua)
--]]
-- @section run-fit
                -- RUNS: each repeat adds `weight` to the slot of `now` (nothing leaves at the
                -- same `now`): the limit admits while what it counts plus `weight` fits.
                if wt > 0 then
                    local room = floor((r - st[j - 1]) / wt)
                    if room < fit then
                        fit = room
                    end
                end
-- @section run-answer
                -- What the admission before left counted (S), then `fit` more weights in the
                -- slot of `now`, written with the held-back write of this key.
                if wt == 0 then
                    -- Nothing was written: every repeat gets the first one's answer.
                    for q = 1, m do
                        local at = r0 + q * size + 2 * i
                        reply[at], reply[at + 1] = reply[r0 + 2 * i], reply[r0 + 2 * i + 1]
                    end
                else
                    local mk = seen[key]
                    local v, kk, S, w = known[mk], known[mk + 1], st[j - 1], st[j - 8]
                    -- The counters are the window's, the newest in the slot of `now`; the slot
                    -- that frees room is found walking from the oldest (`must` only grows).
                    local cur, p, dropped = v[1] + v[2 * kk], 1, 0
                    for q = 1, m do
                        local sum = S + (q <= fit and q or fit) * wt
                        local must = sum + wt - r
                        if must < 1 then
                            must = 1
                        end
                        while p < kk and dropped + v[2 * p + 1] < must do
                            dropped = dropped + v[2 * p + 1]
                            p = p + 1
                        end
                        local reset = (p < kk and v[1] + v[2 * p] or cur) + 1
                        reset = reset * res + w - now
                        if reset < 1 then
                            reset = 1
                        end
                        local left = r - sum
                        if q > fit and sum + wt > r then
                            left = 0
                        end
                        local at = r0 + q * size + 2 * i
                        reply[at], reply[at + 1] = left, reset
                    end
                    if fit > 0 then
                        v[2 * kk + 1] = v[2 * kk + 1] + fit * wt
                        local wr = known[mk + 2]
                        if wr[1] == 'SETRANGE' then
                            wr[4] = struct.pack('>I4', v[2 * kk + 1])
                        else
                            wr[3] = struct.pack('>d' .. string.rep('HI4', kk), unpack(v, 1, 2 * kk + 1))
                        end
                    end
                end

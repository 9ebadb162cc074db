--[[
KIND log, RUNS: repeats of an admitted decision counted, not decided
--]]
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

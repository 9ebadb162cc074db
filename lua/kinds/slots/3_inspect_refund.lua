--[[
KIND slots, the inspect and refund scripts' sections: a slotted limit's counters read for the
inspector, and an admission given back or charged (SLOTS in 1_decide.lua)
--]]
-- @section inspect-read
        local s = call('GET', KEYS[i])
        local v = {}
        if s and #s >= 14 and (#s - 8) % 6 == 0 then
            local k = (#s - 8) / 6
            v = { struct.unpack('>d' .. string.rep('HI4', k), s) }
            v.k = k
            local newest = (v[1] + v[2 * k]) * res
            if newest > now then
                now = newest
            end
        end
        len[i] = v
-- @section inspect-answer
        -- The counters of slots cur - n ..= cur (the deciding script's SLOTS rules).
        local oldest = floor(now / res) - w / res
        local count, pairs_ = 0, {}
        for p = 1, c.k or 0 do
            local slot = c[1] + c[2 * p]
            if slot >= oldest then
                count = count + c[2 * p + 1]
                pairs_[#pairs_ + 1] = slot * res
                pairs_[#pairs_ + 1] = c[2 * p + 1]
            end
        end
        local reset = w
        if count > 0 then
            local must, dropped = math.max(count + 1 - r, 1), 0
            for p = 2, #pairs_, 2 do
                dropped = dropped + pairs_[p]
                if dropped >= must then
                    reset = math.max(pairs_[p - 1] + res + w - now, 1)
                    break
                end
            end
        end
        reply[#reply + 1] = count
        reply[#reply + 1] = math.max(r - count, 0)
        reply[#reply + 1] = reset
        reply[#reply + 1] = #pairs_
        for p = 1, #pairs_ do
            reply[#reply + 1] = pairs_[p]
        end
-- @section refund
        local s = call('GET', key)
        local v, k = false, 0
        if s and #s >= 14 and (#s - 8) % 6 == 0 then
            k = (#s - 8) / 6
            v = { struct.unpack('>d' .. string.rep('HI4', k), s) }
        end
        if amount < 0 and (v or not s) then
            -- A charge: into the slot of now with no room check (the debt of a settle), the
            -- pairs that left the window dropped, the key created if gone (a string of another
            -- shape is left alone, as a decision fails it).
            local t = call('TIME')
            local time = t[1] * 1000000 + t[2]
            local cur = floor(time / res)
            local oldest, o = cur - w / res, {}
            for p = 1, k do
                local idx = v[1] + v[2 * p]
                if idx >= oldest then
                    o[#o + 1], o[#o + 2] = idx, v[2 * p + 1]
                end
            end
            if #o > 0 and o[#o - 1] >= cur then
                -- The clock guard: never a slot before the newest stored one.
                o[#o] = math.min(o[#o] - amount, 4294967295)
            else
                o[#o + 1], o[#o + 2] = cur, math.min(-amount, 4294967295)
            end
            -- The TTL outlives the slot charged, even one ahead of TIME (a decision's SETRANGE
            -- into it then needs no new TTL, see SLOTS).
            local ahead = o[#o - 1] * res - time
            if ahead < 0 then
                ahead = 0
            end
            local first = o[1]
            for q = 1, #o, 2 do
                o[q] = o[q] - first
            end
            local packed = struct.pack('>d' .. string.rep('HI4', #o / 2), first, unpack(o))
            call('SET', key, packed, 'PX', math.ceil((ahead + w + res) / 1000) + TTL_MARGIN_MS)
            given = given + 1
        elseif v then
            local slot, o, hit = floor(at / res), {}, false
            for p = 1, k do
                local idx, c = v[1] + v[2 * p], v[2 * p + 1]
                if idx == slot and not hit then
                    c, hit = math.max(c - amount, 0), true
                end
                if c > 0 then
                    o[#o + 1], o[#o + 2] = idx, c
                end
            end
            if hit then
                given = given + 1
                if #o == 0 then
                    call('DEL', key)
                else
                    local ttl = call('PTTL', key)
                    local first = o[1]
                    for q = 1, #o, 2 do
                        o[q] = o[q] - first
                    end
                    local packed = struct.pack('>d' .. string.rep('HI4', #o / 2), first, unpack(o))
                    if ttl > 0 then
                        call('SET', key, packed, 'PX', ttl)
                    else
                        call('SET', key, packed)
                    end
                end
            end
        end

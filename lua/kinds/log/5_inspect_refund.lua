--[[
KIND log, the inspector (read only) and a give back
--]]
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

--[[
KIND calendar: a quota per calendar day, ISO week or month in a time zone (ARGV kind value < 0;
src/limiter/algo/calendar.rs)

CALENDAR
  One Redis STRING per limit: "<end> <count>", the end of the period counted (ms since the Unix
  epoch) and what its admissions counted (1 each; a cost quota's costs), about 20 bytes, set with
  a TTL that ends TTL_MARGIN_MS after the period. The script has no time-zone rules: the proxy
  sends the end of its own period in ms as the window value `w`, and as the kind value
  -(1 + a * 2^22 + b), a and b the lengths in whole seconds of its period and of the next. The
  period of TIME is then the one that ends at w - 1000 a (TIME before the proxy's period: its
  clock is ahead), at w, or at w + 1000 b (TIME past it: its clock is behind); TIME past that
  one too fails the decision (a proxy clock a whole period off). So every decision counts on
  Redis's clock whatever the proxy's says, and all proxies of one build draw the same
  boundaries (the zone rules are bundled in the binary).
  A stored count of another period counts nothing. A decision admits when the period's count
  plus its `weight` is at most `requests`; an admission rewrites the string (one SET .. PX), a
  denial writes nothing. `remaining` is requests - count (0 when full or when the weight did not
  fit); `reset` is the time to the period's end, admitted or not (nothing leaves before it).
  Cost: GET, and SET when admitted. Repeats are decided in full (run-fit declines); a later
  decision of the same call reads what the one before wrote.

  Scratch of limit i (its cells of `st`, j = 10i, see the skeleton):
    st[j-5] the stored period's end (0: none)    st[j-3] the end of TIME's period
    st[j-4] the stored count                     st[j-2] what TIME's period counts
--]]
-- @when res < 0
-- @section read
            -- CALENDAR: one GET; a key of another type or shape fails this decision alone.
            local v = redis.pcall('GET', key)
            if type(v) == 'table' then
                failed = v.err or 'GET failed'
                break
            end
            local e, c = 0, 0
            if v then
                local es, cs = string.match(v, '^(%d+) (%d+)$')
                if es == nil then
                    failed = 'sliding_window: ' .. key .. ' holds no calendar count'
                    break
                end
                e, c = es + 0, cs + 0
            end
            -- The period TIME falls in, from the proxy's boundaries (see CALENDAR).
            local x = -res - 1
            local b = x % 4194304
            local p, tm = w, floor(time / 1000)
            if tm < w - (x - b) / 4194304 * 1000 then
                p = w - (x - b) / 4194304 * 1000
            elseif tm >= w then
                p = w + b * 1000
                if tm >= p then
                    failed = 'sliding_window: ' .. key .. ': TIME is past the periods the proxy sent'
                    break
                end
            end
            st[j - 5], st[j - 4], st[j - 3] = e, c, p
-- @section decide
                -- CALENDAR: what TIME's period counts (a stored count of another is nothing).
                local k = 0
                if st[j - 5] == st[j - 3] then
                    k = st[j - 4]
                end
                st[j - 2] = k
                if k + wt > r then
                    admitted = false
                end
-- @section answer
                -- CALENDAR: the period's count rewritten (admitted only), expiring after it.
                local p, k, r = st[j - 3], st[j - 2], st[j - 9]
                local fits = k + wt <= r
                if admitted and wt > 0 then
                    k = k + wt
                    local ttl = p - floor(time / 1000) + TTL_MARGIN_MS
                    call('SET', key, string.format('%.0f %.0f', p, k), 'PX', string.format('%.0f', ttl))
                end
                local left = r - k
                if left < 0 or not (admitted or fits) then
                    left = 0
                end
                local reset = p * 1000 - now
                if reset < 1 then
                    reset = 1
                end
                reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = left, reset
-- @section run-fit
                -- RUNS: each repeat is decided in full (it reads what the one before wrote).
                fit = -1
-- @section run-answer
                -- Not reached: run-fit declines every run.
-- @section inspect-read
        local v = call('GET', KEYS[i])
        local e, c = 0, 0
        if v then
            local es, cs = string.match(v, '^(%d+) (%d+)$')
            if es then
                e, c = es + 0, cs + 0
            end
        end
        len[i] = { e, c }
-- @section inspect-answer
        -- The period of `now` (as the deciding script's read), what it counts and its end.
        local x = -res - 1
        local b = x % 4194304
        local p, tm = w, floor(now / 1000)
        if tm < w - (x - b) / 4194304 * 1000 then
            p = w - (x - b) / 4194304 * 1000
        elseif tm >= w then
            p = w + b * 1000
        end
        local count = 0
        if c[1] == p then
            count = c[2]
        end
        local reset = p * 1000 - now
        if reset < 1 then
            reset = 1
        end
        reply[#reply + 1] = count
        reply[#reply + 1] = math.max(r - count, 0)
        reply[#reply + 1] = reset
        reply[#reply + 1] = 0
-- @section refund
        -- CALENDAR: a give back leaves the count of the period `at` falls in, when that is the
        -- one stored; a charge (amount < 0) adds to the period of TIME, with no room check.
        local x = -res - 1
        local b = x % 4194304
        local ms = floor(at / 1000)
        if amount < 0 then
            local t = call('TIME')
            ms = t[1] * 1000 + floor(t[2] / 1000)
        end
        local p = w
        if ms < w - (x - b) / 4194304 * 1000 then
            p = w - (x - b) / 4194304 * 1000
        elseif ms >= w then
            p = w + b * 1000
        end
        local v = call('GET', key)
        local e, c = 0, 0
        if v then
            local es, cs = string.match(v, '^(%d+) (%d+)$')
            if es then
                e, c = es + 0, cs + 0
            end
        end
        if amount < 0 then
            if e ~= p then
                c = 0
            end
            local ttl = p - ms + TTL_MARGIN_MS
            call('SET', key, string.format('%.0f %.0f', p, math.min(c - amount, 4294967295)), 'PX', string.format('%.0f', ttl))
            given = given + 1
        elseif e == p and c > 0 then
            local ttl = call('PTTL', key)
            local value = string.format('%.0f %.0f', p, math.max(c - amount, 0))
            if ttl > 0 then
                call('SET', key, value, 'PX', ttl)
            else
                call('SET', key, value)
            end
            given = given + 1
        end

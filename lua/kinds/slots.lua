--[[
KIND slots: counters per slot of `resolution` (ARGV resolution >= 1000, a whole ms; src/limiter/algo/slots.rs)

SLOTS  (a limit with a resolution: bounded memory whatever the rate)
  One Redis STRING per limit, packed with struct.pack('>d' .. ('HI4' x k)): the index `first`
  of its oldest non-empty slot (slot s holds the admissions of [s res, (s+1) res) on the
  script's clock; 8 bytes, exact below 2^53), then k >= 1 pairs, oldest first, of a slot's
  offset from `first` (2 bytes) and its counter (> 0, 4 bytes), big endian: only non-empty
  slots are stored. With n = window / resolution, the slots that overlap (now - window, now]
  are cur - n ..= cur (cur = floor(now / res)): k <= n + 1 and offsets <= n <= 1000, so a
  client costs at most 8 + 6 (n + 1) bytes of value however fast it sends (74 B at 1 s /
  100 ms), and no more than 6 bytes per admission when it sends slowly.
  A decision admits only if the sum over those slots plus its `weight` is at most `requests`
  (weight 1: the sum is below `requests`; a cost limit's weight is the request's cost, and an
  admission adds it to the slot's counter; weight 0 admits without writing). Every admission in
  any window (a, a + window] is counted by the last of them, so no window ever holds more than
  `requests`; the oldest slot may hold admissions that already left the window, so a limit may
  refuse up to one slot early: a refusal at `now` means `requests` admissions in
  (now - window - resolution, now]. An admission into the newest stored slot while none has
  left the window (the common case: a client sending faster than one request per slot) changes
  only the string's last counter: one SETRANGE of those 4 bytes, no TTL sent. Any other
  admission rewrites the whole string with one SET .. PX (now - TIME + window + resolution, in ms,
  + TTL_MARGIN_MS): the key then lives until at least TTL_MARGIN_MS after its newest slot leaves
  ((s + 1) res + window), so writes into that same slot need no new TTL; a charge (refund
  script) sets its TTL by the same rule, and a give back keeps the TTL. A counter stays counted
  until (s + 1) res + window, at most window + resolution after it was written. A denial writes
  nothing. `remaining` is requests - sum (0 when full); `reset` is when enough of the oldest
  slots have left for the sum to drop below `requests` (full), or when the oldest leaves (not
  full), or the window (empty): (s + 1) res + window - now, at least 1. The clock guard holds
  too: now >= the start of the newest slot of any limit of the decision. The memory store
  implements the same rules (src/limiter/algo/slots.rs); a key of another type, or a string of
  another shape, fails the decision as for a log.
  Cost: GET, then SETRANGE or SET when admitted (TIME once per call), and Lua work linear in k.
  Arguments are strings (a Lua number costs Redis a float formatting: about 4k instructions for
  the PX of a SET). In a batch (REPEATS), a key admitted into once reads nothing more in the
  call: its counters are remembered in `known`, and its write is held back in `writes`, changed
  in place by each later admission of the call, so a client's admissions in one call cost one
  GET and one write between them. A run of repeats (RUNS) is counted: each adds `weight` to the
  slot of `now`, so the limit admits while the sum plus `weight` fits, and each repeat's reset
  is found walking the counters once for the whole run. The string's layout is the one before
  issue 57 (same key names), so proxies of both versions share the counters during a rolling
  deploy (docs/redis.md).

  Scratch of limit i (its cells of `st`, j = 10i, see the skeleton):
    st[j-5] its pairs as unpacked (false: no key)   st[j-3] the first pair in the window
    st[j-4] k, the number of pairs                 st[j-1] sum over the window (after an
                                                           admission: with its weight)
  Remembered of a key admitted into in a batch (REPEATS; `known[m ..]`, m = seen[key]):
    known[m]   its counters after that admission, laid out as unpacked (first, then the pairs)
    known[m+1] their number of pairs   known[m+2] its held-back write (a table in `writes`)
  (its window and requests are the skeleton's st[j-8] and st[j-9])
--]]
-- @when res >= 1000
-- @section read
            -- SLOTS: one GET, or what an admission earlier in this call left (REPEATS); a key
            -- of another type or shape fails this decision alone.
            local mk = seen and seen[key]
            local v, kk = false, 0
            if mk then
                v, kk = known[mk], known[mk + 1]
            else
                local s = redis.pcall('GET', key)
                if type(s) == 'table' then
                    failed = s.err or 'GET failed'
                    break
                end
                if s then
                    if #s < 14 or (#s - 8) % 6 ~= 0 then
                        failed = 'sliding_window: ' .. key .. ' holds no slot counters'
                        break
                    end
                    kk = (#s - 8) / 6
                    v = { struct.unpack('>d' .. string.rep('HI4', kk), s) }
                end
            end
            if v then
                local newest = (v[1] + v[2 * kk]) * res
                if newest > now then
                    -- Formatted when a log limit of this decision needs it (pass 3).
                    now, now_s = newest, nil
                end
            end
            st[j - 5], st[j - 4] = v, kk
-- @section decide
                -- SLOTS: the counters of cur - n ..= cur, i.e. from pair `from` on.
                local v, kk, sum, from = st[j - 5], st[j - 4], 0, 1
                if v then
                    local oldest = floor(now / res) - st[j - 8] / res
                    while from <= kk and v[1] + v[2 * from] < oldest do
                        from = from + 1
                    end
                    for p = from, kk do
                        sum = sum + v[2 * p + 1]
                    end
                end
                st[j - 3], st[j - 1] = from, sum
                if sum + wt > r then
                    admitted = false
                end
-- @section answer
                -- Rewrite the counters (admitted only) and answer, admitted or denied.
                local v, kk, from, w = st[j - 5], st[j - 4], st[j - 3], st[j - 8]
                local sum, r, cur = st[j - 1], st[j - 9], floor(now / res)
                local fits = sum + wt <= r
                if admitted and wt > 0 then
                    -- The counters after this admission (nv: first, then the pairs, nk of them);
                    -- `tail`: only the newest counter changed.
                    local nv, nk, tail = v, kk, false
                    if v and from == 1 and v[1] + v[2 * kk] == cur then
                        -- Into the newest slot, and none left the window (the common case).
                        v[2 * kk + 1] = v[2 * kk + 1] + wt
                        tail = true
                    else
                        -- The window's (slot, counter) pairs, plus one in slot `cur`; then the
                        -- slots as offsets from the first.
                        local o = { 0 }
                        if v then
                            for p = from, kk do
                                o[#o + 1], o[#o + 2] = v[1] + v[2 * p], v[2 * p + 1]
                            end
                        end
                        if #o > 1 and o[#o - 1] == cur then
                            o[#o] = o[#o] + wt
                        else
                            o[#o + 1], o[#o + 2] = cur, wt
                        end
                        local first = o[2]
                        for q = 2, #o, 2 do
                            o[q] = o[q] - first
                        end
                        o[1] = first
                        nv, nk = o, (#o - 1) / 2
                    end
                    -- The write: the newest counter alone (SETRANGE: the key's TTL already
                    -- outlives that slot, see SLOTS), or the whole string with its TTL. In a
                    -- batch it is held back, and a later admission of the call on this key
                    -- changes it in place (REPEATS).
                    local wr = nil
                    if seen then
                        local mk = seen[key]
                        if mk == nil then
                            mk = #known + 1
                            seen[key] = mk
                            known[mk + 2] = false
                        end
                        known[mk], known[mk + 1] = nv, nk
                        wr = known[mk + 2]
                        if wr == false then
                            wr = { 'SETRANGE', key, 0, 0 }
                            writes[#writes + 1] = wr
                            known[mk + 2] = wr
                        end
                    end
                    if tail and (wr == nil or wr[1] == 'SETRANGE') then
                        local off, c = string.format('%d', 6 * nk + 4), struct.pack('>I4', nv[2 * nk + 1])
                        if wr then
                            wr[3], wr[4] = off, c
                        else
                            call('SETRANGE', key, off, c)
                        end
                    else
                        local packed = struct.pack('>d' .. string.rep('HI4', nk), unpack(nv, 1, 2 * nk + 1))
                        if wr == nil then
                            call('SET', key, packed, 'PX', string.format('%d', math.ceil((now - time + w + res) / 1000) + TTL_MARGIN_MS))
                        elseif tail then
                            -- A whole rewrite is held back already, with its TTL.
                            wr[3] = packed
                        else
                            wr[1], wr[3], wr[4], wr[5] = 'SET', packed, 'PX', string.format('%d', math.ceil((now - time + w + res) / 1000) + TTL_MARGIN_MS)
                        end
                    end
                    sum = sum + wt
                    st[j - 1] = sum
                end
                -- Full: when enough of the oldest slots left for `weight` to fit again; else
                -- when the oldest leaves (the slot of this admission if it is the only one).
                local reset = w
                if sum > 0 then
                    local must, at, dropped = sum + (wt > 0 and wt or 1) - r, cur, 0
                    if must < 1 then
                        must = 1
                    end
                    if v then
                        for p = from, kk do
                            dropped = dropped + v[2 * p + 1]
                            if dropped >= must then
                                at = v[1] + v[2 * p]
                                break
                            end
                        end
                    end
                    reset = (at + 1) * res + w - now
                    if reset < 1 then
                        reset = 1
                    end
                end
                if sum > r or not (admitted or fits) then
                    sum = r
                end
                reply[r0 + 2 * i], reply[r0 + 2 * i + 1] = r - sum, reset
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

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

--[[
KIND log: the exact sliding-window log (ARGV resolution 0, the default; src/limiter/algo/log.rs)

DATA
  One Redis LIST per limit. Each element is the Redis-clock timestamp, in integer microseconds
  since the Unix epoch, of one admitted request. New entries are appended at the tail (RPUSH)
  with a clock that never goes backwards within a bucket (see CLOCK), so every list is sorted
  oldest-first and the expired entries are always a prefix: eviction only ever trims the head.
  A list stores each entry as a listpack integer (about 10 bytes), against ~120 bytes for a
  sorted-set member, and duplicates are fine: two requests in the same microsecond are two
  entries.


CLOCK  The newest entry is read only when it could be ahead of TIME. Every admission evicts
  what left the window before it pushes, so each list keeps the invariant newest < head +
  window (its window is fixed: it is part of the key). So when the head has left the window by
  TIME, i.e. head + window <= TIME, the newest entry is behind TIME and cannot move `now`: the
  steady state with eviction needs no read of the tail.

  Scratch of limit i (its cells of `st`, j = 10i, see the skeleton):
    st[j-5] entries in the list          st[j-3] newest entry (false: not read, because
    st[j-4] head, then first entry left          it cannot be ahead of TIME)
            in the window (false: none)  st[j-1] expired entries at the head
  (its window and requests are the skeleton's st[j-8] and st[j-9])
--]]
-- @when default
-- @section read
            local m = seen and seen[key]
            local c, h, last, s
            if m then
                -- Admitted into earlier in this call (see REPEATS): its length, head and newest
                -- entry (with the string it was pushed as) are known.
                c, h, last, s = known[m], known[m + 1], known[m + 2], known[m + 3]
            else
                -- A key of another type fails this decision alone (it has written nothing yet);
                -- its neighbours in the same call still get their answers.
                c = redis.pcall('LLEN', key)
                if type(c) == 'table' then
                    failed = c.err or 'LLEN failed'
                    break
                end
                h, last = false, false
            end
            if m then
                if last > now then
                    now, now_s = last, s
                end
            elseif c > 0 then
                s = call('LINDEX', key, '0')
                h = s + 0
                if c == 1 then
                    last = h
                elseif h + w > time then
                    -- The head is still in the window by TIME (or ahead of it): so may the newest
                    -- be.
                    s = call('LINDEX', key, '-1')
                    last = s + 0
                end
                -- Otherwise the head left the window by TIME, and the newest entry is before
                -- head + window (see CLOCK), so before TIME: it cannot move `now`.
                if last and last > now then
                    now, now_s = last, s
                end
            end
            st[j - 5], st[j - 4], st[j - 3] = c, h, last

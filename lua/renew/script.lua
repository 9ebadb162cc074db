--[[
renew (lua/renew/script.lua, not assembled: it only runs on concurrency limits, whose record is
the exact log's LIST, lua/kinds/log/): move one lease to now, so its deadline moves one
lease_ttl on. Called every lease_ttl / 3 while its request runs (src/proxy/lease.rs).

KEYS[1]   the lease limit's list
ARGV[1]   `at`: the lease's entry (its admission's or its last renewal's time, µs, as stored)
ARGV[2]   lease_ttl in µs (the limit's window)

REPLY     the new entry's time (µs), or 0 when the lease had lapsed (left its window, or the
          bucket was reset): then nothing is written, so a lapsed lease never comes back.

The list stays sorted and keeps the log's invariant (newest < head + window): the new entry is
max(TIME, newest), and the entries that left the window are trimmed from the head first.
--]]
if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
    redis.replicate_commands()
end
local key, at_s, w = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now_s = t[1] .. string.format('%06d', tonumber(t[2]))
local now = tonumber(now_s)
if tonumber(at_s) <= now - w then
    return 0
end
local last = redis.call('LINDEX', key, -1)
if not last then
    return 0
end
if tonumber(last) > now then
    now, now_s = tonumber(last), last
end
while true do
    local head = redis.call('LINDEX', key, 0)
    if not head or tonumber(head) > now - w then
        break
    end
    redis.call('LPOP', key)
end
if redis.call('LREM', key, -1, at_s) == 0 then
    return 0
end
redis.call('RPUSH', key, now_s)
-- As the log: window + TTL_MARGIN_MS (1 s) from the newest entry.
redis.call('PEXPIRE', key, math.ceil(w / 1000) + 1000)
return now

"""The record view's Lua scripts: what one live batch writes for an agent, its usage totals
and the projection's checkpoint, each guarded so a replay changes nothing."""

# One call per agent of a batch, all its keys in one hash slot (the agent's tag), so it
# runs on a Redis Cluster too. KEYS: the agent's rec, list, pinned, shadowed, users and
# expiry keys (`record_view_keys.apply_keys`). ARGV[1]: the prefix of the agent's member
# listings; ARGV[2]: the channel to announce on, or "" (no one waits); ARGV[3]: the agent's
# applied block and subject changes as a JSON array (`applied_waiter.announcement`);
# ARGV[4]: the agent key (`tenant/agent`, for the announcement); then 8 arguments per event
# (`record_view_fold.Row` but its agent key): record id, version, the event's raw JSON,
# sort score, flags (1 listed + 2 pinned), expiry ms of a live record or -1, the live record
# a preview record shadows or "", and the member of a USER record or "". A USER record is
# listed in its member's listing too, as in the agent's (its scope and member never change
# between versions), and its member joins the agent's set of members. Flat arguments, not
# one JSON document: decoding escaped snapshots in Lua cost more than the writes. The
# sorted-set changes go out as one ZADD and one ZREM per key, not a call per event. The
# checkpoint is CHECKPOINT's, after the batch's agents (`connection.write_then`).
APPLY = """
local rk, lk, pk, sk, uk, ek = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ulist, ak = ARGV[1], ARGV[4]
local applied = 0
local changes = {}
local announce, announced = ARGV[2] ~= '', {}
local users, anyuser = {}, false
local function put(key, member, score)
  local t = changes[key]
  if not t then t = {}; changes[key] = t end
  t[member] = score
end
for i = 5, #ARGV, 8 do
  local rid, ver, user = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 7]
  local cur = tonumber(redis.call('HGET', rk, rid) or '0')
  if ARGV[i + 6] ~= '' then redis.call('SADD', sk, ARGV[i + 6]) end
  if user ~= '' then users[user] = true; anyuser = true end
  if ver > cur then
    redis.call('HSET', rk, rid .. '#' .. ver, ARGV[i + 2], rid, ver)
    local score, flags, expiry = ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[i + 5]
    -- A first version has no earlier listing, pin or expiry to take back.
    local later = cur > 0
    if flags % 2 == 1 then put(lk, rid, score)
    elseif later then put(lk, rid, false) end
    if user ~= '' then
      local ul = ulist .. user
      if flags % 2 == 1 then put(ul, rid, score)
      elseif later then put(ul, rid, false) end
    end
    if flags >= 2 then put(pk, rid, score)
    elseif later then put(pk, rid, false) end
    if expiry ~= '-1' then put(ek, rid, expiry)
    elseif later then put(ek, rid, false) end
    applied = applied + 1
    if announce then announced[#announced + 1] = {ak, rid, ver} end
  else
    redis.call('HSETNX', rk, rid .. '#' .. ver, ARGV[i + 2])
  end
end
for key, members in pairs(changes) do
  local add, rem = {}, {}
  for m, score in pairs(members) do
    if score then add[#add + 1] = score; add[#add + 1] = m else rem[#rem + 1] = m end
  end
  -- unpack() is bounded by Lua's stack: a few thousand arguments per call
  for j = 1, #add, 4000 do redis.call('ZADD', key, unpack(add, j, math.min(j + 3999, #add))) end
  for j = 1, #rem, 4000 do redis.call('ZREM', key, unpack(rem, j, math.min(j + 3999, #rem))) end
end
if anyuser then
  local add = {}
  for u in pairs(users) do add[#add + 1] = u end
  for j = 1, #add, 4000 do redis.call('SADD', uk, unpack(add, j, math.min(j + 3999, #add))) end
end
-- Published with the writes, so whoever hears of a version can read it.
if announce and (#announced > 0 or ARGV[3] ~= '[]') then
  local rows = '[]'
  if #announced > 0 then rows = cjson.encode(announced) end
  redis.call('PUBLISH', ARGV[2], '{"b":' .. ARGV[3] .. ',"r":' .. rows .. '}')
end
return applied
"""


# A `UsageRecorded`'s totals into the agent's `usage` hash, beside the versions: usage makes no
# version (docs/features/trust.md). KEYS[1]: the hash; ARGV: record id, total, ... A total only grows, so
# a redelivered older event changes nothing, as a version guard would.
USAGE = """
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 0
"""


# The projection's checkpoint: KEYS[1] the generation's checkpoint hash; ARGV[1] a JSON
# object {checkpoint field: next offset}. A field only moves forward.
CHECKPOINT = """
for field, nxt in pairs(cjson.decode(ARGV[1])) do
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  if nxt > cur then redis.call('HSET', KEYS[1], field, nxt) end
end
return 0
"""

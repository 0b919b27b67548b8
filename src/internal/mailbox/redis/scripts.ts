/**
 * The Redis mailbox's state changes, each one Lua script the server runs atomically (issue 46): a send, a claim,
 * a batch of acknowledgements, a nack, an extension, a lease check, the purge, the next visibility. Every lease check is the
 * receipt handle and the lease's end against the server's clock (`TIME`), never a client's — or the test's
 * `TestClock` time when one is given (`now`, the first argument; empty: the server's).
 *
 * A queue's keys (`keysOf`) share one hash tag, the queue's name in hex (a name may hold `{` or `}`), so a
 * cluster keeps every key of a queue in one slot:
 * - `<tag>:seq`: the last message number (its id; its place in the queue);
 * - `<tag>:ready`: the visible messages, scored by number (claimed lowest first: a redelivered message keeps its
 *   place);
 * - `<tag>:hidden`: the delayed and leased ones, scored by when they become visible;
 * - `<tag>:paused`: present while the queue is paused;
 * - `<tag>:wake`: the pub/sub channel a script publishes on when it makes a message visible now, which wakes
 *   sleeping receivers of every process (a lost one is made up by their bounded poll);
 * - `<tag>:j:<id>`: a message's step journal, a sorted set of steps scored by position (each member the position,
 *   a space, and the step as JSON: `k` key, `e` entry, `r` request id), added to only under the delivery's lease,
 *   deleted with the acknowledgement unless kept;
 * - `<tag>:dead`, `<tag>:dl:<id>`: the dead letters (messages whose body cannot be decoded), set aside with why;
 * - `<tag>:m:<id>`: a message's hash — `b` body (JSON), `e` enqueued at (ms), `d` deliveries, `v` visible at,
 *   `h` the live receipt handle (empty: none), `r` reply-to, `t` traceparent (each absent when not given).
 */

/** The Redis keys of queue `name` under `prefix`. */
export const keysOf = (prefix: string, name: string) => {
  const tag = `${prefix}{${Buffer.from(name, "utf8").toString("hex")}}`
  return {
    tag,
    seq: `${tag}:seq`,
    ready: `${tag}:ready`,
    hidden: `${tag}:hidden`,
    paused: `${tag}:paused`,
    message: `${tag}:m:`,
    /** The messages set aside as dead letters (a body that cannot be decoded), scored by when. */
    dead: `${tag}:dead`,
    /** A dead letter's hash (the message's, with `why` and `at`), by id: `deadLetter + id`. */
    deadLetter: `${tag}:dl:`,
    /** A message's step journal (a sorted set of steps), by id: `journal + id`. */
    journal: `${tag}:j:`,
    /** Pub/sub: a message visible now (a send, a nack(0), a reply), for receivers of other processes. */
    wake: `${tag}:wake`
  }
}

/** The time: ARGV[1] when given (a test's clock), else the server's, in whole milliseconds. */
const now = `
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end`

/**
 * Whether message hash `m` is held by `handle` now: the handle its live one and the lease not ended — a lease end
 * that is not a number (a hash damaged by hand) is no lease, never a script error. After `now`.
 */
const held = `
local function held(m, handle)
  local f = redis.call('HMGET', m, 'h', 'v')
  local ends = tonumber(f[2])
  return f[1] == handle and f[1] ~= '' and ends ~= nil and ends > now
end`

/** Visible messages due by `now` moved from hidden to ready (at most 1,000 a call: a claim takes at most 10). */
const promote = `
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[1], id, id)
end`

/**
 * KEYS: ready, hidden, seq. ARGV: now, delay (ms), max size (0: none), message key prefix, body, reply-to (empty:
 * none), traceparent (empty: none), the wake channel. Returns the id, or -1 when the queue is full.
 */
export const send = {
  numberOfKeys: 3,
  lua: `${now}
local max = tonumber(ARGV[3])
if max > 0 and redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) >= max then return -1 end
local id = redis.call('INCR', KEYS[3])
local m = ARGV[4] .. id
local delay = tonumber(ARGV[2])
redis.call('HSET', m, 'b', ARGV[5], 'e', now, 'd', 0, 'v', now + delay, 'h', '')
if ARGV[6] ~= '' then redis.call('HSET', m, 'r', ARGV[6]) end
if ARGV[7] ~= '' then redis.call('HSET', m, 't', ARGV[7]) end
if delay == 0 then
  redis.call('ZADD', KEYS[1], id, id)
  redis.call('PUBLISH', ARGV[8], '')
else
  redis.call('ZADD', KEYS[2], now + delay, id)
end
return id`
}

/**
 * KEYS: ready, hidden, paused. ARGV: now, max, visibility (ms), message key prefix, then one fresh receipt
 * handle per message it may take. Returns, per message claimed, `{ id, handle, deliveries, body, enqueued at,
 * reply-to, traceparent, lease end }` ('' for an absent field).
 */
export const claim = {
  numberOfKeys: 3,
  lua: `#!lua flags=allow-oom
if redis.call('EXISTS', KEYS[3]) == 1 then return {} end${now}${promote}
local visibility = tonumber(ARGV[3])
local out = {}
local handles = 5
while #out < tonumber(ARGV[2]) do
  local popped = redis.call('ZPOPMIN', KEYS[1])
  if #popped == 0 then break end
  local id = popped[1]
  local m = ARGV[4] .. id
  if redis.call('EXISTS', m) == 1 then
    local handle = ARGV[handles]
    handles = handles + 1
    local deliveries = redis.call('HINCRBY', m, 'd', 1)
    redis.call('HSET', m, 'h', handle, 'v', now + visibility)
    redis.call('ZADD', KEYS[2], now + visibility, id)
    local f = redis.call('HMGET', m, 'b', 'e', 'r', 't')
    out[#out + 1] = { id, handle, deliveries, f[1], f[2], f[3] or '', f[4] or '', tostring(now + visibility) }
  end
end
return out`
}

/**
 * The lease check of the scripts below: 0 when `handle` (ARGV[3]) is not the live handle of message ARGV[2] — a
 * lease end that is not a number (a hash damaged by hand) is no lease, never a script error.
 */
const leased = `${now}${held}
local m = ARGV[4] .. ARGV[2]
if not held(m, ARGV[3]) then return 0 end`

/**
 * KEYS: ready, hidden. ARGV: now, id, handle, message key prefix, delay (ms), the wake channel. 1: given back; 0:
 * stale.
 */
export const nack = {
  numberOfKeys: 2,
  lua: `#!lua flags=allow-oom
${leased}
local delay = tonumber(ARGV[5])
redis.call('HSET', m, 'h', '', 'v', now + delay)
if delay == 0 then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[2])
  redis.call('PUBLISH', ARGV[6], '')
else
  redis.call('ZADD', KEYS[2], now + delay, ARGV[2])
end
return 1`
}

/** KEYS: hidden. ARGV: now, id, handle, message key prefix, timeout (ms). The new lease end; 0: stale. */
export const extend = {
  numberOfKeys: 1,
  lua: `#!lua flags=allow-oom
${leased}
local ends = now + tonumber(ARGV[5])
redis.call('HSET', m, 'v', ends)
redis.call('ZADD', KEYS[1], ends, ARGV[2])
return tostring(ends)`
}

/** KEYS: hidden. ARGV: now, id, handle, message key prefix. 1 while the handle holds the message; 0: stale. */
export const check = {
  numberOfKeys: 1,
  lua: `#!lua flags=allow-oom
${leased}
return 1`
}

/**
 * KEYS: ready, hidden, paused. ARGV: now. Milliseconds until the next message becomes visible (0 or less: one
 * is visible now), or nil: none is coming (or the queue is paused).
 */
export const nextVisible = {
  numberOfKeys: 3,
  lua: `#!lua flags=no-writes
if redis.call('EXISTS', KEYS[3]) == 1 then return false end${now}
if redis.call('ZCARD', KEYS[1]) > 0 then return 0 end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 0 then return false end
return tostring(tonumber(first[2]) - now)`
}

/** KEYS: ready, hidden: the messages waiting, visible or not (read only: answered over maxmemory too). */
export const count = {
  numberOfKeys: 2,
  lua: `#!lua flags=no-writes
return redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])`
}

/** KEYS: ready, hidden. ARGV: message key prefix, journal key prefix. The messages deleted, with their journals. */
export const purge = {
  numberOfKeys: 2,
  lua: `#!lua flags=allow-oom
local n = 0
for k = 1, 2 do
  local ids = redis.call('ZRANGE', KEYS[k], 0, -1)
  for _, id in ipairs(ids) do
    redis.call('DEL', ARGV[1] .. id, ARGV[2] .. id)
    n = n + 1
  end
  redis.call('DEL', KEYS[k])
end
return n`
}

/**
 * KEYS: hidden. ARGV: now, message key prefix, journal key prefix, then (id, handle, keep) triples: a batch of
 * acknowledgements (the group commit of `driver.ts`), each checked as the lease check of the scripts above, each
 * message's journal deleted with it unless kept ('1'). Per triple 1: deleted; 0: its handle is stale.
 */
export const acknowledgeAll = {
  numberOfKeys: 1,
  lua: `#!lua flags=allow-oom
${now}${held}
local out = {}
for i = 4, #ARGV, 3 do
  local m = ARGV[2] .. ARGV[i]
  if held(m, ARGV[i + 1]) then
    redis.call('DEL', m)
    if ARGV[i + 2] == '0' then redis.call('DEL', ARGV[3] .. ARGV[i]) end
    redis.call('ZREM', KEYS[1], ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out`
}

/**
 * KEYS: the delivery's hidden set, then the reply queue's ready, hidden and seq. ARGV: now, id, handle, message
 * key prefix, the reply queue's message key prefix, its max size (0: none), the reply's body, its traceparent
 * (empty: none), the reply queue's wake channel, the delivery's journal key prefix, whether its journal is kept
 * ('1'). The reply stored and the delivery acknowledged in one step: the reply's id; 0: the handle is
 * stale (no reply written); -1: the reply queue is full (nothing done). Both queues on one server: not yet for a
 * cluster, whose queues' keys are in different slots.
 */
export const replyAndAcknowledge = {
  numberOfKeys: 4,
  lua: `#!lua flags=allow-oom,allow-cross-slot-keys${leased}
local max = tonumber(ARGV[6])
if max > 0 and redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) >= max then return -1 end
local id = redis.call('INCR', KEYS[4])
local r = ARGV[5] .. id
redis.call('HSET', r, 'b', ARGV[7], 'e', now, 'd', 0, 'v', now, 'h', '')
if ARGV[8] ~= '' then redis.call('HSET', r, 't', ARGV[8]) end
redis.call('ZADD', KEYS[2], id, id)
redis.call('PUBLISH', ARGV[9], '')
redis.call('DEL', m)
if ARGV[11] == '0' then redis.call('DEL', ARGV[10] .. ARGV[2]) end
redis.call('ZREM', KEYS[1], ARGV[2])
return id`
}

/**
 * KEYS: hidden. ARGV: now, id, handle, message key prefix, journal key prefix, the step's position, the step (JSON,
 * its position first in the member so members never collide). Adds the step to the message's journal, a sorted set
 * scored by position, while this delivery holds the message: 1; 0: the handle is stale (nothing written).
 */
export const journalAppend = {
  numberOfKeys: 1,
  lua: `${leased}
redis.call('ZADD', ARGV[5] .. ARGV[2], tonumber(ARGV[6]), ARGV[6] .. ' ' .. ARGV[7])
return 1`
}

/**
 * KEYS: hidden. ARGV: now, id, handle, message key prefix, journal key prefix, from position. Deletes the steps at
 * that position and after while this delivery holds the message (by score: no step is parsed): 1; 0: stale.
 */
export const journalTruncate = {
  numberOfKeys: 1,
  lua: `#!lua flags=allow-oom
${leased}
redis.call('ZREMRANGEBYSCORE', ARGV[5] .. ARGV[2], tonumber(ARGV[6]), '+inf')
return 1`
}

/**
 * KEYS: hidden, ready. ARGV: now, message key prefix, wake channel, then (id, handle) pairs: messages a receive
 * claimed but never had (it was interrupted while the claim was on its way), given back — visible at once, the
 * delivery not counted — where the handle still holds them.
 */
export const release = {
  numberOfKeys: 2,
  lua: `#!lua flags=allow-oom
${now}${held}
local n = 0
for i = 4, #ARGV, 2 do
  local m = ARGV[2] .. ARGV[i]
  if held(m, ARGV[i + 1]) then
    redis.call('HSET', m, 'h', '', 'v', now)
    redis.call('HINCRBY', m, 'd', -1)
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i])
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[3], '') end
return n`
}

/** KEYS: the store's identity key. ARGV: a fresh identity. The store's identity, drawn by the first caller. */
export const identity = {
  numberOfKeys: 1,
  lua: `#!lua flags=allow-oom
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]`
}

/**
 * KEYS: hidden, dead. ARGV: now, message key prefix, dead letter key prefix, then (id, handle, why) triples: messages
 * a claim took whose body cannot be decoded, set aside as dead letters (the hash moved, with why and when; the
 * journal kept) where the handle still holds them — never delivered again, no longer counted. The ones moved.
 */
export const deadLetter = {
  numberOfKeys: 2,
  lua: `#!lua flags=allow-oom
${now}${held}
local n = 0
for i = 4, #ARGV, 3 do
  local m = ARGV[2] .. ARGV[i]
  if held(m, ARGV[i + 1]) then
    local dl = ARGV[3] .. ARGV[i]
    redis.call('RENAME', m, dl)
    redis.call('HSET', dl, 'why', ARGV[i + 2], 'at', now, 'h', '')
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[2], now, ARGV[i])
    n = n + 1
  end
end
return n`
}

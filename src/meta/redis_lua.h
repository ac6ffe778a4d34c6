/*
 * The Lua scripts of the redis:// backend (src/meta/redis.c). Every
 * operation on one rank is one script, so Redis runs it atomically, however
 * many kvpage processes share the store. Each rank script gets the same
 * eight keys, all with the rank's hash tag (one cluster slot):
 *
 *   KEYS[1] m      HASH   num_pages, hwm (pages >= hwm were never handed out
 *                         from the free set), clock (LRU counter), fseq
 *                         (free-set counter), rseq (reservation counter), and
 *                         the counters of kvp_rank_stats
 *   KEYS[2] free   ZSET   FREE pages below hwm, scored by fseq: the highest
 *                         is the most recently freed
 *   KEYS[3] res    ZSET   RESERVED pages by lease deadline (ms, Redis TIME)
 *   KEYS[4] rs     HASH   RESERVED page -> its reservation's rseq (orders
 *                         reservations with one deadline as they were made)
 *   KEYS[5] lru    ZSET   HELD pages by clock: the lowest is the least recent
 *   KEYS[6] grace  HASH   HELD page -> end of its read grace (ms)
 *   KEYS[7] k2p    HASH   key -> page
 *   KEYS[8] p2k    HASH   page -> key
 *
 * A page is HELD when p2k has it, RESERVED when res has it, else FREE. A
 * rank of 2^31 pages costs one small hash until its pages are used. Time is
 * Redis's TIME (scripts replicate their effects, so reading it is allowed).
 * Each script starts with a shebang (Redis 7): a script that may grow the
 * store (allocate, confirm, init) is refused up front when Redis is at its
 * maxmemory, never half-way (Redis does not undo a script's writes);
 * lookups, deletes, clears and stats may run (they free memory or rewrite
 * in place), exists and check are read only.
 *
 * The replies are arrays whose first element is a status: 0 done, else the
 * rule the request broke (ST_* in redis.c), and the C side words the
 * message exactly as the in-process engine does.
 */
#ifndef KVP_META_REDIS_LUA_H
#define KVP_META_REDIS_LUA_H

#define KVP_LUA_PRELUDE                                                                            \
    "local M, FREE, RES, RS, LRU, GRACE, K2P, P2K = KEYS[1], KEYS[2], KEYS[3], KEYS[4], "          \
    "KEYS[5], KEYS[6], KEYS[7], KEYS[8]\n"                                                         \
    "local function now_ms()\n"                                                                    \
    "  local t = redis.call('TIME')\n"                                                             \
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"                         \
    "end\n"                                                                                        \
    "local st = nil\n"                                                                             \
    "local cnt = {}\n"                                                                             \
    "-- the rank's fields, or nil when it is not initialized\n"                                    \
    "local function load()\n"                                                                      \
    "  local v = redis.call('HMGET', M, 'num_pages', 'hwm', 'clock', 'fseq', 'rseq')\n"            \
    "  if not v[1] then return nil end\n"                                                          \
    "  st = {np = tonumber(v[1]), hwm = tonumber(v[2]), clock = tonumber(v[3]),\n"                 \
    "        fseq = tonumber(v[4]), rseq = tonumber(v[5])}\n"                                      \
    "  st.hwm0, st.clock0, st.fseq0, st.rseq0 = st.hwm, st.clock, st.fseq, st.rseq\n"              \
    "  return st\n"                                                                                \
    "end\n"                                                                                        \
    "local function count(f, by) if by ~= 0 then cnt[f] = (cnt[f] or 0) + by end end\n"            \
    "-- writes back what changed\n"                                                                \
    "local function store()\n"                                                                     \
    "  local a = {}\n"                                                                             \
    "  if st.hwm ~= st.hwm0 then a[#a+1] = 'hwm'; a[#a+1] = st.hwm end\n"                          \
    "  if st.clock ~= st.clock0 then a[#a+1] = 'clock'; a[#a+1] = st.clock end\n"                  \
    "  if st.fseq ~= st.fseq0 then a[#a+1] = 'fseq'; a[#a+1] = st.fseq end\n"                      \
    "  if st.rseq ~= st.rseq0 then a[#a+1] = 'rseq'; a[#a+1] = st.rseq end\n"                      \
    "  if #a > 0 then redis.call('HSET', M, unpack(a)) end\n"                                      \
    "  for f, by in pairs(cnt) do redis.call('HINCRBY', M, f, by) end\n"                           \
    "end\n"                                                                                        \
    "local function is_held(p) return redis.call('HEXISTS', P2K, p) == 1 end\n"                    \
    "local function is_reserved(p) return redis.call('ZSCORE', RES, p) ~= false end\n"             \
    "-- p, unlinked from its state, becomes FREE (the free set only below hwm)\n"                  \
    "local function to_free(p)\n"                                                                  \
    "  if p < st.hwm then st.fseq = st.fseq + 1; redis.call('ZADD', FREE, st.fseq, p) end\n"       \
    "end\n"                                                                                        \
    "local function unreserve(p) redis.call('ZREM', RES, p); redis.call('HDEL', RS, p) end\n"      \
    "local function touch(p) st.clock = st.clock + 1; redis.call('ZADD', LRU, st.clock, p) end\n"  \
    "local function hold(p, key)\n"                                                                \
    "  redis.call('HSET', P2K, p, key); redis.call('HSET', K2P, key, p)\n"                         \
    "  touch(p) -- a page that was not HELD has no grace (unhold and clears drop it)\n"            \
    "end\n"                                                                                        \
    "local function unhold(p)\n"                                                                   \
    "  local key = redis.call('HGET', P2K, p)\n"                                                   \
    "  redis.call('HDEL', P2K, p); redis.call('HDEL', K2P, key)\n"                                 \
    "  redis.call('ZREM', LRU, p); redis.call('HDEL', GRACE, p)\n"                                 \
    "end\n"                                                                                        \
    "-- expired reservations go back to FREE, oldest first\n"                                      \
    "local function expire(now)\n"                                                                 \
    "  local ex = redis.call('ZRANGEBYSCORE', RES, '-inf', now, 'WITHSCORES')\n"                   \
    "  if #ex == 0 then return end\n"                                                              \
    "  local it = {}\n"                                                                            \
    "  for i = 1, #ex, 2 do\n"                                                                     \
    "    it[#it+1] = {tonumber(ex[i+1]), tonumber(redis.call('HGET', RS, ex[i]) or 0), "           \
    "tonumber(ex[i])}\n"                                                                           \
    "  end\n"                                                                                      \
    "  table.sort(it, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end "                 \
    "return a[2] < b[2] end)\n"                                                                    \
    "  for _, e in ipairs(it) do unreserve(e[3]); to_free(e[3]) end\n"                             \
    "  count('expired', #it)\n"                                                                    \
    "end\n"                                                                                        \
    "local function clear_pages()\n"                                                               \
    "  redis.call('DEL', FREE, RES, RS, LRU, GRACE, K2P, P2K)\n"                                   \
    "  st.hwm = 0\n"                                                                               \
    "end\n"                                                                                        \
    "-- redis.call(cmd, key, list...) in pieces of at most 4000 arguments (the\n"                  \
    "-- most Lua's unpack passes), the replies of the pieces end to end\n"                         \
    "local function bulk(cmd, key, list)\n"                                                        \
    "  local out, n = {}, #list\n"                                                                 \
    "  for i = 1, n, 4000 do\n"                                                                    \
    "    local r = redis.call(cmd, key, unpack(list, i, math.min(i + 3999, n)))\n"                 \
    "    if type(r) == 'table' then for j = 1, #r do out[#out + 1] = r[j] end end\n"               \
    "  end\n"                                                                                      \
    "  return out\n"                                                                               \
    "end\n"

/* ARGV: num_pages. {0} / {ST_RESIZE_HELD, old num_pages}. */
#define KVP_LUA_INIT                                                                               \
    "#!lua\n" KVP_LUA_PRELUDE "local np = tonumber(ARGV[1])\n"                                     \
    "if not load() then\n"                                                                         \
    "  redis.call('HSET', M, 'num_pages', np, 'hwm', 0, 'clock', 0, 'fseq', 0, 'rseq', 0,\n"       \
    "    'hits', 0, 'misses', 0, 'allocations', 0, 'evictions', 0, 'expired', 0, "                 \
    "'release_held', 0)\n"                                                                         \
    "  return {0}\n"                                                                               \
    "end\n"                                                                                        \
    "if st.np == np then return {0} end\n"                                                         \
    "expire(now_ms())\n"                                                                           \
    "if redis.call('ZCARD', LRU) > 0 or redis.call('ZCARD', RES) > 0 then\n"                       \
    "  store(); return {2, st.np}\n"                                                               \
    "end\n"                                                                                        \
    "clear_pages(); store()\n"                                                                     \
    "redis.call('HSET', M, 'num_pages', np)\n"                                                     \
    "return {0}\n"

/* ARGV: lease_ms, scan bound, keys. {0, pages..., existed...} / {ST_NOT_INIT}. */
#define KVP_LUA_ALLOCATE                                                                           \
    "#!lua\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                                \
    "local lease, scan_max = tonumber(ARGV[1]), tonumber(ARGV[2])\n"                               \
    "local n = #ARGV - 2\n"                                                                        \
    "local now = now_ms()\n"                                                                       \
    "expire(now)\n"                                                                                \
    "local keys = {}\n"                                                                            \
    "for i = 1, n do keys[i] = ARGV[i + 2] end\n"                                                  \
    "local cur = bulk('HMGET', K2P, keys)\n"                                                       \
    "local pages, existed, marked, seen = {}, {}, {}, {}\n"                                        \
    "-- hits first, touched last to first: earlier keys end up more recent\n"                      \
    "local hits, lru = 0, {}\n"                                                                    \
    "for i = n, 1, -1 do\n"                                                                        \
    "  local p = cur[i]\n"                                                                         \
    "  if p then\n"                                                                                \
    "    p = tonumber(p); pages[i] = p; existed[i] = 1\n"                                          \
    "    st.clock = st.clock + 1; lru[#lru + 1] = st.clock; lru[#lru + 1] = p\n"                   \
    "    marked[p] = true; hits = hits + 1\n"                                                      \
    "  else pages[i] = -2; existed[i] = 0 end\n"                                                   \
    "end\n"                                                                                        \
    "bulk('ZADD', LRU, lru)\n"                                                                     \
    "count('hits', hits)\n"                                                                        \
    "-- the keys that need a page, in order; a key given again shares the first's\n"               \
    "local want = {}\n"                                                                            \
    "for i = 1, n do\n"                                                                            \
    "  local key = keys[i]\n"                                                                      \
    "  if not seen[key] then\n"                                                                    \
    "    seen[key] = i\n"                                                                          \
    "    if pages[i] == -2 then want[#want + 1] = i end\n"                                         \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "local got = {}\n"                                                                             \
    "-- FREE pages below hwm, the most recently freed first\n"                                     \
    "if #want > 0 then\n"                                                                          \
    "  local t = redis.call('ZPOPMAX', FREE, #want)\n"                                             \
    "  for j = 1, #t, 2 do got[#got + 1] = tonumber(t[j]) end\n"                                   \
    "end\n"                                                                                        \
    "-- then pages never handed out, from hwm up (one confirmed without a\n"                       \
    "-- reservation may be HELD there)\n"                                                          \
    "while #got < #want and st.hwm < st.np do\n"                                                   \
    "  local k = math.min(#want - #got + 16, st.np - st.hwm, 2000)\n"                              \
    "  local cand = {}\n"                                                                          \
    "  for j = 1, k do cand[j] = st.hwm + j - 1 end\n"                                             \
    "  local h = redis.call('HMGET', P2K, unpack(cand))\n"                                         \
    "  local r = redis.call('ZMSCORE', RES, unpack(cand))\n"                                       \
    "  for j = 1, k do\n"                                                                          \
    "    if #got >= #want then break end\n"                                                        \
    "    st.hwm = cand[j] + 1\n"                                                                   \
    "    if not h[j] and not r[j] then got[#got + 1] = cand[j] end\n"                              \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "-- then the least recent HELD pages, not in their read grace nor returned by\n"               \
    "-- this request; at most scan_max skipped for their grace\n"                                  \
    "local evicted, ekeys = {}, {}\n"                                                              \
    "if #got < #want and scan_max > 0 then\n"                                                      \
    "  local off, skip, stop = 0, 0, false\n"                                                      \
    "  while #got < #want and not stop do\n"                                                       \
    "    local b = redis.call('ZRANGE', LRU, off, off + 63)\n"                                     \
    "    if #b == 0 then break end\n"                                                              \
    "    local g = redis.call('HMGET', GRACE, unpack(b))\n"                                        \
    "    local ks = redis.call('HMGET', P2K, unpack(b))\n"                                         \
    "    for j = 1, #b do\n"                                                                       \
    "      if #got >= #want then break end\n"                                                      \
    "      local p = tonumber(b[j])\n"                                                             \
    "      if marked[p] then stop = true; break end\n"                                             \
    "      off = off + 1\n"                                                                        \
    "      if g[j] and tonumber(g[j]) > now then\n"                                                \
    "        skip = skip + 1\n"                                                                    \
    "        if skip >= scan_max then stop = true; break end\n"                                    \
    "      else\n"                                                                                 \
    "        evicted[#evicted + 1] = p; got[#got + 1] = p\n"                                       \
    "        if ks[j] then ekeys[#ekeys + 1] = ks[j] end\n"                                        \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "if #evicted > 0 then\n"                                                                       \
    "  bulk('HDEL', P2K, evicted); bulk('HDEL', K2P, ekeys)\n"                                     \
    "  bulk('ZREM', LRU, evicted); bulk('HDEL', GRACE, evicted)\n"                                 \
    "  count('evictions', #evicted)\n"                                                             \
    "end\n"                                                                                        \
    "local res, rs, allocs = {}, {}, 0\n"                                                          \
    "for j = 1, #want do\n"                                                                        \
    "  local i, p = want[j], got[j]\n"                                                             \
    "  if p then\n"                                                                                \
    "    st.rseq = st.rseq + 1\n"                                                                  \
    "    res[#res + 1] = now + lease; res[#res + 1] = p\n"                                         \
    "    rs[#rs + 1] = p; rs[#rs + 1] = st.rseq\n"                                                 \
    "    allocs = allocs + 1; pages[i] = p\n"                                                      \
    "  else pages[i] = -1 end\n"                                                                   \
    "end\n"                                                                                        \
    "bulk('ZADD', RES, res); bulk('HSET', RS, rs)\n"                                               \
    "for i = 1, n do if pages[i] == -2 then pages[i] = pages[seen[keys[i]]] end end\n"             \
    "count('misses', #want); count('allocations', allocs)\n"                                       \
    "store()\n"                                                                                    \
    "local r = {0}\n"                                                                              \
    "for i = 1, n do r[i + 1] = pages[i] end\n"                                                    \
    "for i = 1, n do r[n + i + 1] = existed[i] end\n"                                              \
    "return r\n"

/* ARGV: n, nrel, the index of a page confirmed for two keys (-1: none),
 * keys, pages, releases. {0} / {ST_NOT_INIT} / {ST_CONFIRM_PAGE, i, np} /
 * {ST_RELEASE_PAGE, i, np} / {ST_HELD_BY_OTHER, i}. */
#define KVP_LUA_CONFIRM                                                                            \
    "#!lua\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                                \
    "local n, nrel, dup = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"               \
    "local function page(s)\n"                                                                     \
    "  local p = tonumber(s)\n"                                                                    \
    "  if not p or p < 0 or p >= st.np or p ~= math.floor(p) then return nil end\n"                \
    "  return p\n"                                                                                 \
    "end\n"                                                                                        \
    "local ps, rel, keys = {}, {}, {}\n"                                                           \
    "for i = 1, n do ps[i] = page(ARGV[3 + n + i]); if not ps[i] then return {3, i - 1, st.np} "   \
    "end end\n"                                                                                    \
    "for i = 1, nrel do rel[i] = page(ARGV[3 + 2 * n + i]); if not rel[i] then return {4, i - 1, " \
    "st.np} end end\n"                                                                             \
    "for i = 1, n do keys[i] = ARGV[3 + i] end\n"                                                  \
    "local owner = bulk('HMGET', P2K, ps)\n"                                                       \
    "for i = 1, n do\n"                                                                            \
    "  if owner[i] and owner[i] ~= keys[i] then return {5, i - 1} end\n"                           \
    "end\n"                                                                                        \
    "if dup >= 0 then return {5, dup} end\n"                                                       \
    "-- what the pages and keys are before, then this request's changes on top\n"                  \
    "local held, reserved, haskey = {}, {}, {}\n"                                                  \
    "local resv, kpage = bulk('ZMSCORE', RES, ps), bulk('HMGET', K2P, keys)\n"                     \
    "for i = 1, n do\n"                                                                            \
    "  if owner[i] then held[ps[i]] = true end\n"                                                  \
    "  if resv[i] then reserved[ps[i]] = true end\n"                                               \
    "  if kpage[i] then haskey[keys[i]] = true end\n"                                              \
    "end\n"                                                                                        \
    "local rres, rheld = bulk('ZMSCORE', RES, rel), bulk('HMGET', P2K, rel)\n"                     \
    "for i = 1, nrel do\n"                                                                         \
    "  if rres[i] then reserved[rel[i]] = true end\n"                                              \
    "  if rheld[i] then held[rel[i]] = true end\n"                                                 \
    "end\n"                                                                                        \
    "local freeop, unres = {}, {} -- page -> its new free-set score, or false: taken out\n"        \
    "local hp, hk, hg, lru = {}, {}, {}, {}\n"                                                     \
    "local function to_free(p)\n"                                                                  \
    "  if p < st.hwm then st.fseq = st.fseq + 1; freeop[p] = st.fseq end\n"                        \
    "end\n"                                                                                        \
    "for i = 1, n do\n"                                                                            \
    "  local p, key = ps[i], keys[i]\n"                                                            \
    "  if not held[p] then\n"                                                                      \
    "    if reserved[p] then reserved[p] = nil; unres[#unres + 1] = p\n"                           \
    "    elseif p < st.hwm then freeop[p] = false end\n"                                           \
    "    -- the key's first confirmed page wins\n"                                                 \
    "    if haskey[key] then to_free(p) else\n"                                                    \
    "      held[p] = true; haskey[key] = true\n"                                                   \
    "      hp[#hp + 1] = p; hp[#hp + 1] = key; hk[#hk + 1] = key; hk[#hk + 1] = p\n"               \
    "      hg[#hg + 1] = p\n"                                                                      \
    "      st.clock = st.clock + 1; lru[#lru + 1] = st.clock; lru[#lru + 1] = p\n"                 \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "local rh = 0\n"                                                                               \
    "for i = 1, nrel do\n"                                                                         \
    "  local p = rel[i]\n"                                                                         \
    "  if reserved[p] then reserved[p] = nil; unres[#unres + 1] = p; to_free(p)\n"                 \
    "  elseif held[p] then rh = rh + 1 end\n"                                                      \
    "end\n"                                                                                        \
    "bulk('ZREM', RES, unres); bulk('HDEL', RS, unres)\n"                                          \
    "local frem, fadd = {}, {}\n"                                                                  \
    "for p, s in pairs(freeop) do\n"                                                               \
    "  if s then fadd[#fadd + 1] = s; fadd[#fadd + 1] = p else frem[#frem + 1] = p end\n"          \
    "end\n"                                                                                        \
    "bulk('ZREM', FREE, frem); bulk('ZADD', FREE, fadd)\n"                                         \
    "bulk('HSET', P2K, hp); bulk('HSET', K2P, hk); bulk('HDEL', GRACE, hg); bulk('ZADD', LRU, "    \
    "lru)\n"                                                                                       \
    "count('release_held', rh)\n"                                                                  \
    "store()\n"                                                                                    \
    "return {0}\n"

/* ARGV: keys. {0, held...} / {ST_NOT_INIT}. Read only. */
#define KVP_LUA_EXISTS                                                                             \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE                                                      \
    "if redis.call('HEXISTS', M, 'num_pages') == 0 then return {1} end\n"                          \
    "local v, r = bulk('HMGET', K2P, ARGV), {0}\n"                                                 \
    "for i = 1, #ARGV do r[i + 1] = v[i] and 1 or 0 end\n"                                         \
    "return r\n"

/* ARGV: grace_ms, complete_only, a string of '0'/'1' per key (held on every
 * other rank), keys. {0, pages...} / {ST_NOT_INIT}. */
#define KVP_LUA_LOOKUP                                                                             \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local grace, complete, others = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3]\n"                 \
    "local n = #ARGV - 3\n"                                                                        \
    "local now = now_ms()\n"                                                                       \
    "local keys = {}\n"                                                                            \
    "for i = 1, n do keys[i] = ARGV[i + 3] end\n"                                                  \
    "local v = bulk('HMGET', K2P, keys)\n"                                                         \
    "local r = {0}\n"                                                                              \
    "local hits, misses, lru, gset, gdel = 0, 0, {}, {}, {}\n"                                     \
    "for i = n, 1, -1 do\n"                                                                        \
    "  local p = v[i]\n"                                                                           \
    "  if p and complete and string.byte(others, i) ~= 49 then p = nil end\n"                      \
    "  if not p then r[i + 1] = -1; misses = misses + 1 else\n"                                    \
    "    p = tonumber(p); r[i + 1] = p; hits = hits + 1\n"                                         \
    "    st.clock = st.clock + 1; lru[#lru + 1] = st.clock; lru[#lru + 1] = p\n"                   \
    "    if grace > 0 then gset[#gset + 1] = p; gset[#gset + 1] = now + grace\n"                   \
    "    else gdel[#gdel + 1] = p end\n"                                                           \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "bulk('ZADD', LRU, lru); bulk('HSET', GRACE, gset); bulk('HDEL', GRACE, gdel)\n"               \
    "count('hits', hits); count('misses', misses)\n"                                               \
    "store()\n"                                                                                    \
    "return r\n"

/* ARGV: keys. {0} / {ST_NOT_INIT}. */
#define KVP_LUA_DELETE                                                                             \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local v = bulk('HMGET', K2P, ARGV)\n"                                                         \
    "local gone, dp, dk, fadd = {}, {}, {}, {}\n"                                                  \
    "for i = 1, #ARGV do\n"                                                                        \
    "  local key, p = ARGV[i], v[i]\n"                                                             \
    "  if p and not gone[key] then\n"                                                              \
    "    gone[key] = true; p = tonumber(p); dp[#dp + 1] = p; dk[#dk + 1] = key\n"                  \
    "    if p < st.hwm then st.fseq = st.fseq + 1; fadd[#fadd + 1] = st.fseq; fadd[#fadd + 1] = "  \
    "p end\n"                                                                                      \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "bulk('HDEL', P2K, dp); bulk('HDEL', K2P, dk); bulk('ZREM', LRU, dp); bulk('HDEL', GRACE, "    \
    "dp)\n"                                                                                        \
    "bulk('ZADD', FREE, fadd)\n"                                                                   \
    "store()\n"                                                                                    \
    "return {0}\n"

/* {0} / {ST_NOT_INIT}. */
#define KVP_LUA_CLEAR                                                                              \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "clear_pages(); store()\n"                                                                     \
    "return {0}\n"

/* {0, num_pages, free, reserved, held, hits, misses, allocations, evictions,
 * expired, release_held} / {ST_NOT_INIT}; expired reservations first. */
#define KVP_LUA_STATS                                                                              \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "expire(now_ms()); store()\n"                                                                  \
    "local res, held = redis.call('ZCARD', RES), redis.call('HLEN', P2K)\n"                        \
    "local c = redis.call('HMGET', M, 'hits', 'misses', 'allocations', 'evictions', 'expired', "   \
    "'release_held')\n"                                                                            \
    "local r = {0, st.np, st.np - res - held, res, held}\n"                                        \
    "for i = 1, 6 do r[5 + i] = tonumber(c[i] or 0) end\n"                                         \
    "return r\n"

/* {0, num_pages} / {ST_NOT_INIT} / {ST_BROKEN, message}: the invariants. */
#define KVP_LUA_CHECK                                                                              \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local np, hwm = st.np, st.hwm\n"                                                              \
    "local function bad(msg) return {6, msg} end\n"                                                \
    "if not np or np < 1 or np > 2147483647 then return bad('num_pages is out of range') end\n"    \
    "if not hwm or hwm < 0 or hwm > np then return bad('hwm ' .. tostring(hwm) .. "                \
    "' is outside [0, num_pages]') end\n"                                                          \
    "local function inrange(p) return p and p >= 0 and p < np and p == math.floor(p) end\n"        \
    "local held = redis.call('HGETALL', P2K)\n"                                                    \
    "local nheld, below = 0, 0\n"                                                                  \
    "for i = 1, #held, 2 do\n"                                                                     \
    "  local p = tonumber(held[i])\n"                                                              \
    "  if not inrange(p) then return bad('held page ' .. held[i] .. ' out of range') end\n"        \
    "  if redis.call('HGET', K2P, held[i + 1]) ~= held[i] then\n"                                  \
    "    return bad('page ' .. held[i] .. ' is HELD by key \\'' .. string.sub(held[i + 1], 1, "    \
    "64) "                                                                                         \
    ".. '\\' which does not point at it') end\n"                                                   \
    "  if not redis.call('ZSCORE', LRU, held[i]) then return bad('HELD page ' .. held[i] .. "      \
    "' is not on the LRU') end\n"                                                                  \
    "  if is_reserved(p) then return bad('page ' .. held[i] .. ' is HELD and RESERVED') end\n"     \
    "  nheld = nheld + 1\n"                                                                        \
    "  if p < hwm then below = below + 1 end\n"                                                    \
    "end\n"                                                                                        \
    "if redis.call('HLEN', K2P) ~= nheld then return bad(redis.call('HLEN', K2P) .. "              \
    "' keys but ' .. nheld .. ' held pages') end\n"                                                \
    "if redis.call('ZCARD', LRU) ~= nheld then return bad('LRU has ' .. "                          \
    "redis.call('ZCARD', LRU) .. ' pages, ' .. nheld .. ' are HELD') end\n"                        \
    "local res = redis.call('ZRANGE', RES, 0, -1)\n"                                               \
    "for _, ps in ipairs(res) do\n"                                                                \
    "  if not inrange(tonumber(ps)) then return bad('reserved page ' .. ps .. ' out of range') "   \
    "end\n"                                                                                        \
    "  if not redis.call('HGET', RS, ps) then return bad('RESERVED page ' .. ps .. "               \
    "' has no reservation number') end\n"                                                          \
    "  if tonumber(ps) < hwm then below = below + 1 end\n"                                         \
    "end\n"                                                                                        \
    "if redis.call('HLEN', RS) ~= #res then return bad('reservation numbers do not match the "     \
    "reservations') end\n"                                                                         \
    "local fr = redis.call('ZRANGE', FREE, 0, -1)\n"                                               \
    "for _, ps in ipairs(fr) do\n"                                                                 \
    "  local p = tonumber(ps)\n"                                                                   \
    "  if not inrange(p) or p >= hwm then return bad('free set has page ' .. ps .. "               \
    "' at or above hwm ' .. hwm) end\n"                                                            \
    "  if is_held(p) or is_reserved(p) then return bad('page ' .. ps .. "                          \
    "' on the free set is not FREE') end\n"                                                        \
    "end\n"                                                                                        \
    "if #fr ~= hwm - below then return bad((hwm - below) .. ' FREE pages below hwm, free set "     \
    "has ' .. #fr) end\n"                                                                          \
    "local g = redis.call('HKEYS', GRACE)\n"                                                       \
    "for _, ps in ipairs(g) do if not is_held(ps) then return bad('page ' .. ps .. "               \
    "' has a read grace but is not HELD') end end\n"                                               \
    "return {0, np}\n"

/* KEYS: namespaces (ZSET name -> creation number), their counter. ARGV: name. */
#define KVP_LUA_NS_CREATE                                                                          \
    "#!lua\n"                                                                                      \
    "if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end\n"                                \
    "redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[1])\n"                          \
    "return 1\n"

#endif

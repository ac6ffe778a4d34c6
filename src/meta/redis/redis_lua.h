/*
 * The Lua scripts of the redis:// backend (src/meta/redis/redis.c). Every
 * operation on one rank is one script, so Redis runs it atomically, however
 * many kvpage processes share the store. Each rank script gets the same
 * thirteen keys, all with the rank's hash tag (one cluster slot):
 *
 *   KEYS[1] m      STRING the rank's fields, in decimal separated by
 *                         spaces: num_pages, hwm (pages >= hwm were never
 *                         handed out from the free set), top (no page >= top
 *                         is HELD or RESERVED: 1 + the highest page ever
 *                         handed out or confirmed, at least hwm), clock (LRU
 *                         counter), fseq (free-set counter), rseq
 *                         (reservation counter: one per page reserved), nres
 *                         (RESERVED pages), then the counters of
 *                         kvp_rank_stats: hits, misses, allocations,
 *                         evictions, expired, release_held, then ceil
 *                         (pages >= ceil were handed out from the top;
 *                         written only when below num_pages, so a rank
 *                         that SGLang's order never took from the top
 *                         keeps the 13 fields of earlier versions)
 *   KEYS[2] free   ZSET   FREE pages outside the untouched range [hwm,
 *                         ceil), scored by fseq: the lowest is the
 *                         earliest freed, the highest the most recently
 *   KEYS[3] res    ZSET   reservations (one per allocation that reserved
 *                         pages, named by the rseq of its first page) by
 *                         lease deadline (ms, Redis TIME)
 *   KEYS[4] lru    ZSET   HELD pages by clock: the lowest is the least recent
 *   KEYS[5] grace  HASH   HELD page -> end of its read grace (ms)
 *   KEYS[6] k2p    HASH   key -> HELD page
 *   KEYS[7] p2k    HASH   HELD page -> its key; RESERVED page -> a NUL byte
 *                         and its reservation's name (no key has a NUL)
 *   KEYS[8] rb     HASH   reservation -> its pages in decimal separated by
 *                         spaces, in rseq order (some may no longer be
 *                         RESERVED by it); '#' .. reservation -> how many
 *                         still are. A reservation goes when that reaches 0
 *                         or its deadline passes: its pages still RESERVED
 *                         by it then expire, by deadline, then rseq
 *   KEYS[9] pin    ZSET   pinned key -> the pin's deadline (ms, Redis TIME)
 *   KEYS[10] pinc  HASH   pinned key -> its count of pins (the pins of the
 *                         namespace, kept on every rank: protocol.md §5)
 *   KEYS[11] hx    HASH   's' and a HELD key's first 16 hex digits, 'v' and
 *                         its last 16 (lower case), where they are hex ->
 *                         its page: the query by the engines' block hashes
 *   KEYS[12] ev    STREAM the rank's changes of what it holds (kvpage serve
 *                         --kv-events): per script call that made some,
 *                         an entry per 2000 of them, its field 's' (the
 *                         keys got pages: confirmed) or 'r' (they lost them:
 *                         evicted, deleted, cleared, dropped) -> the keys in
 *                         order, separated by NUL bytes (more fields may
 *                         come: a reader skips the ones it does not know);
 *                         a confirmation with parents or tokens adds 'p'
 *                         (each stored key's parent, '' none, separated by
 *                         NUL bytes) and/or 't' (per stored key its count
 *                         of tokens, then they: little-endian u32s);
 *                         ids 1-0, 1-1, ... Trimmed to about
 *                         KVP_LUA_EVMAX entries (?events_max=); always
 *                         written, so that every server of the state may
 *                         publish them (src/meta/redis/redis.c, "changes")
 *   KEYS[13] lin   HASH   HELD key -> what the confirmation that stored it
 *                         said of it, when it said something: its tokens
 *                         (their count, then they: little-endian u32s; a
 *                         count 0 when not known), then its parent's key
 *                         (none when empty). The inventory reads it
 *                         (kvp_meta_inventory); every script that takes a
 *                         key's page drops its entry, and only touches lin
 *                         when it exists (EXISTS), so a rank whose
 *                         confirmations name no parents or tokens never has
 *                         one and pays one EXISTS per confirm, eviction or
 *                         delete
 *
 * A page is HELD when p2k has it with a key, RESERVED when p2k has it with
 * a reservation (which res and rb have), else FREE. A rank of 2^31 pages
 * costs one small string until its pages are used. Time is Redis's TIME
 * (scripts replicate their effects, so reading it is allowed). Every integer given
 * to redis.call is text made with string.format('%d') (a Lua number would
 * be formatted with %.17g, a cost of its own), and a script reads the
 * rank's fields with one GET and writes them back, when they changed, with
 * one SET. Each script starts with a shebang (Redis 7): a script that may
 * grow the store (allocate, confirm, init) is refused up front when Redis is at
 * its maxmemory, never half-way (Redis does not undo a script's writes);
 * lookups, deletes, clears and stats may run (they free memory or rewrite
 * in place), exists and check are read only.
 *
 * The replies are arrays whose first element is a status: 0 done, else the
 * rule the request broke (ST_* in redis.c), and the C side words the
 * message exactly as the in-process engine does.
 */
#ifndef KVP_META_REDIS_LUA_H
#define KVP_META_REDIS_LUA_H

/* The entries a rank's stream of changes keeps (about: trimmed with "~"):
 * the readers (every kvpage serve --kv-events of the state) read them within
 * milliseconds; this covers a reader that lags by about a second of a rank
 * written at Redis's full speed (~2000 scripts/s here). Not more by default:
 * the streams are written whether or not a server publishes, and an entry
 * of 64 keys of 32 hex digits takes ~2.8 KB of Redis memory (5.6 MB a rank
 * at 2000; 28 MB at 10000). */
#define KVP_LUA_EVMAX "2000"

#define KVP_LUA_PRELUDE                                                                            \
    "local M, FREE, RES, LRU, GRACE, K2P, P2K, RB = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], " \
    "KEYS[6],\n"                                                                                   \
    "  KEYS[7], KEYS[8]\n"                                                                         \
    "local PIN, PINC, HX, EV, LIN = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]\n"             \
    "local call, fmt, byte = redis.call, string.format, string.byte\n"                             \
    "-- integers go to Redis as text made here: a Lua number would be formatted\n"                 \
    "-- with %.17g\n"                                                                              \
    "local function I(x) return fmt('%d', x) end\n"                                                \
    "local function now_ms()\n"                                                                    \
    "  local t = call('TIME')\n"                                                                   \
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"                         \
    "end\n"                                                                                        \
    "-- the rank's fields: one string in M, the numbers of F separated by spaces\n"                \
    "local F = {'num_pages', 'hwm', 'top', 'clock', 'fseq', 'rseq', 'nres', 'hits', 'misses',\n"   \
    "  'allocations', 'evictions', 'expired', 'release_held', 'ceil'}\n"                           \
    "local st, st0 = nil, nil\n"                                                                   \
    "-- the rank's fields, or nil when it is not initialized\n"                                    \
    "local function load()\n"                                                                      \
    "  st0 = call('GET', M)\n"                                                                     \
    "  if not st0 then return nil end\n"                                                           \
    "  st = {}\n"                                                                                  \
    "  local i = 0\n"                                                                              \
    "  for x in string.gmatch(st0, '%S+') do i = i + 1; st[F[i]] = tonumber(x) end\n"              \
    "  st.ceil = st.ceil or st.num_pages\n"                                                        \
    "  return st\n"                                                                                \
    "end\n"                                                                                        \
    "-- page p is outside the untouched range: on the free set when FREE\n"                        \
    "local function touched(p) return p < st.hwm or p >= st.ceil end\n"                            \
    "local function packed()\n"                                                                    \
    "  return fmt('%d %d %d %d %d %d %d %d %d %d %d %d %d', st.num_pages, st.hwm, st.top, "        \
    "st.clock,\n"                                                                                  \
    "    st.fseq, st.rseq, st.nres, st.hits, st.misses, st.allocations, st.evictions, "            \
    "st.expired,\n"                                                                                \
    "    st.release_held) .. (st.ceil < st.num_pages and fmt(' %d', st.ceil) or '')\n"             \
    "end\n"                                                                                        \
    "-- writes back what changed\n"                                                                \
    "local function store()\n"                                                                     \
    "  local v = packed()\n"                                                                       \
    "  if v ~= st0 then call('SET', M, v) end\n"                                                   \
    "end\n"                                                                                        \
    "-- a P2K value: a RESERVED page's is NUL and its reservation's number, a HELD\n"              \
    "-- one's its key\n"                                                                           \
    "local function is_res(v) return byte(v, 1) == 0 end\n"                                        \
    "local function is_held(v) return v and byte(v, 1) ~= 0 end\n"                                 \
    "-- redis.call(cmd, key, list...) in pieces of at most 4000 arguments (the\n"                  \
    "-- most Lua's unpack passes), the replies of the pieces end to end\n"                         \
    "local function bulk(cmd, key, list)\n"                                                        \
    "  local n = #list\n"                                                                          \
    "  if n <= 4000 then\n"                                                                        \
    "    if n == 0 then return {} end\n"                                                           \
    "    return call(cmd, key, unpack(list))\n"                                                    \
    "  end\n"                                                                                      \
    "  local out = {}\n"                                                                           \
    "  for i = 1, n, 4000 do\n"                                                                    \
    "    local r = call(cmd, key, unpack(list, i, math.min(i + 3999, n)))\n"                       \
    "    if type(r) == 'table' then for j = 1, #r do out[#out + 1] = r[j] end end\n"               \
    "  end\n"                                                                                      \
    "  return out\n"                                                                               \
    "end\n"                                                                                        \
    "-- bulk of ARGV[first..last] (last: #ARGV when nil)\n"                                        \
    "local function bulk_argv(cmd, key, first, last)\n"                                            \
    "  last = last or #ARGV\n"                                                                     \
    "  local n = last - first + 1\n"                                                               \
    "  if n >= 1 and n <= 4000 then return call(cmd, key, unpack(ARGV, first, last)) end\n"        \
    "  local l = {}\n"                                                                             \
    "  for i = first, last do l[#l + 1] = ARGV[i] end\n"                                           \
    "  return bulk(cmd, key, l)\n"                                                                 \
    "end\n"                                                                                        \
    "-- HDEL of what LIN keeps of keys that no longer hold a page (or hold one\n"                  \
    "-- without it), when it keeps anything: no cost to a rank without lineage\n"                  \
    "local function unlin(keys)\n"                                                                 \
    "  if #keys > 0 and call('EXISTS', LIN) == 1 then bulk('HDEL', LIN, keys) end\n"               \
    "end\n"                                                                                        \
    "-- HDEL of the read graces of pages, when there are any\n"                                    \
    "local function ungrace(list)\n"                                                               \
    "  if #list > 0 and call('EXISTS', GRACE) == 1 then bulk('HDEL', GRACE, list) end\n"           \
    "end\n"                                                                                        \
    "-- expired reservations go back to FREE, oldest first: by deadline, then\n"                   \
    "-- rseq (a reservation's number, then the page's place in it)\n"                              \
    "local function expire(now)\n"                                                                 \
    "  local ex = call('ZRANGEBYSCORE', RES, '-inf', I(now), 'WITHSCORES')\n"                      \
    "  if #ex == 0 then return end\n"                                                              \
    "  local bs, cs, mk = {}, {}, {}\n"                                                            \
    "  for i = 1, #ex, 2 do\n"                                                                     \
    "    local b = ex[i]\n"                                                                        \
    "    bs[#bs + 1] = b; cs[#cs + 1] = '#' .. b; mk[#mk + 1] = '\\0' .. b\n"                      \
    "  end\n"                                                                                      \
    "  local lists = bulk('HMGET', RB, bs)\n"                                                      \
    "  local ps, of = {}, {} -- the pages of the reservations, the index of theirs\n"              \
    "  for j = 1, #bs do\n"                                                                        \
    "    for p in string.gmatch(lists[j] or '', '%S+') do ps[#ps + 1] = p; of[#ps] = j end\n"      \
    "  end\n"                                                                                      \
    "  local v = bulk('HMGET', P2K, ps)\n"                                                         \
    "  local it = {} -- the pages still RESERVED by these reservations\n"                          \
    "  for k = 1, #ps do\n"                                                                        \
    "    local j = of[k]\n"                                                                        \
    "    if v[k] == mk[j] then it[#it + 1] = {tonumber(ex[2 * j]), tonumber(bs[j]), k, ps[k]} "    \
    "end\n"                                                                                        \
    "  end\n"                                                                                      \
    "  table.sort(it, function(a, b)\n"                                                            \
    "    if a[1] ~= b[1] then return a[1] < b[1] end\n"                                            \
    "    if a[2] ~= b[2] then return a[2] < b[2] end\n"                                            \
    "    return a[3] < b[3] end)\n"                                                                \
    "  local fadd, pd = {}, {}\n"                                                                  \
    "  for _, e in ipairs(it) do\n"                                                                \
    "    pd[#pd + 1] = e[4]\n"                                                                     \
    "    if touched(tonumber(e[4])) then\n"                                                        \
    "      st.fseq = st.fseq + 1; fadd[#fadd + 1] = I(st.fseq); fadd[#fadd + 1] = e[4]\n"          \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "  bulk('ZREM', RES, bs); bulk('HDEL', RB, bs); bulk('HDEL', RB, cs)\n"                        \
    "  bulk('HDEL', P2K, pd); bulk('ZADD', FREE, fadd)\n"                                          \
    "  st.expired = st.expired + #it; st.nres = st.nres - #it\n"                                   \
    "end\n"                                                                                        \
    "-- the fields of HX for key: 's' and its first 16 hex digits (SGLang's block\n"               \
    "-- hash), 'v' and its last 16 (vLLM's), in lower case, where they are hex;\n"                 \
    "-- appended to out, each followed by val (the key's page) when given\n"                       \
    "local function hx_one(out, tag, d, val)\n"                                                    \
    "  if string.find(d, '[^0-9a-f]') then\n"                                                      \
    "    if string.find(d, '%X') then return end\n"                                                \
    "    d = string.lower(d)\n"                                                                    \
    "  end\n"                                                                                      \
    "  out[#out + 1] = tag .. d; if val then out[#out + 1] = val end\n"                            \
    "end\n"                                                                                        \
    "local function hx_fields(key, out, val)\n"                                                    \
    "  local n = #key\n"                                                                           \
    "  if n < 16 then return end\n"                                                                \
    "  hx_one(out, 's', string.sub(key, 1, 16), val)\n"                                            \
    "  hx_one(out, 'v', string.sub(key, n - 15), val)\n"                                           \
    "end\n"                                                                                        \
    "-- keys[i], no longer HELD on pages[i], leave HX where they are its entry (a\n"               \
    "-- key that shares the digits with another may have replaced it there)\n"                     \
    "local function unindex(keys, pages)\n"                                                        \
    "  local f, who = {}, {}\n"                                                                    \
    "  for i = 1, #keys do\n"                                                                      \
    "    local k0 = #f\n"                                                                          \
    "    hx_fields(keys[i], f)\n"                                                                  \
    "    for j = k0 + 1, #f do who[j] = pages[i] end\n"                                            \
    "  end\n"                                                                                      \
    "  if #f == 0 then return end\n"                                                               \
    "  local v, d = bulk('HMGET', HX, f), {}\n"                                                    \
    "  for j = 1, #f do if v[j] == who[j] then d[#d + 1] = f[j] end end\n"                         \
    "  bulk('HDEL', HX, d)\n"                                                                      \
    "end\n"                                                                                        \
    "-- pins (PIN: key -> deadline, ms; PINC: key -> count) that ended leave\n"                    \
    "local function pin_prune(now)\n"                                                              \
    "  local ex = call('ZRANGEBYSCORE', PIN, '-inf', I(now))\n"                                    \
    "  if #ex > 0 then bulk('ZREM', PIN, ex); bulk('HDEL', PINC, ex) end\n"                        \
    "end\n"                                                                                        \
    "local function clear_pages()\n"                                                               \
    "  call('DEL', FREE, RES, LRU, GRACE, K2P, P2K, RB, HX, LIN)\n"                                \
    "  st.hwm = 0; st.top = 0; st.nres = 0; st.ceil = st.num_pages\n"                              \
    "end\n"                                                                                        \
    "-- the keys that got ('s') or lost ('r') their pages in this call, appended to\n"             \
    "-- EV with the change itself (atomic): an entry per 2000 keys, its field kind\n"              \
    "-- -> the keys separated by NUL bytes (no key has one); entry ids 1-0, 1-1,\n"                \
    "-- ...: a reader sees entries trimmed unread as a jump. extra (confirm's\n"                   \
    "-- parents and tokens, when it has them): field, list aligned with keys,\n"                   \
    "-- separator, ...: each entry gets those fields of its keys too\n"                            \
    "local function ev_put(kind, keys, extra)\n"                                                   \
    "  local n = #keys\n"                                                                          \
    "  for i = 1, n, 2000 do\n"                                                                    \
    "    local j = math.min(i + 1999, n)\n"                                                        \
    "    if not extra then\n"                                                                      \
    "      call('XADD', EV, 'MAXLEN', '~', '" KVP_LUA_EVMAX "', '1-*', kind,\n"                    \
    "        table.concat(keys, '\\0', i, j))\n"                                                   \
    "    else\n"                                                                                   \
    "      local f = {'XADD', EV, 'MAXLEN', '~', '" KVP_LUA_EVMAX "', '1-*', kind,\n"              \
    "        table.concat(keys, '\\0', i, j)}\n"                                                   \
    "      for x = 1, #extra, 3 do\n"                                                              \
    "        f[#f + 1] = extra[x]; f[#f + 1] = table.concat(extra[x + 1], extra[x + 2], i, j)\n"   \
    "      end\n"                                                                                  \
    "      call(unpack(f))\n"                                                                      \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"

/* ARGV: num_pages. {0} / {ST_RESIZE_HELD, old num_pages}. */
#define KVP_LUA_INIT                                                                               \
    "#!lua\n" KVP_LUA_PRELUDE "local np = tonumber(ARGV[1])\n"                                     \
    "if not load() then\n"                                                                         \
    "  call('SET', M, fmt('%d 0 0 0 0 0 0 0 0 0 0 0 0', np))\n"                                    \
    "  call('PERSIST', EV) -- a drop let it expire: the rank is back\n"                            \
    "  return {0}\n"                                                                               \
    "end\n"                                                                                        \
    "if st.num_pages == np then return {0} end\n"                                                  \
    "expire(now_ms())\n"                                                                           \
    "if call('ZCARD', LRU) > 0 or st.nres > 0 then\n"                                              \
    "  store(); return {2, st.num_pages}\n"                                                        \
    "end\n"                                                                                        \
    "clear_pages(); st.num_pages = np; st.ceil = np; store()\n"                                    \
    "return {0}\n"

/* ARGV: lease_ms, scan bound, order (enum kvp_page_order), keys. {0, "page page ...", "0101..."
 * (existed)} / {ST_NOT_INIT}. */
#define KVP_LUA_ALLOCATE                                                                           \
    "#!lua\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                                \
    "local lease, scan_max, order = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]\n"               \
    "local n = #ARGV - 3\n"                                                                        \
    "local now = now_ms()\n"                                                                       \
    "expire(now)\n"                                                                                \
    "local cur = bulk_argv('HMGET', K2P, 4)\n"                                                     \
    "local pages, existed, marked, seen = {}, {}, {}, {} -- pages as text\n"                       \
    "-- hits first, touched last to first: earlier keys end up more recent\n"                      \
    "local hits, lru = 0, {}\n"                                                                    \
    "for i = n, 1, -1 do\n"                                                                        \
    "  local p = cur[i]\n"                                                                         \
    "  if p then\n"                                                                                \
    "    pages[i] = p; existed[i] = '1'\n"                                                         \
    "    st.clock = st.clock + 1; lru[#lru + 1] = I(st.clock); lru[#lru + 1] = p\n"                \
    "    marked[p] = true; hits = hits + 1\n"                                                      \
    "  else pages[i] = false; existed[i] = '0' end\n"                                              \
    "end\n"                                                                                        \
    "bulk('ZADD', LRU, lru)\n"                                                                     \
    "st.hits = st.hits + hits\n"                                                                   \
    "-- the keys that need a page, in order; a key given again shares the first's\n"               \
    "local want = {}\n"                                                                            \
    "for i = 1, n do\n"                                                                            \
    "  local key = ARGV[i + 3]\n"                                                                  \
    "  if not seen[key] then\n"                                                                    \
    "    seen[key] = i\n"                                                                          \
    "    if not pages[i] then want[#want + 1] = i end\n"                                           \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "local nw = #want\n"                                                                           \
    "local got = {} -- the pages found\n"                                                          \
    "-- the free set, from its newest (LIFO) or its oldest end\n"                                  \
    "local function from_free(newest)\n"                                                           \
    "  local t = call(newest and 'ZPOPMAX' or 'ZPOPMIN', FREE, nw - #got)\n"                       \
    "  for j = 1, #t, 2 do got[#got + 1] = t[j] end\n"                                             \
    "end\n"                                                                                        \
    "-- the untouched range from hwm up: its pages below top may be HELD (one\n"                   \
    "-- confirmed without a reservation) or RESERVED, those at or above it are FREE\n"             \
    "local function from_bottom()\n"                                                               \
    "  while #got < nw and st.hwm < st.ceil do\n"                                                  \
    "    if st.hwm >= st.top then\n"                                                               \
    "      local k = math.min(nw - #got, st.ceil - st.hwm)\n"                                      \
    "      for j = st.hwm, st.hwm + k - 1 do got[#got + 1] = I(j) end\n"                           \
    "      st.hwm = st.hwm + k; st.top = st.hwm\n"                                                 \
    "    else\n"                                                                                   \
    "      local k = math.min(nw - #got + 16, math.min(st.top, st.ceil) - st.hwm, 2000)\n"         \
    "      local cand = {}\n"                                                                      \
    "      for j = 1, k do cand[j] = I(st.hwm + j - 1) end\n"                                      \
    "      local h = call('HMGET', P2K, unpack(cand))\n"                                           \
    "      local base = st.hwm\n"                                                                  \
    "      for j = 1, k do\n"                                                                      \
    "        if #got >= nw then break end\n"                                                       \
    "        st.hwm = base + j\n"                                                                  \
    "        if not h[j] then got[#got + 1] = cand[j] end\n"                                       \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "-- the untouched range from ceil down: FREE at or above top, checked below it\n"              \
    "local function from_top()\n"                                                                  \
    "  while #got < nw and st.ceil > st.hwm do\n"                                                  \
    "    local low = math.max(st.top, st.hwm)\n"                                                   \
    "    if st.ceil > low then\n"                                                                  \
    "      local k = math.min(nw - #got, st.ceil - low)\n"                                         \
    "      st.top = math.max(st.top, st.ceil)\n"                                                   \
    "      for j = st.ceil - 1, st.ceil - k, -1 do got[#got + 1] = I(j) end\n"                     \
    "      st.ceil = st.ceil - k\n"                                                                \
    "    else\n"                                                                                   \
    "      local k = math.min(nw - #got + 16, st.ceil - st.hwm, 2000)\n"                           \
    "      local cand = {}\n"                                                                      \
    "      for j = 1, k do cand[j] = I(st.ceil - j) end\n"                                         \
    "      local h = call('HMGET', P2K, unpack(cand))\n"                                           \
    "      local base = st.ceil\n"                                                                 \
    "      for j = 1, k do\n"                                                                      \
    "        if #got >= nw then break end\n"                                                       \
    "        st.ceil = base - j\n"                                                                 \
    "        if not h[j] then got[#got + 1] = cand[j] end\n"                                       \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "-- vLLM ('1'): the untouched range up, then the earliest freed; SGLang ('2'):\n"              \
    "-- the latest freed, then the range down; else the latest freed, then up\n"                   \
    "if nw > 0 then\n"                                                                             \
    "  if order == '1' then from_bottom(); if #got < nw then from_free(false) end\n"               \
    "  else\n"                                                                                     \
    "    from_free(true)\n"                                                                        \
    "    if order == '2' then from_top() else from_bottom() end\n"                                 \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "-- then the least recent HELD pages, not in their read grace nor returned by\n"               \
    "-- this request; a page in its grace or pinned is made recent (a use: out of\n"               \
    "-- the next scan's way, as the in-process engine does), scan_max a request\n"                 \
    "local evicted, ekeys, epages, bump = {}, {}, {}, {}\n"                                        \
    "if #got < nw and scan_max > 0 then\n"                                                         \
    "  local graces, pins = call('EXISTS', GRACE) == 1, call('EXISTS', PIN) == 1\n"                \
    "  local off, skip, stop = 0, 0, false\n"                                                      \
    "  while #got < nw and not stop do\n"                                                          \
    "    local b = call('ZRANGE', LRU, off, off + 63)\n"                                           \
    "    if #b == 0 then break end\n"                                                              \
    "    local g = graces and call('HMGET', GRACE, unpack(b)) or {}\n"                             \
    "    local ks = call('HMGET', P2K, unpack(b))\n"                                               \
    "    local pn = {}\n"                                                                          \
    "    if pins then\n"                                                                           \
    "      local kl = {}\n"                                                                        \
    "      for j = 1, #b do kl[j] = ks[j] or '' end\n"                                             \
    "      pn = call('ZMSCORE', PIN, unpack(kl))\n"                                                \
    "    end\n"                                                                                    \
    "    for j = 1, #b do\n"                                                                       \
    "      if #got >= nw then break end\n"                                                         \
    "      local p = b[j]\n"                                                                       \
    "      if marked[p] then stop = true; break end\n"                                             \
    "      off = off + 1\n"                                                                        \
    "      if (g[j] and tonumber(g[j]) > now) or (pn[j] and tonumber(pn[j]) > now) then\n"         \
    "        bump[#bump + 1] = p\n"                                                                \
    "        skip = skip + 1\n"                                                                    \
    "        if skip >= scan_max then stop = true; break end\n"                                    \
    "      else\n"                                                                                 \
    "        evicted[#evicted + 1] = p; got[#got + 1] = p\n"                                       \
    "        if ks[j] then ekeys[#ekeys + 1] = ks[j]; epages[#ekeys] = p end\n"                    \
    "      end\n"                                                                                  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "if #bump > 0 then\n"                                                                          \
    "  local z = {}\n"                                                                             \
    "  for _, p in ipairs(bump) do st.clock = st.clock + 1; z[#z + 1] = I(st.clock); z[#z + 1] = " \
    "p end\n"                                                                                      \
    "  bulk('ZADD', LRU, z)\n"                                                                     \
    "end\n"                                                                                        \
    "-- (their P2K entries become reservations below)\n"                                           \
    "if #evicted > 0 then\n"                                                                       \
    "  bulk('HDEL', K2P, ekeys); bulk('ZREM', LRU, evicted); ungrace(evicted); unindex(ekeys, "    \
    "epages)\n"                                                                                    \
    "  unlin(ekeys)\n"                                                                             \
    "  st.evictions = st.evictions + #evicted\n"                                                   \
    "  ev_put('r', ekeys)\n"                                                                       \
    "end\n"                                                                                        \
    "-- one reservation of the pages, numbered by its first rseq: res has it by\n"                 \
    "-- deadline, rb its pages in order and their count ('#' .. its number), and\n"                \
    "-- each page's P2K value names it\n"                                                          \
    "local rp, rs, allocs = {}, {}, 0\n"                                                           \
    "local mk = fmt('\\0%d', st.rseq + 1)\n"                                                       \
    "for j = 1, nw do\n"                                                                           \
    "  local i, p = want[j], got[j]\n"                                                             \
    "  if p then\n"                                                                                \
    "    allocs = allocs + 1; rp[allocs] = p\n"                                                    \
    "    rs[#rs + 1] = p; rs[#rs + 1] = mk\n"                                                      \
    "    pages[i] = p\n"                                                                           \
    "  else pages[i] = '-1' end\n"                                                                 \
    "end\n"                                                                                        \
    "if allocs > 0 then\n"                                                                         \
    "  local b = I(st.rseq + 1)\n"                                                                 \
    "  call('ZADD', RES, I(now + lease), b)\n"                                                     \
    "  call('HSET', RB, b, table.concat(rp, ' '), '#' .. b, I(allocs))\n"                          \
    "  bulk('HSET', P2K, rs)\n"                                                                    \
    "  st.rseq = st.rseq + allocs; st.nres = st.nres + allocs\n"                                   \
    "end\n"                                                                                        \
    "for i = 1, n do if not pages[i] then pages[i] = pages[seen[ARGV[i + 3]]] end end\n"           \
    "st.misses = st.misses + nw; st.allocations = st.allocations + allocs\n"                       \
    "store()\n"                                                                                    \
    "-- the pages in decimal separated by spaces (-1: none), a '0' or '1' per key\n"               \
    "return {0, table.concat(pages, ' '), table.concat(existed)}\n"

/* ARGV: n, nrel, the index of a page confirmed for two keys (-1: none), the
 * highest page and release when all are in [0, 2^31) (else -1),
 * keys, pages, releases (pages in decimal, as %lld writes them). {0} /
 * {ST_NOT_INIT} / {ST_CONFIRM_PAGE, i, np} / {ST_RELEASE_PAGE, i, np} /
 * {ST_HELD_BY_OTHER, i}. */
#define KVP_LUA_CONFIRM                                                                            \
    "#!lua\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                                \
    "local n, nrel, dup = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"               \
    "local maxp, maxr = tonumber(ARGV[4]), tonumber(ARGV[5])\n"                                    \
    "local np = st.num_pages\n"                                                                    \
    "-- ARGV[5 + i]: key i; ARGV[k0 + i]: its page; ARGV[r0 + i]: release i\n"                     \
    "local k0, r0 = 5 + n, 5 + 2 * n\n"                                                            \
    "-- after the releases, when the request has parents and/or tokens: 'p', 't'\n"                \
    "-- or 'pt', then ARGV[xp + i]: key i's parent ('' none), ARGV[xt + i]: its\n"                 \
    "-- tokens (their count, then they: little-endian u32s)\n"                                     \
    "local xp, xt\n"                                                                               \
    "if #ARGV > r0 + nrel then\n"                                                                  \
    "  local o = r0 + nrel + 1\n"                                                                  \
    "  local w = ARGV[o]\n"                                                                        \
    "  if string.find(w, 'p', 1, true) then xp = o; o = o + n end\n"                               \
    "  if string.find(w, 't', 1, true) then xt = o end\n"                                          \
    "end\n"                                                                                        \
    "-- the pages come as the C side writes them (%lld): their text is canonical;\n"               \
    "-- maxp (maxr) is the highest of them when all are in [0, 2^31), else -1\n"                   \
    "local function page(s)\n"                                                                     \
    "  local p = tonumber(s)\n"                                                                    \
    "  if not p or p < 0 or p >= np or p ~= math.floor(p) then return nil end\n"                   \
    "  return p\n"                                                                                 \
    "end\n"                                                                                        \
    "local ps, rel = {}, {}\n"                                                                     \
    "if maxp >= 0 and maxp < np then\n"                                                            \
    "  for i = 1, n do ps[i] = tonumber(ARGV[k0 + i]) end\n"                                       \
    "else\n"                                                                                       \
    "  for i = 1, n do ps[i] = page(ARGV[k0 + i]); if not ps[i] then return {3, i - 1, np} end "   \
    "end\n"                                                                                        \
    "end\n"                                                                                        \
    "if maxr >= 0 and maxr < np then\n"                                                            \
    "  for i = 1, nrel do rel[i] = tonumber(ARGV[r0 + i]) end\n"                                   \
    "else\n"                                                                                       \
    "  for i = 1, nrel do rel[i] = page(ARGV[r0 + i]); if not rel[i] then return {4, i - 1, np} "  \
    "end end\n"                                                                                    \
    "end\n"                                                                                        \
    "local owner = bulk_argv('HMGET', P2K, k0 + 1, k0 + n)\n"                                      \
    "for i = 1, n do\n"                                                                            \
    "  local o = owner[i]\n"                                                                       \
    "  if o and o ~= ARGV[5 + i] and not is_res(o) then return {5, i - 1} end\n"                   \
    "end\n"                                                                                        \
    "if dup >= 0 then return {5, dup} end\n"                                                       \
    "-- what the pages and keys are before, then this request's changes on top\n"                  \
    "local held, reserved, haskey = {}, {}, {} -- reserved: page -> its P2K value\n"               \
    "local kpage = bulk_argv('HMGET', K2P, 6, 5 + n)\n"                                            \
    "for i = 1, n do\n"                                                                            \
    "  local o = owner[i]\n"                                                                       \
    "  if o then if is_res(o) then reserved[ps[i]] = o else held[ps[i]] = true end end\n"          \
    "  if kpage[i] then haskey[ARGV[5 + i]] = true end\n"                                          \
    "end\n"                                                                                        \
    "if nrel > 0 then\n"                                                                           \
    "  local ro = bulk_argv('HMGET', P2K, r0 + 1, r0 + nrel)\n"                                    \
    "  for i = 1, nrel do\n"                                                                       \
    "    local o = ro[i]\n"                                                                        \
    "    if o then if is_res(o) then reserved[rel[i]] = o else held[rel[i]] = true end end\n"      \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "local freeop = {} -- page -> its new free-set score, or false: taken out\n"                   \
    "local unres, untext, dec = {}, {}, {} -- pages no longer RESERVED, their text; per "          \
    "reservation\n"                                                                                \
    "local function unreserve(p, pt)\n"                                                            \
    "  local r = reserved[p]\n"                                                                    \
    "  reserved[p] = nil; unres[#unres + 1] = p; untext[p] = pt; dec[r] = (dec[r] or 0) + 1\n"     \
    "end\n"                                                                                        \
    "local hp, hk, lru, hx, evs, evp, evt = {}, {}, {}, {}, {}, {}, {}\n"                          \
    "local function to_free(p)\n"                                                                  \
    "  if touched(p) then st.fseq = st.fseq + 1; freeop[p] = st.fseq end\n"                        \
    "end\n"                                                                                        \
    "for i = 1, n do\n"                                                                            \
    "  local p, key = ps[i], ARGV[5 + i]\n"                                                        \
    "  if not held[p] then\n"                                                                      \
    "    local pt = ARGV[k0 + i]\n"                                                                \
    "    if reserved[p] then unreserve(p, pt)\n"                                                   \
    "    elseif touched(p) then freeop[p] = false end\n"                                           \
    "    -- the key's first confirmed page wins\n"                                                 \
    "    if haskey[key] then to_free(p) else\n"                                                    \
    "      held[p] = true; haskey[key] = true\n"                                                   \
    "      local h = #hp\n"                                                                        \
    "      hp[h + 1] = pt; hp[h + 2] = key; hk[h + 1] = key; hk[h + 2] = pt\n"                     \
    "      hx_fields(key, hx, pt); evs[#evs + 1] = key\n"                                          \
    "      if xp then evp[#evs] = ARGV[xp + i] end\n"                                              \
    "      if xt then evt[#evs] = ARGV[xt + i] end\n"                                              \
    "      st.clock = st.clock + 1; lru[h + 1] = I(st.clock); lru[h + 2] = pt\n"                   \
    "      if p >= st.top then st.top = p + 1 end\n"                                               \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "local rh = 0\n"                                                                               \
    "for i = 1, nrel do\n"                                                                         \
    "  local p = rel[i]\n"                                                                         \
    "  if reserved[p] then unreserve(p, ARGV[r0 + i]); to_free(p)\n"                               \
    "  elseif held[p] then rh = rh + 1 end\n"                                                      \
    "end\n"                                                                                        \
    "-- a page no longer RESERVED leaves P2K unless it is now HELD (its HSET below),\n"            \
    "-- and its reservation once none of its pages is RESERVED\n"                                  \
    "local pd = {}\n"                                                                              \
    "for j = 1, #unres do\n"                                                                       \
    "  local p = unres[j]\n"                                                                       \
    "  if not held[p] then pd[#pd + 1] = untext[p] end\n"                                          \
    "end\n"                                                                                        \
    "bulk('HDEL', P2K, pd)\n"                                                                      \
    "for r, k in pairs(dec) do\n"                                                                  \
    "  local b = string.sub(r, 2)\n"                                                               \
    "  if call('HINCRBY', RB, '#' .. b, -k) <= 0 then call('ZREM', RES, b); call('HDEL', RB, b, "  \
    "'#' .. b) end\n"                                                                              \
    "end\n"                                                                                        \
    "st.nres = st.nres - #unres\n"                                                                 \
    "local frem, fadd = {}, {}\n"                                                                  \
    "for p, s in pairs(freeop) do\n"                                                               \
    "  if s then fadd[#fadd + 1] = I(s); fadd[#fadd + 1] = I(p) else frem[#frem + 1] = I(p) end\n" \
    "end\n"                                                                                        \
    "bulk('ZREM', FREE, frem); bulk('ZADD', FREE, fadd)\n"                                         \
    "-- a page that was not HELD has no read grace (unholding drops it)\n"                         \
    "bulk('HSET', P2K, hp); bulk('HSET', K2P, hk); bulk('ZADD', LRU, lru); bulk('HSET', HX, hx)\n" \
    "-- the parents and tokens of the keys stored, aligned with them\n"                            \
    "local extra\n"                                                                                \
    "if xp or xt then\n"                                                                           \
    "  extra = {}\n"                                                                               \
    "  if xp then extra[1] = 'p'; extra[2] = evp; extra[3] = '\\0' end\n"                          \
    "  if xt then extra[#extra + 1] = 't'; extra[#extra + 1] = evt; extra[#extra + 1] = '' end\n"  \
    "end\n"                                                                                        \
    "ev_put('s', evs, extra)\n"                                                                    \
    "-- LIN keeps the parent and tokens of each key stored with some: its tokens\n"                \
    "-- as the request has them (their count, then they; a count 0 when none),\n"                  \
    "-- then its parent; a key stored without them has no entry\n"                                 \
    "if not extra then unlin(evs) else\n"                                                          \
    "  local lin, nolin = {}, {}\n"                                                                \
    "  for j = 1, #evs do\n"                                                                       \
    "    local par, tok = evp[j] or '', evt[j] or ''\n"                                            \
    "    if #par > 0 or #tok > 4 then\n"                                                           \
    "      lin[#lin + 1] = evs[j]; lin[#lin + 1] = (#tok > 4 and tok or '\\0\\0\\0\\0') .. par\n"  \
    "    else nolin[#nolin + 1] = evs[j] end\n"                                                    \
    "  end\n"                                                                                      \
    "  bulk('HSET', LIN, lin); unlin(nolin)\n"                                                     \
    "end\n"                                                                                        \
    "st.release_held = st.release_held + rh\n"                                                     \
    "store()\n"                                                                                    \
    "return {0}\n"

/* ARGV: keys. {0, held...} / {ST_NOT_INIT}. Read only. */
#define KVP_LUA_EXISTS                                                                             \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE "if call('EXISTS', M) == 0 then return {1} end\n"    \
    "local v, r = bulk_argv('HMGET', K2P, 1), {0}\n"                                               \
    "for i = 1, #ARGV do r[i + 1] = v[i] and 1 or 0 end\n"                                         \
    "return r\n"

/* ARGV: grace_ms, complete_only, a string of '0'/'1' per key (held on every
 * other rank), keys. {0, pages...} / {ST_NOT_INIT}. */
#define KVP_LUA_LOOKUP                                                                             \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local grace, complete, others = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3]\n"                 \
    "local n = #ARGV - 3\n"                                                                        \
    "local now = now_ms()\n"                                                                       \
    "local v = bulk_argv('HMGET', K2P, 4)\n"                                                       \
    "local r = {0}\n"                                                                              \
    "local hits, misses, lru, gset, gdel = 0, 0, {}, {}, {}\n"                                     \
    "local gend = I(now + grace)\n"                                                                \
    "for i = n, 1, -1 do\n"                                                                        \
    "  local p = v[i]\n"                                                                           \
    "  if p and complete and byte(others, i) ~= 49 then p = nil end\n"                             \
    "  if not p then r[i + 1] = -1; misses = misses + 1 else\n"                                    \
    "    r[i + 1] = tonumber(p); hits = hits + 1\n"                                                \
    "    st.clock = st.clock + 1; lru[#lru + 1] = I(st.clock); lru[#lru + 1] = p\n"                \
    "    if grace > 0 then gset[#gset + 1] = p; gset[#gset + 1] = gend\n"                          \
    "    else gdel[#gdel + 1] = p end\n"                                                           \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "bulk('ZADD', LRU, lru); bulk('HSET', GRACE, gset); ungrace(gdel)\n"                           \
    "st.hits = st.hits + hits; st.misses = st.misses + misses\n"                                   \
    "store()\n"                                                                                    \
    "return r\n"

/* ARGV: keys. {0} / {ST_NOT_INIT}. */
#define KVP_LUA_DELETE                                                                             \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local v = bulk_argv('HMGET', K2P, 1)\n"                                                       \
    "local gone, dp, dk, fadd = {}, {}, {}, {}\n"                                                  \
    "for i = 1, #ARGV do\n"                                                                        \
    "  local key, p = ARGV[i], v[i]\n"                                                             \
    "  if p and not gone[key] then\n"                                                              \
    "    gone[key] = true; dp[#dp + 1] = p; dk[#dk + 1] = key\n"                                   \
    "    if touched(tonumber(p)) then st.fseq = st.fseq + 1; fadd[#fadd + 1] = I(st.fseq); "       \
    "fadd[#fadd + 1] = p end\n"                                                                    \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "bulk('HDEL', P2K, dp); bulk('HDEL', K2P, dk); bulk('ZREM', LRU, dp); ungrace(dp)\n"           \
    "unindex(dk, dp); unlin(dk)\n"                                                                 \
    "bulk('ZADD', FREE, fadd)\n"                                                                   \
    "ev_put('r', dk)\n"                                                                            \
    "store()\n"                                                                                    \
    "return {0}\n"

/* ARGV: '1' to drop the rank (kvp_meta_drop: every key of the rank goes; its
 * stream of changes expires in DROP_EV_MS, time for the readers to read the
 * removals), else nothing. {0} / {ST_NOT_INIT}. */
#define KVP_LUA_CLEAR                                                                              \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "local drop = ARGV[1] == '1'\n"                      \
    "if not load() and not drop then return {1} end\n"                                             \
    "ev_put('r', call('HKEYS', K2P))\n"                                                            \
    "if drop then\n"                                                                               \
    "  call('DEL', M, FREE, RES, LRU, GRACE, K2P, P2K, RB, PIN, PINC, HX, LIN)\n"                  \
    "  call('PEXPIRE', EV, '600000')\n"                                                            \
    "  return {0}\n"                                                                               \
    "end\n"                                                                                        \
    "clear_pages(); store()\n"                                                                     \
    "return {0}\n"

/* {0, num_pages, free, reserved, held, hits, misses, allocations, evictions,
 * expired, release_held} / {ST_NOT_INIT}; expired reservations first. */
#define KVP_LUA_STATS                                                                              \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "expire(now_ms()); store()\n"                                                                  \
    "local res, held = st.nres, call('HLEN', K2P)\n"                                               \
    "return {0, st.num_pages, st.num_pages - res - held, res, held, st.hits, st.misses,\n"         \
    "  st.allocations, st.evictions, st.expired, st.release_held}\n"

/* {0, num_pages} / {ST_NOT_INIT} / {ST_BROKEN, message}: the invariants. */
#define KVP_LUA_CHECK                                                                              \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                \
    "local np, hwm, top, ceil = st.num_pages, st.hwm, st.top, st.ceil\n"                           \
    "local function bad(msg) return {6, msg} end\n"                                                \
    "for i = 1, #F do if not st[F[i]] then return bad('rank field ' .. F[i] .. ' is missing') "    \
    "end end\n"                                                                                    \
    "if not np or np < 1 or np > 2147483647 then return bad('num_pages is out of range') end\n"    \
    "if not hwm or hwm < 0 or hwm > np then return bad('hwm ' .. tostring(hwm) ..\n"               \
    "  ' is outside [0, num_pages]') end\n"                                                        \
    "if not ceil or ceil < hwm or ceil > np then return bad('ceil ' .. tostring(ceil) ..\n"        \
    "  ' is outside [hwm, num_pages]') end\n"                                                      \
    "if not top or top < hwm or top > np then return bad('top ' .. tostring(top) .. ' is outside " \
    "[hwm, num_pages]') end\n"                                                                     \
    "local function inrange(p) return p and p >= 0 and p < np and p == math.floor(p) end\n"        \
    "local all = call('HGETALL', P2K)\n"                                                           \
    "local nheld, nres, below = 0, 0, 0\n"                                                         \
    "local rcount, rpages, rof = {}, {}, {} -- per reservation its RESERVED pages; each page's\n"  \
    "for i = 1, #all, 2 do\n"                                                                      \
    "  local ps, v = all[i], all[i + 1]\n"                                                         \
    "  local p = tonumber(ps)\n"                                                                   \
    "  if not inrange(p) then return bad('page ' .. ps .. ' out of range') end\n"                  \
    "  if p >= top then return bad('page ' .. ps .. ' is not FREE but at or above top ' .. "       \
    "I(top)) end\n"                                                                                \
    "  if is_res(v) then\n"                                                                        \
    "    local b = string.sub(v, 2)\n"                                                             \
    "    if not tonumber(b) then return bad('RESERVED page ' .. ps .. ' has no reservation "       \
    "number') end\n"                                                                               \
    "    rcount[b] = (rcount[b] or 0) + 1; rpages[#rpages + 1] = ps; rof[#rof + 1] = b\n"          \
    "    nres = nres + 1\n"                                                                        \
    "  else\n"                                                                                     \
    "    if call('HGET', K2P, v) ~= ps then\n"                                                     \
    "      return bad('page ' .. ps .. ' is HELD by key \\'' .. string.sub(v, 1, 64) ..\n"         \
    "        '\\' which does not point at it') end\n"                                              \
    "    if not call('ZSCORE', LRU, ps) then return bad('HELD page ' .. ps ..\n"                   \
    "      ' is not on the LRU') end\n"                                                            \
    "    nheld = nheld + 1\n"                                                                      \
    "  end\n"                                                                                      \
    "  if touched(p) then below = below + 1 end\n"                                                 \
    "end\n"                                                                                        \
    "if call('HLEN', K2P) ~= nheld then return bad(call('HLEN', K2P) ..\n"                         \
    "  ' keys but ' .. nheld .. ' held pages') end\n"                                              \
    "if call('ZCARD', LRU) ~= nheld then return bad('LRU has ' ..\n"                               \
    "  call('ZCARD', LRU) .. ' pages, ' .. nheld .. ' are HELD') end\n"                            \
    "if st.nres ~= nres then return bad('nres ' .. I(st.nres) .. ' but ' .. I(nres) ..\n"          \
    "  ' RESERVED pages') end\n"                                                                   \
    "local rl = call('ZRANGE', RES, 0, -1)\n"                                                      \
    "if call('HLEN', RB) ~= 2 * #rl then return bad('rb does not match the reservations') end\n"   \
    "local inlist, sum = {}, 0\n"                                                                  \
    "for _, b in ipairs(rl) do\n"                                                                  \
    "  local list, c = call('HGET', RB, b), tonumber(call('HGET', RB, '#' .. b))\n"                \
    "  if not list or not c then return bad('reservation ' .. b .. ' has no pages') end\n"         \
    "  if c ~= (rcount[b] or 0) or c < 1 then return bad('reservation ' .. b .. ' counts ' .. "    \
    "I(c) ..\n"                                                                                    \
    "    ' pages, ' .. I(rcount[b] or 0) .. ' are RESERVED by it') end\n"                          \
    "  for p in string.gmatch(list, '%S+') do inlist[b .. ' ' .. p] = true end\n"                  \
    "  sum = sum + c\n"                                                                            \
    "end\n"                                                                                        \
    "if sum ~= nres then return bad('a RESERVED page names a reservation that is gone') end\n"     \
    "for k = 1, #rpages do\n"                                                                      \
    "  if not inlist[rof[k] .. ' ' .. rpages[k]] then return bad('RESERVED page ' .. rpages[k] "   \
    "..\n"                                                                                         \
    "    ' is not in its reservation ' .. rof[k]) end\n"                                           \
    "end\n"                                                                                        \
    "local fr = call('ZRANGE', FREE, 0, -1)\n"                                                     \
    "for _, ps in ipairs(fr) do\n"                                                                 \
    "  local p = tonumber(ps)\n"                                                                   \
    "  if not inrange(p) or not touched(p) then return bad('free set has page ' .. ps ..\n"        \
    "    ' in the untouched range [' .. I(hwm) .. ', ' .. I(ceil) .. ')') end\n"                   \
    "  if call('HEXISTS', P2K, ps) == 1 then return bad('page ' .. ps ..\n"                        \
    "    ' on the free set is not FREE') end\n"                                                    \
    "end\n"                                                                                        \
    "if #fr ~= hwm + np - ceil - below then return bad(I(hwm + np - ceil - below) ..\n"            \
    "  ' FREE pages outside [hwm, ceil), free set ' ..\n"                                          \
    "  'has ' .. #fr) end\n"                                                                       \
    "local lk = call('HGETALL', LIN)\n"                                                            \
    "for i = 1, #lk, 2 do\n"                                                                       \
    "  local k, v = lk[i], lk[i + 1]\n"                                                            \
    "  if not call('HGET', K2P, k) then return bad('key \\'' .. string.sub(k, 1, 64) ..\n"         \
    "    '\\' has a parent or tokens kept but holds no page') end\n"                               \
    "  local b1, b2, b3, b4 = byte(v, 1, 4)\n"                                                     \
    "  local nt = #v >= 4 and b1 + 256 * (b2 + 256 * (b3 + 256 * b4)) or -1\n"                     \
    "  if nt < 0 or 4 + 4 * nt > #v or (nt == 0 and #v == 4) then return bad('key \\'' ..\n"       \
    "    string.sub(k, 1, 64) .. '\\' has a malformed parent and tokens entry') end\n"             \
    "end\n"                                                                                        \
    "local g = call('HKEYS', GRACE)\n"                                                             \
    "for _, ps in ipairs(g) do if not is_held(call('HGET', P2K, ps)) then return bad('page ' .. "  \
    "ps ..\n"                                                                                      \
    "  ' has a read grace but is not HELD') end end\n"                                             \
    "return {0, np}\n"

/* ARGV: ttl_ms, max_ratio, keys. {0, pinned keys, limit, num_pages} /
 * {ST_NOT_INIT} / {ST_PIN_LIMIT, pinned keys after, limit, num_pages, new
 * keys}: the limit is checked here, atomically, and a refused pin changes
 * nothing. Each key's count grows by one, its deadline to the later. */
#define KVP_LUA_PIN                                                                                \
    "#!lua\n" KVP_LUA_PRELUDE "if not load() then return {1} end\n"                                \
    "local ttl, ratio = tonumber(ARGV[1]), tonumber(ARGV[2])\n"                                    \
    "local now = now_ms()\n"                                                                       \
    "pin_prune(now)\n"                                                                             \
    "local have, lim = call('ZCARD', PIN), math.floor(ratio * st.num_pages)\n"                     \
    "local sc, seen, new = bulk_argv('ZMSCORE', PIN, 3), {}, 0\n"                                  \
    "for i = 3, #ARGV do\n"                                                                        \
    "  local k = ARGV[i]\n"                                                                        \
    "  if not sc[i - 2] and not seen[k] then seen[k] = true; new = new + 1 end\n"                  \
    "end\n"                                                                                        \
    "if have + new > lim then return {7, have + new, lim, st.num_pages, new} end\n"                \
    "local till = I(now + ttl)\n"                                                                  \
    "for i = 3, #ARGV do\n"                                                                        \
    "  call('ZADD', PIN, 'GT', till, ARGV[i]); call('HINCRBY', PINC, ARGV[i], 1)\n"                \
    "end\n"                                                                                        \
    "return {0, have + new, lim, st.num_pages}\n"

/* ARGV: keys. {0, references released, pinned keys} / {ST_NOT_INIT}. */
#define KVP_LUA_UNPIN                                                                              \
    "#!lua flags=allow-oom\n" KVP_LUA_PRELUDE "if call('EXISTS', M) == 0 then return {1} end\n"    \
    "pin_prune(now_ms())\n"                                                                        \
    "local done = 0\n"                                                                             \
    "for i = 1, #ARGV do\n"                                                                        \
    "  local c = tonumber(call('HGET', PINC, ARGV[i]))\n"                                          \
    "  if c then\n"                                                                                \
    "    done = done + 1\n"                                                                        \
    "    if c <= 1 then call('HDEL', PINC, ARGV[i]); call('ZREM', PIN, ARGV[i])\n"                 \
    "    else call('HINCRBY', PINC, ARGV[i], -1) end\n"                                            \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "return {0, done, call('ZCARD', PIN)}\n"

/* ARGV: '1' to count only the keys this rank holds. {0, keys, references}
 * / {ST_NOT_INIT}. Read only: pins that ended are skipped, not removed. */
#define KVP_LUA_PINNED                                                                             \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE "if call('EXISTS', M) == 0 then return {1} end\n"    \
    "local ks = call('ZRANGEBYSCORE', PIN, '(' .. I(now_ms()), '+inf')\n"                          \
    "local nk, nr = 0, 0\n"                                                                        \
    "if #ks > 0 then\n"                                                                            \
    "  local c = bulk('HMGET', PINC, ks)\n"                                                        \
    "  local h = ARGV[1] == '1' and bulk('HMGET', K2P, ks) or nil\n"                               \
    "  for i = 1, #ks do\n"                                                                        \
    "    if not h or h[i] then nk = nk + 1; nr = nr + (tonumber(c[i]) or 0) end\n"                 \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "return {0, nk, nr}\n"

/* ARGV: HX fields ('s' or 'v' and 16 lower-case hex digits). {0, a '0' or
 * '1' per field} / {ST_NOT_INIT}. Read only. */
#define KVP_LUA_HASHES                                                                             \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE "if call('EXISTS', M) == 0 then return {1} end\n"    \
    "local v, r = bulk_argv('HMGET', HX, 1), {}\n"                                                 \
    "for i = 1, #ARGV do r[i] = v[i] and '1' or '0' end\n"                                         \
    "return {0, table.concat(r)}\n"

/* {0, key, deadline, count, ...}: the pins that have not ended. Read only. */
#define KVP_LUA_PINS_READ                                                                          \
    "#!lua flags=no-writes\n" KVP_LUA_PRELUDE                                                      \
    "local ks = call('ZRANGEBYSCORE', PIN, '(' .. I(now_ms()), '+inf', 'WITHSCORES')\n"            \
    "local r = {0}\n"                                                                              \
    "if #ks == 0 then return r end\n"                                                              \
    "local names = {}\n"                                                                           \
    "for i = 1, #ks, 2 do names[#names + 1] = ks[i] end\n"                                         \
    "local c = bulk('HMGET', PINC, names)\n"                                                       \
    "for i = 1, #names do\n"                                                                       \
    "  r[#r + 1] = names[i]; r[#r + 1] = ks[2 * i]; r[#r + 1] = c[i] or '1'\n"                     \
    "end\n"                                                                                        \
    "return r\n"

/* ARGV: key, deadline, count, ... (PINS_READ's): merged into this rank's
 * pins (the later deadline, the larger count). {0}. */
#define KVP_LUA_PINS_MERGE                                                                         \
    "#!lua\n" KVP_LUA_PRELUDE "for i = 1, #ARGV - 2, 3 do\n"                                       \
    "  local k = ARGV[i]\n"                                                                        \
    "  call('ZADD', PIN, 'GT', ARGV[i + 1], k)\n"                                                  \
    "  if (tonumber(call('HGET', PINC, k)) or 0) < tonumber(ARGV[i + 2]) then\n"                   \
    "    call('HSET', PINC, k, ARGV[i + 2])\n"                                                     \
    "  end\n"                                                                                      \
    "end\n"                                                                                        \
    "return {0}\n"

/* KEYS: namespaces (ZSET name -> creation number), their counter, the store's format
 * and its identity (STRINGs, set by the first namespace). ARGV: name, format, a new
 * identity (kept only if the state has none). */
#define KVP_LUA_NS_CREATE                                                                          \
    "#!lua\n"                                                                                      \
    "redis.call('SET', KEYS[3], ARGV[2], 'NX')\n"                                                  \
    "redis.call('SET', KEYS[4], ARGV[3], 'NX')\n"                                                  \
    "if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end\n"                                \
    "redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[1])\n"                          \
    "return 1\n"

#endif

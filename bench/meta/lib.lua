-- Shared by the wrk scripts of bench/meta (loaded with dofile from $BENCH_DIR).
-- One RESULT line per run, parsed by run.sh.

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function load_keys(path)
  local keys = {}
  for line in io.lines(path) do
    if #line > 0 then keys[#keys + 1] = line end
  end
  assert(#keys > 0, "no keys in " .. path)
  return keys
end

-- extra: names of per-thread counters to sum and print (thread:get)
function report(summary, latency, extra)
  local s = summary.duration / 1e6
  local e = summary.errors
  local out = string.format(
    "RESULT requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d",
    summary.requests, s, summary.requests / s,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    e.connect, e.read, e.write, e.status, e.timeout)
  for _, name in ipairs(extra or {}) do
    local total = 0
    for _, t in ipairs(threads) do total = total + (t:get(name) or 0) end
    out = out .. string.format(" %s=%d", name, total)
  end
  io.write(out .. "\n")
end

-- The allocate + confirm scripts (allocconfirm.lua, pairs.lua).
--
-- A body template of batch fresh keys: the key j is prefix .. seq .. suffix[j],
-- with prefix 16 hex characters unique to this run and thread (so repeated runs
-- use fresh keys), seq 32 digits and suffix[j] 16. head opens the body up to
-- the first key; tpl[2 * j] is key j's sequence-number slot.
function alloc_template(head, batch)
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(8)
  f:close()
  local prefix = b:gsub(".", function(c) return string.format("%02x", c:byte()) end)
  local tpl, suffix = {head .. prefix}, {}
  for j = 1, batch do
    suffix[j] = string.format("%016d", j)
    tpl[2 * j] = ""
    tpl[2 * j + 1] = suffix[j] .. (j < batch and '",""],["' .. prefix or '",""]]}')
  end
  return tpl, prefix, suffix
end

-- Fills the template's slots with sequence number seq: the body and the 32 digits.
function alloc_body(tpl, batch, seq)
  local s = string.format("%032d", seq)
  for j = 1, batch do tpl[2 * j] = s end
  return table.concat(tpl), s
end

-- A FIFO queue: push(q, v), pop(q) (nil when empty).
function fifo() return {h = 1, t = 0} end
function push(q, v) q.t = q.t + 1; q[q.t] = v end
function pop(q)
  if q.h > q.t then return nil end
  local v = q[q.h]
  q[q.h] = nil
  q.h = q.h + 1
  return v
end

-- init() and request() of the pair scripts: a queued confirm (on q) first,
-- else an allocate of batch fresh keys to path, its body opening with head;
-- with sent, each allocate's 32 sequence digits are pushed on it. Returns the
-- keys' parts as init() sets them: k.prefix, k.suffix.
function pair_requests(q, path, head, batch, sent)
  local k = {}
  function init(args)
    k.tpl, k.prefix, k.suffix = alloc_template(head, batch)
  end

  local seq = 0
  function request()
    local r = pop(q)
    if r then return r end
    seq = seq + 1
    local body, s = alloc_body(k.tpl, batch, seq)
    if sent then push(sent, s) end
    return wrk.format("POST", path, nil, body)
  end
  return k
end

-- response() and done() of the pair scripts (their globals allocs, pairs_ok,
-- neg_pages, non_ok): a 200 answers an allocate, and confirm_of(body) gives
-- its confirm request, queued on q; a 204 answers a confirm: one pair;
-- anything else is non_ok.
function pair_callbacks(q, confirm_of)
  function response(status, headers, body)
    if status == 200 then
      allocs = allocs + 1
      push(q, confirm_of(body))
    elseif status == 204 then
      pairs_ok = pairs_ok + 1
    else
      non_ok = non_ok + 1
    end
  end

  function done(summary, latency, requests)
    report(summary, latency, {"allocs", "pairs_ok", "neg_pages", "non_ok"})
  end
end

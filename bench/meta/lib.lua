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

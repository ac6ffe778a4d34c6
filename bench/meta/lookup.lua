-- Lookups of prepared keys: vLLM batch_exists or get_locations (rank 0), or
-- their SGLang counterparts /0/exists and /0/get_page_indices (issue 11).
-- Env: BENCH_DIR (this directory), BENCH_KEYS (key file, one per line),
--      BENCH_OP = exists | locations | sgl_exists | sgl_get,
--      BENCH_BATCH (keys per request),
--      BENCH_POOL = a "namespace" field for the SGLang bodies (default none),
--      BENCH_CHECK = 1 to count every response that is not 200 (slower client).
-- Every request asks for a window of BENCH_BATCH consecutive prepared keys;
-- 64 different windows are cycled, so all keys hit and the body size is fixed.
-- The same script drives limit_probe, so both servers get the same bytes.
dofile(os.getenv("BENCH_DIR") .. "/lib.lua")

local op = os.getenv("BENCH_OP") or "exists"
local batch = tonumber(os.getenv("BENCH_BATCH") or "64")
local paths = {exists = "/keys/batch_exists", locations = "/keys/get_locations",
               sgl_exists = "/0/exists", sgl_get = "/0/get_page_indices"}
local path = assert(paths[op], "BENCH_OP: exists, locations, sgl_exists or sgl_get")
local pool = os.getenv("BENCH_POOL") or ""
local reqs, nreq, i = {}, 0, 0
checked, non200 = 0, 0

function init(args)
  local keys = load_keys(os.getenv("BENCH_KEYS"))
  assert(#keys >= batch, "need at least " .. batch .. " keys")
  local span = #keys - batch
  for w = 0, 63 do
    local start = (w * 257 * batch) % (span + 1)
    local parts = {}
    for j = 1, batch do parts[j] = '"' .. keys[start + j] .. '"' end
    local body
    if op == "locations" then
      body = '{"rank":0,"keys":[' .. table.concat(parts, ",") .. ']}'
    elseif op:sub(1, 4) == "sgl_" and pool ~= "" then
      body = '{"keys":[' .. table.concat(parts, ",") .. '],"namespace":"' .. pool .. '"}'
    else
      body = '{"keys":[' .. table.concat(parts, ",") .. ']}'
    end
    nreq = nreq + 1
    reqs[nreq] = wrk.format("POST", path, nil, body)
  end
end

function request()
  i = i % nreq + 1
  return reqs[i]
end

if os.getenv("BENCH_CHECK") == "1" then
  function response(status, headers, body)
    checked = checked + 1
    if status ~= 200 then non200 = non200 + 1 end
  end
end

function done(summary, latency, requests)
  report(summary, latency, {"checked", "non200"})
end

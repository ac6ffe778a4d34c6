-- Allocate + confirm pairs of fresh keys on rank 0, in either dialect, built
-- the same way for both (issue 11: SGLang beside vLLM in the same run):
--   vllm:   /keys/batch_allocate {"rank":0,"keys":[[K,""],...]}, then
--           /keys/confirm_write {"rank":0,"confirmations":[[K,page],...],"pages_to_release":[]}
--   sglang: /0/reserve_and_allocate_page_indices {"keys":[[K,""],...]}, then
--           /0/confirm_write {"written_keys_to_confirm":[[K,page],...],"pages_to_release":[]}
-- Env: BENCH_DIR, BENCH_DIALECT = vllm | sglang, BENCH_BATCH (keys per request, 64).
--
-- SGLang's reserve reply holds only [existed, page] pairs, not the keys, so
-- the confirm must be built from the keys this client sent. wrk calls
-- response() and request() per thread, not per connection, so a reply can
-- only be matched with its request when each wrk thread has one connection:
-- run with -tN -cN. The thread's FIFO of sent allocates then holds at most
-- one entry, and the confirm goes on the connection that allocated.
-- Both dialects' confirms are built by the same code from the keys sent and
-- the pages read from the reply, so the client does the same work for each
-- (allocconfirm.lua's vLLM confirm moves the reply's results array instead).
-- A pair is counted when its confirm is answered 204.
dofile(os.getenv("BENCH_DIR") .. "/lib.lua")

local batch = tonumber(os.getenv("BENCH_BATCH") or "64")
local dialect = os.getenv("BENCH_DIALECT") or "vllm"
local alloc_path, alloc_head, confirm_path, confirm_head
if dialect == "sglang" then
  alloc_path, alloc_head = "/0/reserve_and_allocate_page_indices", '{"keys":[["'
  confirm_path, confirm_head = "/0/confirm_write", '{"written_keys_to_confirm":['
else
  assert(dialect == "vllm", "BENCH_DIALECT: vllm or sglang")
  alloc_path, alloc_head = "/keys/batch_allocate", '{"rank":0,"keys":[["'
  confirm_path, confirm_head = "/keys/confirm_write", '{"rank":0,"confirmations":['
end
local tpl = {}      -- the allocate body, the request's sequence number at every even index
local suffix = {}   -- the keys' last 16 characters
local prefix
local sent, sh, st = {}, 1, 0 -- FIFO of the sequence numbers of allocates awaiting a reply
local q, qh, qt = {}, 1, 0    -- FIFO of confirm requests to send
allocs, pairs_ok, neg_pages, non_ok = 0, 0, 0, 0

function init(args)
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(8)
  f:close()
  prefix = b:gsub(".", function(c) return string.format("%02x", c:byte()) end)
  tpl[1] = alloc_head .. prefix
  for j = 1, batch do
    suffix[j] = string.format("%016d", j)
    tpl[2 * j] = ""
    tpl[2 * j + 1] = suffix[j] .. (j < batch and '",""],["' .. prefix or '",""]]}')
  end
end

local seq = 0
function request()
  if qh <= qt then
    local r = q[qh]
    q[qh] = nil
    qh = qh + 1
    return r
  end
  seq = seq + 1
  local s = string.format("%032d", seq)
  for j = 1, batch do tpl[2 * j] = s end
  st = st + 1
  sent[st] = s
  return wrk.format("POST", alloc_path, nil, table.concat(tpl))
end

function response(status, headers, body)
  if status == 200 then
    allocs = allocs + 1
    local s = sent[sh]
    sent[sh] = nil
    sh = sh + 1
    -- each element's page follows ", " and ends it: [K, page] or [existed, page]
    -- (anchored on the comma: "(%-?%d+)%]" alone backtracks through every
    -- digit run of the keys in the vLLM reply, quadratic in their length)
    local parts, j = {}, 0
    for p in body:gmatch(", (%-?%d+)%]") do
      j = j + 1
      if p == "-1" then
        neg_pages = neg_pages + 1
      else
        parts[#parts + 1] = '["' .. prefix .. s .. suffix[j] .. '",' .. p .. ']'
      end
    end
    if j ~= batch then non_ok = non_ok + 1 end
    qt = qt + 1
    q[qt] = wrk.format("POST", confirm_path, nil,
                       confirm_head .. table.concat(parts, ",") .. '],"pages_to_release":[]}')
  elseif status == 204 then
    pairs_ok = pairs_ok + 1
  else
    non_ok = non_ok + 1
  end
end

function done(summary, latency, requests)
  report(summary, latency, {"allocs", "pairs_ok", "neg_pages", "non_ok"})
end

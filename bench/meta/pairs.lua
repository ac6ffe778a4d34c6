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
local sent = fifo() -- the sequence numbers of allocates awaiting a reply
local q = fifo()    -- confirm requests to send
allocs, pairs_ok, neg_pages, non_ok = 0, 0, 0, 0
local k = pair_requests(q, alloc_path, alloc_head, batch, sent)

-- The confirm of an allocate's reply: the keys of the oldest allocate awaiting
-- its reply, with the reply's pages.
local function confirm_of(body)
  local s = pop(sent)
  -- each element's page follows ", " and ends it: [K, page] or [existed, page]
  -- (anchored on the comma: "(%-?%d+)%]" alone backtracks through every
  -- digit run of the keys in the vLLM reply, quadratic in their length)
  local parts, j = {}, 0
  for p in body:gmatch(", (%-?%d+)%]") do
    j = j + 1
    if p == "-1" then
      neg_pages = neg_pages + 1
    else
      parts[#parts + 1] = '["' .. k.prefix .. s .. k.suffix[j] .. '",' .. p .. ']'
    end
  end
  if j ~= batch then non_ok = non_ok + 1 end
  return wrk.format("POST", confirm_path, nil,
                    confirm_head .. table.concat(parts, ",") .. '],"pages_to_release":[]}')
end

pair_callbacks(q, confirm_of)

-- vLLM batch_allocate + confirm_write pairs of fresh keys on rank 0.
-- Env: BENCH_DIR, BENCH_BATCH (keys per request, default 64).
--
-- wrk calls response() and request() per thread, not per connection, and the
-- next request() of a connection is not guaranteed to follow its own
-- response() directly. So a confirm is not tied to the connection that
-- allocated: each allocate response is parsed here and its confirm_write
-- request (with exactly the pages the server returned) goes into a FIFO;
-- request() sends a queued confirm when there is one, else a new allocate of
-- BENCH_BATCH fresh keys. Every allocate gets exactly one confirm, the queue
-- never holds more than one entry per connection, and on each connection the
-- requests end up alternating allocate/confirm in steady state.
-- A pair is counted when its confirm is answered 204.
dofile(os.getenv("BENCH_DIR") .. "/lib.lua")

local batch = tonumber(os.getenv("BENCH_BATCH") or "64")
local q = fifo() -- confirm requests to send
allocs, pairs_ok, neg_pages, non_ok = 0, 0, 0, 0

-- The load generator shares the 2 cores with the server, so it does as little
-- as it can per request: the allocate body is a template whose sequence-number
-- slots are filled in, and the confirm body is the allocate response's results
-- array, moved as it is (one element per key, in order, with its page).
pair_requests(q, "/keys/batch_allocate", '{"rank":0,"keys":[["', batch)

-- The slow path: pairs parsed one by one, keys without a page (-1) left out.
local function confirm_body_parsed(body)
  local parts, n = {}, 0
  for k, p in body:gmatch('%["(%x+)",%s*(%-?%d+)%]') do
    if p == "-1" then
      neg_pages = neg_pages + 1
    else
      n = n + 1
      parts[n] = '["' .. k .. '",' .. p .. ']'
    end
  end
  if n ~= batch then non_ok = non_ok + 1 end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function confirm_of(body)
  local a = body:find('"results": [', 1, true)
  local arr
  if a and not body:find(', -1]', a, true) and body:sub(-1) == "}" then
    arr = body:sub(a + 11, -2)
  else
    arr = confirm_body_parsed(body)
  end
  return wrk.format("POST", "/keys/confirm_write", nil,
                    '{"rank":0,"confirmations":' .. arr .. ',"pages_to_release":[]}')
end

pair_callbacks(q, confirm_of)

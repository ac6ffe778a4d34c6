-- bench/meta/xadd_cost.lua: what the KV events' stream costs Redis per
-- script call (issue 38, events over Redis): ARGV[1] times, 64 keys of 32
-- hex digits joined with NUL bytes as the rank scripts do, appended (ARGV[2]
-- = '1') or not ('0') with the rank scripts' XADD; returns the microseconds
-- the loop took inside Redis. The difference of the two, divided by the
-- count, is one entry's cost:
--   for m in 0 1 0 1; do redis-cli -p PORT --eval bench/meta/xadd_cost.lua s , 5000 $m; done
local t0 = redis.call('TIME')
for j = 1, tonumber(ARGV[1]) do
  local keys = {}
  for i = 1, 64 do keys[#keys + 1] = string.format('%032x', j * 64 + i) end
  if ARGV[2] == '1' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', '10000', '1-*', 's', table.concat(keys, '\0'))
  end
end
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])

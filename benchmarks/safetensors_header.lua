-- benchmarks/safetensors_header.lua: how long a safetensors file of many
-- entries takes to open (header parsed and validated, names indexed) and
-- to look every name up, for growing entry counts. Prints numbers;
-- asserts nothing (tests/lua/safetensors_limits_spec.lua checks that the
-- time grows linearly).
--
--   fsdp-lua benchmarks/safetensors_header.lua [--entries=200000] [--metadata]
--
-- The file holds one-element F32 tensors named layers.N.weight (and, with
-- --metadata, as many __metadata__ keys). Seconds are wall time, best of 3.
local st = require 'fsdp.io.safetensors'
local clock = require 'fsdp.clock'

local opts = { entries = 200000, metadata = false }
for _, a in ipairs(arg or {}) do
  local k, v = a:match('^%-%-([%w_]+)=?(.*)$')
  if k == 'entries' then opts.entries = assert(tonumber(v), '--entries needs a number')
  elseif k == 'metadata' then opts.metadata = true
  else error('unknown argument ' .. a) end
end

local function write(path, n, meta)
  local parts = {}
  if meta then
    local m = {}
    for i = 1, n do m[i] = ('"key%d":"value %d"'):format(i, i) end
    parts[1] = '"__metadata__":{' .. table.concat(m, ',') .. '}'
  end
  for i = 1, n do
    parts[#parts + 1] = ('"layers.%d.weight":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'):format(i, 4 * (i - 1), 4 * i)
  end
  local header = '{' .. table.concat(parts, ',') .. '}'
  local len, h = '', #header
  for _ = 1, 8 do
    len = len .. string.char(h % 256)
    h = math.floor(h / 256)
  end
  local f = assert(io.open(path, 'wb'))
  f:write(len, header, string.rep('\0', 4 * n))
  f:close()
end

local path = os.tmpname()
print(('%10s %12s %12s %14s'):format('entries', 'header MB', 'open s', 'open+find s'))
local n = 25000
while true do
  n = math.min(n, opts.entries)
  write(path, n, opts.metadata)
  local best_open, best_all = math.huge, math.huge
  for _ = 1, 3 do
    local t0 = clock.now()
    local f = st.open(path)
    local t1 = clock.now()
    for _, name in ipairs(f:names()) do assert(f:has(name)) end
    local t2 = clock.now()
    f:close()
    best_open, best_all = math.min(best_open, t1 - t0), math.min(best_all, t2 - t0)
  end
  local size = 0
  local fh = io.open(path, 'rb')
  size = fh:seek('end')
  fh:close()
  print(('%10d %12.1f %12.3f %14.3f'):format(n, size / 1e6, best_open, best_all))
  if n >= opts.entries then break end
  n = n * 2
end
os.remove(path)

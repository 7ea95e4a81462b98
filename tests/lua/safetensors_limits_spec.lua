-- safetensors_limits_spec.lua: the safetensors reader at its limits:
-- headers of many entries open in time linear in their size (names and
-- metadata keys are hashed), shapes whose strides would overflow are
-- refused, and a mapped file that another process truncates gives an
-- error naming it instead of SIGBUS (core/base/fault.c), through the
-- tensor API and the token-shard reader.
local fsdp = require 'fsdp'
local st = require 'fsdp.io.safetensors'
local T = require 'fsdp.testing'

local dir = T.tmpdir()

local function assemble(header, data)
  local n, len = #header, ''
  for _ = 1, 8 do
    len = len .. string.char(n % 256)
    n = math.floor(n / 256)
  end
  return len .. header .. (data or '')
end

local function write_file(path, bytes)
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
end

-- A file of n one-element tensors and n metadata keys.
local function many(path, n)
  local parts, meta = {}, {}
  for i = 1, n do meta[i] = ('"key%d":"value %d"'):format(i, i) end
  parts[1] = '"__metadata__":{' .. table.concat(meta, ',') .. '}'
  for i = 1, n do
    parts[i + 1] = ('"layers.%d.weight":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'):format(i, 4 * (i - 1), 4 * i)
  end
  write_file(path, assemble('{' .. table.concat(parts, ',') .. '}', string.rep('\0', 4 * n)))
end

-- CPU seconds to open the file, look up every name and read the metadata
-- (the best of three: the machine may be busy).
local function open_time(path)
  local best = math.huge
  for _ = 1, 3 do
    local t0 = os.clock()
    local f = st.open(path)
    for _, name in ipairs(f:names()) do assert(f:has(name)) end
    local meta = f:metadata()
    assert(meta.key1 == 'value 1')
    f:close()
    best = math.min(best, os.clock() - t0)
  end
  return best
end

describe('headers of many entries', function()
  it('open in time linear in the entry count (8x the entries: well under 64x the time)', function()
    local small, big = dir .. '/small.safetensors', dir .. '/big.safetensors'
    many(small, 5000)
    many(big, 40000)
    local ts, tb = open_time(small), open_time(big)
    -- Linear is 8x; the quadratic lookups this replaced were 64x. Allow
    -- noise (allocator, caches) up to 24x.
    assert(tb < 24 * math.max(ts, 1e-3), ('5000 entries: %.3f s, 40000 entries: %.3f s'):format(ts, tb))
  end)

  it('declare names through a hash: a writer of many tensors refuses a duplicate', function()
    local ts = {}
    for i = 1, 3 do ts[#ts + 1] = { 'x' .. i, fsdp.zeros({ 1 }) } end
    ts[#ts + 1] = { 'x2', fsdp.zeros({ 1 }) }
    T.raises(function() st.save(dir .. '/dup.safetensors', ts) end, "tensor 'x2' declared twice")
  end)
end)

describe('shapes and offsets', function()
  local function refused(header, text)
    local path = dir .. '/bad.safetensors'
    write_file(path, assemble(header))
    T.raises(function() st.load(path) end, text)
    T.raises(function() st.load(path) end, 'bad.safetensors')
  end

  it('refuses shapes whose strides or byte size overflow, also with a zero-size dim', function()
    refused('{"x":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}}',
      'is too large')
    refused('{"x":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}', 'is too large')
    refused('{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,9223372036854775807]}}', 'run past the end')
    refused('{"x":{"dtype":"F32","shape":[3],"data_offsets":[9223372036854775806,9223372036854775807]}}',
      'run past the end')
  end)
end)

describe('a mapped file truncated by another process', function()
  it('gives an error naming the file when its tensors are read', function()
    local path = dir .. '/shrinks.safetensors'
    st.save(path, { w = fsdp.randn({ 512, 512 }, { seed = 1 }) })
    local f = st.open(path)
    local w = f:get('w')
    assert(os.execute('truncate -s 4096 ' .. T.quote(path)) == 0)
    T.raises(function() w:clone() end, path .. ': the file shrank while it was mapped')
    T.raises(function() fsdp.empty({ 512, 512 }):copy_(w) end, 'shrank')
    T.raises(function() w:to('bf16') end, 'shrank')
    -- ops reading the mapped tensor directly check the file first
    T.raises(function() w:sum() end, 'sum: ' .. path .. ': the file shrank while it was mapped')
    T.raises(function() require('fsdp.functional').linear(w, w) end, 'shrank')
    T.raises(function() w:narrow(0, 0, 1):clone() end, 'shrank')
    f:close()
  end)

  it('is refused by checksum verification naming the file (the hash runs on threads no guard covers)', function()
    local path = dir .. '/shrinks_verified.safetensors'
    st.save(path, { w = fsdp.randn({ 512, 512 }, { seed = 1 }) }, nil, { checksum = true })
    local f = st.open(path)
    assert(os.execute('truncate -s 4096 ' .. T.quote(path)) == 0)
    T.raises(function() f:verify() end, path .. ': the file shrank while it was mapped')
    f:close()
  end)

  it('gives an error naming the shard when a token dataset reads it', function()
    local tokens = require 'fsdp.data.tokens'
    local path = dir .. '/train-00000.safetensors'
    tokens.write_shard(path, fsdp.arange(0, 60000, { dtype = 'i64' }), { vocab_size = 65536, eos_id = 0 })
    local ds = tokens.open(path, { seq_len = 16, batch_size = 4, shuffle = false })
    ds:next()
    assert(os.execute('truncate -s 4096 ' .. T.quote(path)) == 0)
    local ok, err
    for _ = 1, 100 do -- batches past the first page
      ok, err = pcall(ds.next, ds)
      if not ok then break end
    end
    assert.is_false(ok)
    assert.matches(path .. ': the file shrank', tostring(err), 1, true)
  end)
end)

-- safetensors_spec.lua: reading and writing safetensors: round trips of
-- every dtype, a file assembled byte by byte (the format, independently of
-- our writer), atomic writes, and hostile files: every truncation of a
-- valid file, bad lengths, bad JSON, bad entries, and random corruption,
-- which must all give clean errors (the lua-asan suite checks no
-- out-of-bounds read happens on the way).
local fsdp = require 'fsdp'
local st = require 'fsdp.safetensors'

local dir = os.tmpname()
os.remove(dir)
os.execute('mkdir -p ' .. dir)

local function write_file(path, bytes)
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
end

local function read_file(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

-- A file from a header string and data bytes, as the format defines it.
local function assemble(header, data)
  local n = #header
  local len = ''
  for _ = 1, 8 do
    len = len .. string.char(n % 256)
    n = math.floor(n / 256)
  end
  return len .. header .. (data or '')
end

local function load_error(bytes)
  local path = dir .. '/bad.safetensors'
  write_file(path, bytes)
  local ok, err = pcall(st.load, path)
  assert.is_false(ok, 'a hostile file loaded')
  assert.matches('bad.safetensors', err, 1, true)
  return err
end

describe('safetensors', function()
  it('round-trips every dtype with metadata, in declared order', function()
    local path = dir .. '/all.safetensors'
    local list = {}
    for i, d in ipairs(fsdp.dtypes) do
      list[i] = { 'x.' .. d, fsdp.tensor({ { 0, 1, 2 }, { 3, 4, 5 } }, { dtype = d }) }
    end
    list[#list + 1] = { 'empty', fsdp.zeros(0, 3) }
    list[#list + 1] = { 'strided', fsdp.arange(6):view(2, 3):t() }
    st.save(path, list, { format = 'pt', step = 7 })
    local t, names, meta = st.load(path)
    assert.equals(#list, #names)
    for i, p in ipairs(list) do
      assert.equals(p[1], names[i])
      assert.same(p[2]:tolist(), t[p[1]]:tolist())
      assert.equals(p[2].dtype, t[p[1]].dtype)
    end
    assert.same({ format = 'pt', step = '7' }, meta)
    local f = st.open(path)
    assert.same({ dtype = 'bf16', shape = { 2, 3 } }, f:info('x.bf16'))
    f:close()
  end)

  it('reads a file assembled byte by byte, in its own data order', function()
    -- two f32 tensors listed out of data order, header unpadded (6 bytes
    -- of data misaligned: the reader copies instead of mapping)
    local header = '{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},'
      .. '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}'
    local one, two = '\0\0\128\63', '\0\0\0\64' -- 1.0f, 2.0f little-endian
    local path = dir .. '/hand.safetensors'
    write_file(path, assemble(header, one .. two))
    local t, names, meta = st.load(path)
    assert.same({ 'a', 'b' }, names)
    assert.equals(1, t.a:item())
    assert.equals(2, t.b:item())
    assert.equals('v', meta.k)
  end)

  it('keeps the mapping alive while tensors use it', function()
    local path = dir .. '/alive.safetensors'
    st.save(path, { w = fsdp.arange(1000) })
    local f = st.open(path)
    local w = f:get('w')
    f:close()
    collectgarbage()
    assert.equals(999, w:get(999))
  end)

  it('writes atomically: a failed or abandoned write leaves the old file', function()
    local path = dir .. '/atomic.safetensors'
    st.save(path, { w = fsdp.ones(4) })
    local before = read_file(path)
    assert.error_matches(function()
      st.save(path, { { 'a', fsdp.ones(4) }, { 'b', fsdp.zeros(2, { device = 'meta' }) } })
    end, 'meta device and has no values')
    assert.equals(before, read_file(path))
    local leftovers = io.popen('ls ' .. dir .. ' | grep -c tmp'):read('*a')
    assert.equals('0', leftovers:match('%d+'))
  end)

  it('rejects a tensor that does not match its declaration', function()
    local C = fsdp.C
    local ffi = require 'ffi'
    local w = ffi.gc(C.fl_safetensors_writer_new(dir .. '/decl.safetensors'), C.fl_safetensors_writer_free)
    local shape = ffi.new('int64_t[1]', 3)
    assert.equals(0, C.fl_safetensors_writer_declare(w, 'x', C.FL_F32, 1, shape))
    local t = fsdp.ones(4)
    assert.is_true(C.fl_safetensors_writer_write(w, fsdp.Tensor.cptr(t)) ~= 0)
    assert.matches("tensor 'x' was declared f32 %[3%], got f32 %[4%]", ffi.string(C.fl_last_error()))
  end)

  describe('hostile files give clean errors', function()
    local valid_path = dir .. '/valid.safetensors'
    st.save(valid_path, { a = fsdp.arange(10), b = fsdp.ones(3, 3, { dtype = 'bf16' }) })
    local valid = read_file(valid_path)

    it('at every truncation', function()
      for cut = 0, #valid - 1 do load_error(valid:sub(1, cut)) end
    end)

    it('with bad header lengths', function()
      assert.matches('does not fit the file', load_error(('\255'):rep(8) .. '{}'))
      assert.matches('does not fit the file', load_error(assemble('{}'):sub(1, 8) .. '{'))
      assert.matches('too short', load_error('\2\0\0'))
    end)

    local cases = {
      { '{"a":', 'not valid JSON' },
      { '[1, 2]', 'not a JSON object' },
      { '{"a": 5}', "tensor 'a': entry is not a JSON object" },
      { '{"a": {"dtype": "F32", "shape": [1]}}', 'data_offsets' },
      { '{"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}', 'F8_E4M3 is not supported' },
      { '{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', 'shape entry 0' },
      { '{"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}', 'shape entry 0' },
      { '{"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}}', 'too large' },
      { '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 400]}}', 'run past the end' },
      { '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', 'begin <= end' },
      { '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', '4 bytes of data for F32 of 8 bytes' },
      { '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
        .. '"b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}', 'overlap' },
      { '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
        .. '"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 'not valid JSON' },
      { '{"__metadata__": {"k": 1}}', 'value of \'k\' is not a string' },
      { '{"a": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}}', '9 dims' },
    }
    for _, case in ipairs(cases) do
      it('for ' .. case[2], function()
        local err = load_error(assemble(case[1], ('\0'):rep(8)))
        assert.matches(case[2], err, 1, true)
      end)
    end

    it('under random corruption of the header', function()
      -- deterministic pseudo-random byte flips; each file loads or fails cleanly
      local seed = 12345
      local function rnd(n)
        seed = (seed * 1103515245 + 12345) % 2147483648
        return seed % n
      end
      local n = valid:byte(1) + 256 * valid:byte(2)
      local path = dir .. '/fuzz.safetensors'
      for _ = 1, 300 do
        local bytes = { valid:byte(1, -1) }
        for _ = 1, 1 + rnd(3) do
          local pos = 9 + rnd(n)
          bytes[pos] = rnd(256)
        end
        write_file(path, string.char(unpack(bytes)))
        local ok, err = pcall(st.load, path)
        assert(ok or err:find('fuzz.safetensors', 1, true), err)
      end
    end)
  end)
end)

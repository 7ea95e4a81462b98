-- safetensors_spec.lua: reading and writing safetensors: round trips of
-- every dtype, a file assembled byte by byte (the format, independently of
-- our writer), atomic writes, and hostile files: every truncation of a
-- valid file, bad lengths, bad JSON, bad entries, and random corruption,
-- which must all give clean errors (the lua-asan suite checks no
-- out-of-bounds read happens on the way).
local fsdp = require 'fsdp'
local st = require 'fsdp.io.safetensors'

local dir = os.tmpname()
os.remove(dir)
os.execute('mkdir -p ' .. dir)

local function write_file(path, bytes)
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
end

local function read_file(path) return assert(require('fsdp.io.files').read(path)) end

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

describe('multi-file checkpoints', function()
  local T = require 'fsdp.testing'

  local function tmpdir()
    local d = os.tmpname()
    os.remove(d)
    return d
  end
  local files = require 'fsdp.io.files'
  local rm_rf, listing = files.remove_tree, files.list
  local function write(path, text)
    local f = assert(io.open(path, 'wb'))
    f:write(text)
    f:close()
  end
  -- Five f32 tensors of 400 bytes each, in name order a..e.
  local function tensors()
    local t = {}
    for i, name in ipairs({ 'a', 'b', 'c', 'd', 'e' }) do t[name] = fsdp.randn({ 10, 10 }, { seed = i }) end
    return t
  end

  it('save_sharded packs files up to max_shard_size and writes HF\'s index', function()
    local d = tmpdir()
    local files = fsdp.save_safetensors_sharded(d, tensors(), { max_shard_size = 1000 })
    assert.same({ 'model-00001-of-00003.safetensors', 'model-00002-of-00003.safetensors',
                  'model-00003-of-00003.safetensors' }, files)
    -- The directory is published whole: its manifest lists the files and
    -- the id they all carry (fsdp.io.publish).
    assert.same({ 'fsdp_export.json', 'model-00001-of-00003.safetensors', 'model-00002-of-00003.safetensors',
                  'model-00003-of-00003.safetensors', 'model.safetensors.index.json' }, listing(d))
    local index = require('cjson').decode(io.open(d .. '/model.safetensors.index.json'):read('*a'))
    assert.equals(2000, index.metadata.total_size)
    assert.equals('model-00001-of-00003.safetensors', index.weight_map.b)
    assert.equals('model-00002-of-00003.safetensors', index.weight_map.c)
    assert.equals('model-00003-of-00003.safetensors', index.weight_map.e)
    local id = require('cjson').decode(io.open(d .. '/fsdp_export.json'):read('*a')).id
    assert.same({ format = 'pt', fsdp_export_id = id }, select(3, fsdp.load_safetensors(d .. '/' .. files[1])))
    assert.equals(id, index.metadata.fsdp_export_id)
    local back, names = fsdp.load_safetensors_dir(d)
    assert.same({ 'a', 'b', 'c', 'd', 'e' }, names)
    for name, t in pairs(tensors()) do assert.equals(0, T.max_abs_diff(t, back[name])) end
    -- Saved again in one file: model.safetensors, and the old shards go.
    assert.same({ 'model.safetensors' }, fsdp.save_safetensors_sharded(d, tensors(), { max_shard_size = '1MB' }))
    assert.same({ 'fsdp_export.json', 'model.safetensors' }, listing(d))
    rm_rf(d)
  end)

  it('a tensor larger than max_shard_size gets a file of its own', function()
    local d = tmpdir()
    local files = fsdp.save_safetensors_sharded(d, { { 'small', fsdp.zeros({ 2 }) }, { 'big', fsdp.zeros({ 100 }) },
                                                     { 'tail', fsdp.zeros({ 2 }) } }, { max_shard_size = '100B' })
    assert.equals(3, #files)
    local ck = fsdp.safetensors.open_checkpoint(d)
    assert.equals(d .. '/model-00002-of-00003.safetensors', ck:file_of('big'))
    -- info and get open the file that holds the name
    assert.same({ dtype = 'f32', shape = { 100 } }, ck:info('big'))
    assert.same({ 0, 0 }, ck:get('tail'):tolist())
    assert.error_matches(function() ck:get('nope') end, 'no tensor named nope', nil, true)
    rm_rf(d)
  end)

  it('load_into streams one file at a time into the model', function()
    local nn = fsdp.nn
    local model = nn.Sequential(nn.Linear(10, 10, { bias = false }), nn.Linear(10, 10), nn.Linear(10, 10, { bias = false }))
    local src = {}
    for _, p in ipairs(model:named_parameters()) do src[p[1]] = fsdp.randn(p[2].shape, { seed = #p[1] }) end
    local d = tmpdir()
    fsdp.save_safetensors_sharded(d, src, { max_shard_size = 450 })
    local calls = {}
    local load = model.load_state_dict
    model.load_state_dict = function(self, state, opts)
      local n = 0
      for _ in pairs(state) do n = n + 1 end
      calls[#calls + 1] = n
      return load(self, state, opts)
    end
    fsdp.load_safetensors_into(model, d)
    assert.same({ 2, 1, 1 }, calls) -- three files: 0.weight 1.bias | 1.weight | 2.weight
    for _, p in ipairs(model:named_parameters()) do assert.equals(0, T.max_abs_diff(p[2], src[p[1]])) end
    rm_rf(d)
  end)

  describe('errors name the problem', function()
    local d
    before_each(function()
      d = tmpdir()
      fsdp.save_safetensors_sharded(d, tensors(), { max_shard_size = 1000 })
      -- As transformers writes it: without our manifest, whose own checks
      -- (fsdp.io.publish, tests/lua/export_publish_spec.lua) would speak
      -- first about the files changed below.
      os.remove(d .. '/fsdp_export.json')
    end)
    after_each(function() rm_rf(d) end)

    it('corrupt index JSON', function()
      write(d .. '/model.safetensors.index.json', '{"weight_map": {"a": ')
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end, 'model%.safetensors%.index%.json is not valid JSON')
      write(d .. '/model.safetensors.index.json', '{"metadata": {}}')
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end, 'has no "weight_map" object')
      write(d .. '/model.safetensors.index.json', '{"weight_map": {"a": "../x.safetensors"}}')
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end, "must name a file in the index's directory")
    end)

    it('a file named in the index is missing', function()
      os.remove(d .. '/model-00002-of-00003.safetensors')
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end,
        'assigns 2 tensors %(%a, %.%.%.%) to .*model%-00002%-of%-00003%.safetensors, which does not exist')
    end)

    it('a tensor the index promises is not in its file', function()
      write(d .. '/model.safetensors.index.json',
        '{"weight_map": {"a": "model-00001-of-00003.safetensors", "z": "model-00001-of-00003.safetensors"}}')
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end,
        'puts tensor z in .*model%-00001%-of%-00003%.safetensors, which has no tensor of that name')
    end)

    it('a name in two files of an index-less directory', function()
      os.remove(d .. '/model.safetensors.index.json')
      fsdp.save_safetensors(d .. '/extra.safetensors', { c = fsdp.zeros({ 1 }) })
      assert.error_matches(function() fsdp.load_safetensors_dir(d) end, 'tensor c is in both .* and .*')
    end)

    it('names and shapes that do not fit the model, before anything is copied', function()
      local model = fsdp.nn.Linear(10, 10)
      model:init_weights({ seed = 1 }) -- parameters start without values
      local before = model.weight:clone()
      assert.error_matches(function() fsdp.load_safetensors_into(model, d) end,
        'missing keys: weight, bias; unexpected keys: a, b, c, d, e')
      local _, unexpected = fsdp.load_safetensors_into(model, d, { strict = false })
      assert.equals(5, #unexpected)
      local sd = d .. '/one'
      fsdp.save_safetensors_sharded(sd, { weight = fsdp.zeros({ 10, 9 }), bias = fsdp.zeros({ 10 }) })
      assert.error_matches(function() fsdp.load_safetensors_into(model, sd) end,
        'size mismatch for weight: .* has %[10, 9%], the model %[10, 10%]')
      assert.equals(0, T.max_abs_diff(before, model.weight))
      rm_rf(sd)
    end)

    it('bad paths and sizes', function()
      assert.error_matches(function() fsdp.load_safetensors_dir(d .. '/nope') end, 'no such file or directory')
      assert.error_matches(function() fsdp.save_safetensors_sharded(d, tensors(), { max_shard_size = '5 parsecs' }) end,
        'max_shard_size must be a positive size')
      assert.error_matches(function() fsdp.save_safetensors_sharded(d, { { 'a', 1 } }) end, 'a is a number, not a Tensor')
      assert.error_matches(function()
        fsdp.save_safetensors_sharded(d, { { 'a', fsdp.zeros({ 1 }) }, { 'a', fsdp.zeros({ 1 }) } })
      end, 'tensor name a appears twice')
    end)
  end)
end)

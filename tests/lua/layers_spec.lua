-- layers_spec.lua: the layering rules of the C core (docs/ARCHITECTURE.md,
-- "Layers" and "Backends are plugins"): no file outside core/cuda names the
-- CUDA backend, and tools/layers.lua finds core/tensor calling nothing
-- above it, no circle between files of different layers, and in core/comm
-- no circle between any files and no call up its three layers ([Note: the
-- layers of core/comm]), in the release objects the suite was built from
-- (the MPI plugin's too when it is built).
local function run(cmd)
  local f = assert(io.popen(cmd .. ' 2>&1'))
  local out = f:read('*a')
  local ok, _, code = f:close()
  return out, ok == true or ok == 0, code
end

describe('the core reaches backends only through their vtables', function()
  it('has no FL_HAVE_CUDA and no fl_cuda_* call outside core/cuda', function()
    local out = run([[grep -rnE 'FL_HAVE_CUDA|fl_cuda_[a-z0-9_]*' core lua --include='*.c' ]] ..
      [[--include='*.h' --include='*.lua' | grep -v '^core/cuda/']])
    assert.equals('', out)
  end)

  it('keeps core/tensor the ground floor, with no circle between layers', function()
    local objdir = 'build/obj/release/fsdp'
    local probe = io.open(objdir .. '/tensor.o', 'rb')
    if not probe then
      pending('no release objects at ' .. objdir .. ' (build the release configuration)')
      return
    end
    probe:close()
    local out, ok = run('luajit tools/layers.lua ' .. objdir)
    assert.is_true(ok, out)
    assert.matches('0 problem%(s%)', out)
  end)

  it('keeps core/comm free of circles between its files and calls up its layers', function()
    local objdir = 'build/obj/release/fsdp'
    local probe = io.open(objdir .. '/work.o', 'rb')
    if not probe then
      pending('no release objects at ' .. objdir .. ' (build the release configuration)')
      return
    end
    probe:close()
    -- --files lists every circle within a layer; none may be core/comm's.
    local out, ok = run('luajit tools/layers.lua --files ' .. objdir .. ' build/obj/release/fsdp_mpi')
    assert.is_true(ok, out)
    assert.is_nil(out:match('circle between files[^\n]*core/comm/'), out)
    assert.is_nil(out:match('core/comm calls up a layer'), out)
    assert.is_nil(out:match('has no layer of core/comm'), out)
    assert.matches('0 problem%(s%)', out)
  end)
end)

-- cuda_plugin_spec.lua: the CUDA backend is a plugin (libfsdp_cuda.so,
-- opened by core/tensor/backend.c on first use): the core links no CUDA
-- library, a CPU run works where the plugin or the CUDA libraries are
-- missing, and asking for cuda:0 then says why it is unavailable. Each case
-- starts the host (host.exe) with FSDP_CUDA_LIBRARY pointing elsewhere.
local host = require 'fsdp.host'
local EXE = host.exe

local function sh(cmd)
  local f = assert(io.popen('(' .. cmd .. ') 2>&1; echo "@rc=$?"'))
  local out = f:read('*a')
  f:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  return body, tonumber(rc)
end

-- fsdp-lua -e CODE with FSDP_CUDA_LIBRARY=lib, bounded in time.
local function run(lib, code)
  return sh(('FSDP_CUDA_LIBRARY=%q timeout 20 %q -e %q'):format(lib, EXE, code))
end

-- A CPU step (forward, backward, update) and the answers about cuda.
local PROBE = [[
local fsdp = require 'fsdp'
local x = fsdp.randn({4, 3}, {seed = 1}):requires_grad_()
local loss = (x * x):sum()
loss:backward()
assert(math.abs(x.grad:sum():item() - 2 * x:sum():item()) < 1e-5)
print('count', fsdp.cuda.device_count(), 'built', fsdp.cuda.built())
print('status', fsdp.cuda.status())
local ok, err = pcall(fsdp.zeros, {2}, {device = 'cuda:0'})
print('zeros', ok, err)
]]

describe('the CUDA backend as a plugin', function()
  it('is not linked into the core', function()
    local lib = EXE:gsub('bin/fsdp%-lua$', 'lib/libfsdp.so')
    local out, rc = sh('ldd ' .. lib)
    assert.equals(0, rc, out)
    for _, name in ipairs({ 'cudart', 'cublas', 'cudnn', 'nccl' }) do
      assert.is_nil(out:find('lib' .. name, 1, true), out)
    end
  end)

  it('is not needed by a CPU run, and its absence is named', function()
    local out, rc = run('/nonexistent/libfsdp_cuda.so', PROBE)
    assert.equals(0, rc, out)
    assert.matches('count\t0\tbuilt\tfalse', out)
    assert.matches('status\tthis build has no CUDA backend %(/nonexistent/libfsdp_cuda.so is not there', out)
    assert.matches('zeros\tfalse\t.*cannot allocate on device cuda:0: this build has no CUDA backend', out)
  end)

  it('is opened only when something asks for cuda', function()
    -- the dynamic loader's trace names every library it opens
    local bad = os.tmpname()
    local trace = function(code)
      return sh(('FSDP_CUDA_LIBRARY=%q LD_DEBUG=files timeout 20 %q -e %q'):format(bad, EXE, code))
    end
    local quiet = trace("local fsdp = require 'fsdp'; print(fsdp.build_info, fsdp.cuda.built())")
    local asked = trace("local fsdp = require 'fsdp'; print(fsdp.cuda.device_count())")
    os.remove(bad)
    assert.is_nil(quiet:find(bad, 1, true), quiet)
    assert.truthy(asked:find('file=' .. bad, 1, true), asked)
  end)

  it('names the loader\'s reason when the plugin cannot be loaded', function()
    -- a file that is no shared object: what a plugin whose CUDA libraries
    -- are missing also gets, dlopen's message
    local bad = os.tmpname()
    local f = assert(io.open(bad, 'w'))
    f:write('not a library\n')
    f:close()
    local out, rc = run(bad, PROBE)
    os.remove(bad)
    assert.equals(0, rc, out)
    assert.matches('count\t0', out)
    assert.matches('status\tthe CUDA backend ' .. bad:gsub('%p', '%%%0') .. ' cannot be loaded: ', out)
    assert.matches('zeros\tfalse\t.*cuda:0.*cannot be loaded', out)
  end)
end)

-- exports_spec.lua: libfsdp.so and the backend plugins beside it export the
-- fl_ API and nothing else (mk/exports.map): an embedding program or another
-- library loaded next to them meets no symbol of ours it did not ask for
-- (OpenMP's named critical sections and C++ template instances leaked
-- before the version script). The libraries checked are the ones this
-- process loaded, so the sanitized build checks its own.
local fsdp = require 'fsdp'

-- The directory of the libfsdp.so mapped into this process.
local function loaded_lib_dir()
  for line in io.lines('/proc/self/maps') do
    local dir = line:match('%s(/%S+)/libfsdp%.so$')
    if dir then return dir end
  end
  error('libfsdp.so is not mapped into this process')
end

-- The defined dynamic symbols of a library that are not fl_ ones, and the
-- set of all of them.
local function foreign_exports(path)
  local p = assert(io.popen(('nm -D --defined-only %q 2>&1; echo "@rc=$?"'):format(path)))
  local out = p:read('*a')
  p:close()
  assert(out:match('@rc=0'), 'nm failed on ' .. path .. ': ' .. out)
  local names, all = {}, {}
  for name in out:gmatch('[0-9a-fA-F]+ %a (%S+)\n') do
    all[name] = true
    if not name:match('^fl_') then names[#names + 1] = name end
  end
  return names, all
end

describe('exported symbols', function()
  it('libfsdp.so exports only fl_ symbols, and every function of fsdp.h', function()
    local dir = loaded_lib_dir()
    local foreign, all = foreign_exports(dir .. '/libfsdp.so')
    assert.same({}, foreign)
    -- The FFI declarations are generated from fsdp.h: each function they
    -- declare must be exported, or a call from Lua fails.
    local cdef = require('ffi').string(fsdp.C.fl_ffi_cdef())
    local missing, functions = {}, 0
    for name in cdef:gmatch('[%w_*%s](fl_[%w_]+)%s*%(') do
      functions = functions + 1
      if not all[name] then missing[#missing + 1] = name end
    end
    assert(functions > 100, 'only ' .. functions .. ' functions found in the FFI declarations')
    assert.same({}, missing)
  end)

  it('each backend plugin beside it exports only fl_ symbols', function()
    local dir = loaded_lib_dir()
    local checked = 0
    for _, name in ipairs { 'libfsdp_mpi.so', 'libfsdp_cuda.so' } do
      local f = io.open(dir .. '/' .. name)
      if f then
        f:close()
        assert.same({}, (foreign_exports(dir .. '/' .. name)))
        checked = checked + 1
      end
    end
    if checked == 0 then pending('no backend plugin is built in ' .. dir) end
  end)
end)

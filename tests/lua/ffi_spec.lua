-- ffi_spec.lua: the FFI declarations generated from core/include/fsdp.h
-- load, and every function they declare resolves to a symbol of the
-- running binary (so the header and the library cannot drift apart).
local ffi = require 'ffi'
local core = require 'fsdp.core'

describe('generated FFI declarations', function()
  local cdef = ffi.string(core.C.fl_ffi_cdef())

  it('are plain C with no preprocessor left', function()
    assert.is_true(#cdef > 1000)
    assert.is_nil(cdef:find('#', 1, true))
    assert.is_nil(cdef:find('FL_API', 1, true))
  end)

  it('declare functions that all resolve in the binary', function()
    local names = {}
    for name in cdef:gmatch('([%w_]+)%s*%(') do
      if name:match('^fl_') then names[#names + 1] = name end
    end
    assert.is_true(#names >= 50, 'found only ' .. #names .. ' functions')
    for _, name in ipairs(names) do
      local ok, err = pcall(function() return core.C[name] end)
      assert(ok, ('%s does not resolve: %s'):format(name, tostring(err)))
    end
  end)

  it('expose the enums and structs', function()
    assert.equals(0, core.C.FL_F32)
    assert.equals(8, core.C.FL_MAX_DIMS)
    assert.is_true(ffi.sizeof('fl_tensor') > 128)
    assert.equals(56, ffi.sizeof('fl_memory_stats'))
  end)
end)

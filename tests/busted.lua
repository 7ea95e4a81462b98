-- tests/busted.lua: run busted specs inside fsdp-lua, where the FFI sees
-- the core (Debian's /usr/bin/busted runs under lua5.2, without ffi).
--   build/bin/fsdp-lua tests/busted.lua [busted options] tests/lua
-- busted reads its options from `arg`, which the host sets as lua does.
--
-- Under Lua 5.1 semantics busted reports failing specs by raising an error
-- with a nil message (after printing its summary); exit 1 quietly then,
-- and let any other error propagate with its traceback.
local ok, err = pcall(require('busted.runner'), { standalone = false })
if not ok then
  if err == nil then os.exit(1) end
  error(err, 0)
end

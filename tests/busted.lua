-- tests/busted.lua: run busted specs inside fsdp-lua, where the FFI sees
-- the core (Debian's /usr/bin/busted runs under lua5.2, without ffi).
--   build/bin/fsdp-lua tests/busted.lua [busted options] tests/lua
-- busted reads its options from `arg`, which the host sets as lua does.
require('busted.runner')({ standalone = false })

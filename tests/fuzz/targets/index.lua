-- The sharded checkpoint's index reader on one file: copied as
-- <dir>/index.json (the reader takes a step directory) and read.
local directory = require 'fsdp.checkpointing.directory'

-- tests/fuzz/run.sh gives a work directory it removes afterwards.
local dir = os.getenv('FUZZ_WORKDIR')
if not dir then
  dir = os.tmpname()
  os.remove(dir)
end
assert(os.execute("mkdir -p '" .. dir .. "'") == 0)
local index = dir .. '/' .. directory.INDEX

return function(path)
  local src = assert(io.open(path, 'rb'))
  local text = src:read('*a')
  src:close()
  local f = assert(io.open(index, 'wb'))
  f:write(text)
  f:close()
  directory.read_index(dir)
end

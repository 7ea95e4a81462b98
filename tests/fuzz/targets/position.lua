-- Hostile saved data positions fed to the restore (load_state): the input
-- is a position as a checkpoint's index holds it (JSON; anything that does
-- not decode is given as it is), restored into a corpus stream over a
-- plain and a gzip JSON lines file (checked against the fingerprint, or
-- going on past a change with data_changed = continue, as the input's
-- first byte picks), which then gives rows; and into a token dataset.
-- Refusing is right; an error must be clear: one line naming what is at
-- fault (the corpus, the dataset, or a file, maybe one the position
-- names) before its colon. A Lua error of another kind (indexing nil, a
-- bad FFI conversion, a traceback) aborts, so the fuzzer reports it like
-- a crash.
local ffi = require 'ffi'
local json = require 'fsdp.io.json'
local corpus = require 'fsdp.data.corpus'
local tokens = require 'fsdp.data.tokens'
local byte = require('fsdp.data.byte_tokenizer').new()

pcall(ffi.cdef, 'void abort(void);')
local here = debug.getinfo(1, 'S').source:match('^@(.*)/targets/[^/]*$')
local data = dofile(here .. '/position_data.lua')
local dir = (os.getenv('FUZZ_WORKDIR') or '/tmp') .. '/position'
local made

local function clear(err, where)
  err = tostring(err):gsub('^[^%s:]+%.lua:%d+: ', '') -- where a Lua raise came from
  -- the corpus or dataset (maybe after the module's name), or a file the
  -- position names (quoted when its name holds control characters)
  local named = err:sub(1, #where) == where or err:match('^fsdp%.data%.%a+: ' .. where:gsub('%p', '%%%0'))
    or err:match('^[^\n]-: %S')
  -- what the VM, the libraries and the FFI raise (after the position that
  -- was stripped), as opposed to a message of the project
  local internal = { '^attempt to index ', '^attempt to call ', '^attempt to compare ', '^attempt to perform ',
                     '^attempt to concatenate ', '^attempt to get length ', '^bad argument #', '^cannot convert ',
                     '^table index is ', '^stack overflow', '^not enough memory', '^invalid key to ' }
  local bad = not named or err:find('\n', 1, true)
  for _, pattern in ipairs(internal) do bad = bad or err:find(pattern) end
  if bad then
    io.stderr:write('position target: an unclear error: ', err, '\n')
    ffi.C.abort()
  end
end

return function(path)
  if not made then
    -- tests/fuzz/seeds.lua wrote it with the seeds' positions; written
    -- again, a shard could differ (its header's metadata order)
    if not require('lfs').attributes(dir) then data.write(dir) end
    made = true
  end
  local f = assert(io.open(path, 'rb'))
  local text = f:read('*a')
  f:close()
  local ok, pos = pcall(json.decode, text)
  if not ok then pos = text end
  local policy = text:byte(1) == 0x20 and 'continue' or 'stop' -- a leading space: go on past changes
  -- (what continue says on stdout is not the fuzzer's business)
  local function quiet(fn)
    local stdout = io.stdout
    io.stdout = { write = function(self) return self end, flush = function() end }
    local ok2, err = pcall(fn)
    io.stdout = stdout
    return ok2, err
  end
  local run, err = quiet(function()
    local s = corpus.open(dir .. '/corpus', data.stream_opts(byte, policy))
    s:load_state(pos)
    s:rows(3)
  end)
  if not run then clear(err, dir .. '/corpus') end
  run, err = quiet(function()
    local ds = tokens.open(dir .. '/shards', data.token_opts(policy))
    ds:load_state(pos)
    ds:next()
  end)
  if not run then clear(err, dir .. '/shards') end
end

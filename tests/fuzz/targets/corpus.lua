-- The raw corpus readers and the streaming loader on one file. The
-- input's first bytes pick the reader, as a file name would: gzip magic
-- -> .jsonl.gz, zstd magic -> .jsonl.zst, '{' -> .jsonl, else .txt
-- paragraphs. Every document is read, then the file is streamed into rows
-- (one worker thread) and resumed from the state halfway, as training does.
local corpus = require 'fsdp.data.corpus'
local byte = require('fsdp.data.byte_tokenizer').new()

-- The input (a /proc/self/fd path without a suffix) copied to a file
-- whose name says the format, in the harness's work directory.
local function named_copy(path)
  local f = assert(io.open(path, 'rb'))
  local bytes = f:read('*a')
  f:close()
  local head = bytes:sub(1, 4)
  local ext = '.txt'
  if head:sub(1, 2) == '\31\139' then ext = '.jsonl.gz'
  elseif head == '\40\181\47\253' then ext = '.jsonl.zst'
  elseif head:sub(1, 1) == '{' then ext = '.jsonl' end
  local file = (os.getenv('FUZZ_WORKDIR') or '/tmp') .. '/corpus-input' .. ext
  f = assert(io.open(file, 'wb'))
  f:write(bytes)
  f:close()
  return file
end

local function drive(file)
  for _ in corpus.documents(file, { max_doc_bytes = 4096 }) do end
  local s = corpus.open(file, { tokenizer = byte, seq_len = 8, batch_size = 1, once = true, shuffle = false,
                                threads = 1, rank = 0, world_size = 1, max_doc_bytes = 4096 })
  local n, mid = 0, nil
  while s:rows(4) do
    n = n + 1
    if n == 2 then mid = s:state() end
  end
  if mid then
    s:load_state(mid)
    s:rows(4)
  end
end

return function(path)
  local file = named_copy(path)
  local ok, err = pcall(drive, file)
  os.remove(file)
  if not ok then error(err, 0) end
end

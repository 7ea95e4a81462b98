-- The data the `position` fuzz target restores positions into, written by
-- the target (in its work directory) and by tests/fuzz/seeds.lua (whose
-- seed positions must stand on the same bytes): a corpus of a plain and a
-- gzip JSON lines file, and a directory of two token shards.
local M = {}

local function docs(k)
  local out = {}
  for i = 1, 12 do
    out[i] = ('{"text": "document %d of file %d: the cat chases the mouse %s"}'):format(i, k, ('again '):rep(i % 5))
  end
  return table.concat(out, '\n') .. '\n'
end

function M.write(dir)
  assert(os.execute(('rm -rf %q && mkdir -p %q/corpus %q/shards'):format(dir, dir, dir)) == 0)
  for k = 1, 2 do
    local f = assert(io.open(('%s/corpus/part-%d.jsonl'):format(dir, k), 'wb'))
    f:write(docs(k))
    f:close()
  end
  -- gzip -n: no name or time in the header, so every write is the same bytes
  assert(os.execute(('gzip -n -f %q/corpus/part-2.jsonl'):format(dir)) == 0)
  local fsdp, tokens = require 'fsdp', require 'fsdp.data.tokens'
  for k = 0, 1 do
    tokens.write_shard(('%s/shards/train-%05d.safetensors'):format(dir, k), fsdp.arange(0, 60, { dtype = 'i64' }),
      { vocab_size = 64, eos_id = 63 })
  end
end

function M.stream_opts(tok, policy)
  return { tokenizer = tok, seq_len = 8, batch_size = 1, rank = 0, world_size = 1, threads = 1, data_changed = policy,
           max_doc_bytes = 4096 }
end

function M.token_opts(policy)
  return { seq_len = 8, batch_size = 1, rank = 0, world_size = 1, data_changed = policy }
end

return M

-- The token-shard reader on one file: open it as a split of one shard,
-- read a few batches (sequential and from the end), as training does.
local tokens = require 'fsdp.data.tokens'

return function(path)
  local ds = tokens.open(path, { seq_len = 8, batch_size = 2, shuffle = false, rank = 0, world_size = 1 })
  if ds.num_sequences >= 2 then
    ds:next()
    ds:gather({ ds.num_sequences - 1 })
  end
end

-- tests/mpi/data_ranks.lua: the data pipeline across ranks. Each rank reads
-- its own distinct part of the token shards, and together the ranks read
-- exactly what one process with the whole global batch reads (the
-- sampler's contract); the logger averages the loss over ranks, prefixes
-- rank 0's lines, and evaluation averages over every rank's batches.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local T = require 'tests.mpi.tap'
local tokens = require 'fsdp.data.tokens'
local metrics = require 'fsdp.observe.metrics'
local r, W = T.rank, T.world

-- A directory every rank agrees on: rank 0 draws its name.
local tag = dist.broadcast(fsdp.tensor({ os.time() % 100000 * 1000 + math.floor(os.clock() * 1e6) % 1000 },
  { dtype = 'i64' }), 0):item()
local dir = ('%s/fsdp_data_ranks_%d'):format(os.getenv('TMPDIR') or '/tmp', tag)
if r == 0 then
  assert(require('lfs').mkdir(dir))
  tokens.write_shard(dir .. '/train-00000.safetensors', fsdp.arange(0, 1001, { dtype = 'i64' }),
    { vocab_size = 2000, eos_id = 0 })
end
dist.barrier()

local B, L = 3, 5
T.test('each rank reads a distinct part; together they read one process\'s global batch', function()
  local mine = tokens.open(dir, { seq_len = L, batch_size = B, seed = 11 })
  local whole = tokens.open(dir, { seq_len = L, batch_size = B * W, seed = 11, rank = 0, world_size = 1 })
  T.truthy(mine.sampler.rank == r and mine.sampler.world_size == W, 'rank and world from fsdp.dist')
  for step = 1, 2 * mine:steps_per_epoch() + 3 do -- through two epoch boundaries
    local ids = mine:next()
    local all = dist.all_gather(ids)            -- [W * B, L], rank order
    T.eq(all, whole:next(), ('step %d'):format(step))
    -- distinct: no sequence start appears twice in the step
    local seen = {}
    for _, row in ipairs(all:tolist()) do
      T.truthy(not seen[row[1]], ('step %d: sequence at %d read twice'):format(step, row[1]))
      seen[row[1]] = true
    end
  end
end)

T.test('a state saved on every rank resumes every rank at the next batch', function()
  local a = tokens.open(dir, { seq_len = L, batch_size = B, seed = 3 })
  for _ = 1, 7 do a:next() end
  local s = a:state()
  local want = a:next()
  local b = tokens.open(dir, { seq_len = L, batch_size = B, seed = 3 })
  b:load_state(s)
  T.eq(b:next(), want, 'resumed batch')
end)

T.test('the logger averages the loss over ranks and prefixes rank 0\'s lines', function()
  local path = os.tmpname()
  local out = assert(io.open(path, 'w'))
  local log = metrics.Logger({ total_steps = 1, batch_size = B, out = out, progress = false })
  log:step(1, { loss = r, lr = 0.1, dt = 1 })
  log:close()
  out:close()
  local text = io.open(path):read('*a')
  os.remove(path)
  if r == 0 then
    local want = ('[rank 0] Batch 1 Loss: %.4f, Speed: %.2f samples/sec'):format((W - 1) / 2, B * W)
    T.truthy(text:find(want, 1, true), 'got: ' .. text)
  else
    T.truthy(text == '', 'only rank 0 prints, got: ' .. text)
  end
end)

T.test('evaluate averages over every rank\'s batches', function()
  -- rank k evaluates k + 1 batches of loss k: mean = sum k(k+1) / sum (k+1)
  local n = 0
  local mean = metrics.evaluate(function() return fsdp.tensor({ r }) end, function()
    n = n + 1
    if n <= r + 1 then return true end
  end)
  local num, den = 0, 0
  for k = 0, W - 1 do num, den = num + k * (k + 1), den + k + 1 end
  T.truthy(math.abs(mean - num / den) < 1e-12, ('mean %g, expected %g'):format(mean, num / den))
end)

dist.barrier()
if r == 0 then
  os.remove(dir .. '/train-00000.safetensors')
  os.remove(dir)
end
T.done()

-- benchmarks/checkpoint.lua: how fast sharded checkpoints and the streamed
-- full state dict are written and read. Prints numbers; asserts nothing.
--
--   fsdp-lua benchmarks/checkpoint.lua [--layers=4] [--dim=512] [--vocab=16000] [--dir=/tmp/x]
--   mpirun -np 2 fsdp-lua benchmarks/checkpoint.lua
--
-- A Llama of the given size is sharded (FULL_SHARD, one unit per layer),
-- takes one AdamW step so the optimizer has its two state tensors, and is
-- then saved (parameters + optimizer state, every rank its file, fsync'd),
-- loaded into a freshly built model and optimizer, and written as one full
-- state dict (parameters only, gathered unit by unit, rank 0 writing).
-- MB/s counts the bytes of the files (all ranks) over the wall time of the
-- whole collective operation, best and median of --repeats runs (disk
-- writeback makes single runs noisy on shared machines). Files land in the page cache; the fsyncs
-- make the save rates include reaching the disk, while a load right after
-- a save usually reads from memory (a cold read is slower).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local ckpt = require 'fsdp.checkpointing'
local files = require 'fsdp.io.files'
local lfs = require 'lfs'

local cfg = options.config({
  layers = { 4, 'decoder layers' },
  dim = { 512, 'model width' },
  vocab = { 16000, 'vocabulary (embedding and head: the largest unit)' },
  dir = { '', 'where to write (default: a fresh directory under /tmp, removed at the end)' },
  repeats = { 3, 'times each operation runs; the best and the median are printed' },
}, arg, 'benchmarks/checkpoint.lua')

local R, W = dist.rank(), dist.world_size()
local C = { dim = cfg.dim, n_layers = cfg.layers, n_heads = 8, n_kv_heads = 8,
            ffn_dim = math.ceil(cfg.dim * 8 / 3 / 32) * 32, vocab_size = cfg.vocab, max_seq_len = 32 }

local dir = cfg.dir
if dir == '' then dir = dist.all_gather_strings(R == 0 and os.tmpname() .. '.ckpt' or '')[1] end

local function build()
  local m = llama.CausalLM(llama.config('Llama-2-7b', C), { device = 'meta' })
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 0 })
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-4 })
  return m, opt
end

-- Best and median wall time of fn over cfg.repeats runs (setup() before
-- each, untimed).
local function timed(fn, setup)
  local times = {}
  for i = 1, cfg.repeats do
    if setup then setup() end
    dist.barrier()
    local t0 = clock.now()
    fn(i)
    dist.barrier()
    times[i] = clock.now() - t0
  end
  table.sort(times)
  return times[1], times[math.floor((#times + 1) / 2)]
end

local function bytes_under(path)
  local mode = lfs.attributes(path, 'mode')
  if mode == 'file' then return lfs.attributes(path, 'size') end
  if mode ~= 'directory' then return 0 end
  local n = 0
  for _, name in ipairs(files.list(path)) do n = n + bytes_under(files.join(path, name)) end
  return n
end

local m, opt = build()
local n_params = 0
for _, u in ipairs(fsdp.sharding.units(m)) do n_params = n_params + u.numel end
local ids = fsdp.randint(0, C.vocab_size, { 1, 16 }, { seed = R })
m:loss(ids, ids):backward()
opt:step()
opt:zero_grad()

local r = {}
r.save = { timed(function(i) ckpt.save(dir, { model = m, optimizer = opt, step = i, keep = 1 }) end) }
local last = dir .. '/' .. ckpt.directory.step_name(cfg.repeats)
local ckpt_bytes = bytes_under(last)
local m2, opt2
r.load = { timed(function() ckpt.load(last, { model = m2, optimizer = opt2 }) end,
                 function() m2, opt2 = nil, nil; collectgarbage(); m2, opt2 = build() end) }
local full_path = dir .. '/full.safetensors'
r.full = { timed(function() fsdp.save_full_state_dict(full_path, m) end) }
local full_bytes = bytes_under(full_path)

if R == 0 then
  local mb = 2 ^ 20
  print(('Llama %d layers, width %d, vocab %d: %.1fM parameters, %d rank%s, FULL_SHARD'):format(
    cfg.layers, cfg.dim, cfg.vocab, n_params / 1e6, W, W == 1 and '' or 's'))
  print(('%-38s %9s %9s %9s %11s'):format('operation', 'MiB', 'best s', 'MiB/s', 'median MiB/s'))
  local function row(what, bytes, t)
    print(('%-38s %9.1f %9.3f %9.1f %11.1f'):format(what, bytes / mb, t[1], bytes / mb / t[1], bytes / mb / t[2]))
  end
  row('sharded save (params + AdamW state)', ckpt_bytes, r.save)
  row('sharded load (into a fresh model)', ckpt_bytes, r.load)
  row('full state dict save (streamed)', full_bytes, r.full)
  if cfg.dir == '' then require('fsdp.io.files').remove_tree(dir) end
end
dist.barrier()

-- benchmarks/generate.lua: tokens per second of greedy decoding with the
-- KV cache against recomputing the whole prefix at every step (no cache),
-- on one device. Prints both, the ratio, and whether the tokens agree.
--
--   fsdp-lua benchmarks/generate.lua                          small Llama (dim 512, 8 layers), 100 new tokens
--   fsdp-lua benchmarks/generate.lua --model=tiny --new_tokens=20 --prompt_len=8
--   fsdp-lua benchmarks/generate.lua --device=cuda --dtype=bf16
--
-- The model has random weights (seeded); timing covers generate() whole
-- (prompt, every step, the sampler), best of --repeats runs, with the
-- process's CPU time of that run beside it. Without the
-- cache step t runs the model on prompt + t tokens, so its cost grows
-- with the length and the gap widens with --new_tokens and --prompt_len.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local llama = require 'models.llama'
local generate = require 'fsdp.generate'

local names = {}
for k in pairs(llama.configs) do names[#names + 1] = k end
table.sort(names)

local cfg = options.config({
  model = { 'small', 'Llama config (models/llama.lua)', one_of = names },
  num_layers = { 0, 'override the layer count (0: the config\'s)', int = true, min = 0 },
  vocab_size = { 0, 'override the vocabulary (0: the config\'s)', int = true, min = 0 },
  batch = { 1, 'prompts decoded together', int = true, min = 1 },
  prompt_len = { 16, 'tokens per prompt', int = true, min = 1 },
  new_tokens = { 100, 'tokens generated per prompt', int = true, min = 1 },
  repeats = { 2, 'runs of each mode; the best is reported', int = true, min = 1 },
  dtype = { 'f32', 'weights and cache dtype', one_of = { 'f32', 'bf16' } },
  device = { 'cpu', 'device', one_of = { 'cpu', 'cuda' } },
  seed = { 0, 'weights and prompt seed', int = true, min = 0 },
}, arg, 'benchmarks/generate.lua')

local o = { device = cfg.device, dtype = cfg.dtype }
if cfg.num_layers > 0 then o.n_layers = cfg.num_layers end
if cfg.vocab_size > 0 then o.vocab_size = cfg.vocab_size end
local model = llama.build(cfg.model, o)
model:init_weights({ seed = cfg.seed })
model:eval()
local c = model.config

local ids = fsdp.randint(0, c.vocab_size, { cfg.batch, cfg.prompt_len }, { seed = cfg.seed + 1 }):tolist()
-- Best wall time of the repeats, and the process's CPU time in that run
-- (os.clock: all threads; steadier than wall time on a shared machine).
local function run(use_cache)
  local best, cpu, rows = math.huge, 0, nil
  for _ = 1, cfg.repeats do
    fsdp.synchronize(cfg.device)
    local t0, c0 = clock.now(), os.clock()
    rows = generate.generate(model, ids, { max_new_tokens = cfg.new_tokens, use_cache = use_cache })
    fsdp.synchronize(cfg.device)
    local dt = clock.now() - t0
    if dt < best then best, cpu = dt, os.clock() - c0 end
  end
  return cfg.batch * cfg.new_tokens / best, rows, best, cpu
end

print(('model: %s (dim %d, %d layers, %d heads, %d kv heads, vocab %d), %s on %s; batch %d, prompt %d, %d new tokens')
  :format(cfg.model, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, cfg.dtype, cfg.device, cfg.batch,
    cfg.prompt_len, cfg.new_tokens))
local cached, rows_c, t_c, cpu_c = run(true)
local plain, rows_p, t_p, cpu_p = run(false)
local agree = true
for b = 1, cfg.batch do agree = agree and table.concat(rows_c[b], ',') == table.concat(rows_p[b], ',') end
print(('KV cache:        %9.1f tokens/s (%.3f s; CPU %.3f s)'):format(cached, t_c, cpu_c))
print(('no cache:        %9.1f tokens/s (%.3f s; CPU %.3f s)'):format(plain, t_p, cpu_p))
print(('speed-up:        %9.2fx wall, %.2fx CPU time; tokens %s'):format(cached / plain, cpu_p / cpu_c,
  agree and 'identical' or 'DIFFER'))
print('RESULT ' .. require('cjson').encode({ cached_tokens_per_s = cached, uncached_tokens_per_s = plain,
                                             ratio = cached / plain, cpu_ratio = cpu_p / cpu_c, identical = agree }))

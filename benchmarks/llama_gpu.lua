-- benchmarks/llama_gpu.lua: issue 7's fsdp-lua half of the GPU benchmark.
-- One process, no sharding: a Llama (models/llama.lua) with its parameters
-- in bf16 on one device, AdamW, synthetic random tokens; warmup steps, then
-- measured steps. Reports tokens/s, step time, MFU and peak device memory,
-- ending with one machine-readable line `RESULT {json}` whose keys are
-- those of benchmarks/llama_torch.py (PyTorch eager, the same model), so
-- benchmarks/gpu_compare.sh can put the two side by side.
--
--   fsdp-lua benchmarks/llama_gpu.lua                          # Llama-3.2-1B, cuda:0, seq 2048, batch 1
--   fsdp-lua benchmarks/llama_gpu.lua --find_batch             # the largest batch that fits, measured
--   fsdp-lua benchmarks/llama_gpu.lua --model=TinyLlama-1.1B --batch=8
--   fsdp-lua benchmarks/llama_gpu.lua --device=cpu --model=tiny --seq=64 --batch=2 --steps=2
--
-- MFU is the model's training FLOPs per token (llama.flops_per_token: 6N +
-- 12 L H hd T, PaLM appendix B; N counts a tied embedding once, an untied
-- input embedding not at all: it is a lookup) times
-- tokens/s over --peak_tflops (989: H100 SXM bf16 dense). The clock is
-- read after `loss:item()`: its device-to-host copy waits for every kernel
-- queued before it (all run on the legacy default stream), so each timed
-- step includes its own GPU work and no other.
--
-- Optimizer state: by default exp_avg/exp_avg_sq take the parameters' dtype
-- (bf16), which is what torch.optim.AdamW does for bf16 parameters, so the
-- two runs hold the same bytes; --state_dtype=f32 keeps f32 moments (8
-- bytes per parameter more than PyTorch's run, which has no such option).
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local cjson = require 'cjson'

local cfg = options.config({
  model = { 'Llama-3.2-1B', 'a models/llama.lua config (Llama-3.2-1B, TinyLlama-1.1B, tiny, ...)' },
  num_layers = { 0, 'override the config\'s layer count (0: keep it)' },
  device = { 'cuda:0', 'where parameters, activations and optimizer state live' },
  dtype = { 'bf16', 'parameter and compute dtype' },
  state_dtype = { '', 'AdamW moment dtype ("": the parameters\', as torch.optim.AdamW)' },
  seq = { 2048, 'sequence length' },
  batch = { 1, 'sequences per step (ignored with --find_batch)' },
  find_batch = { false, 'try batches 1, 2, 4, ... then bisect: measure the largest that fits' },
  max_batch = { 1024, 'upper bound for --find_batch' },
  steps = { 10, 'measured steps' },
  warmup = { 3, 'unmeasured steps first' },
  lr = { 1e-4, 'AdamW learning rate' },
  seed = { 0, 'init and data seed' },
  peak_tflops = { 989, 'device peak TFLOP/s for MFU (989: H100 SXM bf16 dense)' },
  memory_limit_mb = { 0, 'cap the device\'s memory (0: none); makes --find_batch testable on cpu' },
  fused_loss = { true, 'the LM head and cross-entropy as one chunked op (false: logits, then the loss)' },
}, arg, 'benchmarks/llama_gpu.lua')

local device = cfg.device
local overrides = {}
if cfg.num_layers > 0 then overrides.num_layers = cfg.num_layers end
local c = llama.config(cfg.model, overrides)
local T = cfg.seq
if cfg.memory_limit_mb > 0 then fsdp.set_memory_limit(device, cfg.memory_limit_mb * 2^20) end

local t_build = clock.now()
local model = llama.build(c, { device = device, dtype = cfg.dtype })
model.fused_loss = cfg.fused_loss
model:init_weights({ seed = cfg.seed })
local n_params = model:num_parameters()
local opt = optim.AdamW(model:named_parameters(), {
  lr = cfg.lr, weight_decay = 0.1, state_dtype = cfg.state_dtype ~= '' and cfg.state_dtype or nil,
})
print(('fsdp-lua %s; %s'):format(fsdp.version, fsdp.build_info))
print(('model %s: %d layers, dim %d, %d heads (%d kv), ffn %d, vocab %d, %s; %d parameters (%s on %s), built in %.1f s')
  :format(cfg.model, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.vocab_size,
    c.tied and 'tied head' or 'untied head', n_params, cfg.dtype, device, clock.now() - t_build))

-- Synthetic tokens: ids and next-token targets, uniform over the vocabulary.
local function batch_of(B, step)
  local ids = fsdp.randint(0, c.vocab_size, { B, T }, { seed = cfg.seed, stream = 2 * step, device = device })
  local targets = fsdp.randint(0, c.vocab_size, { B, T }, { seed = cfg.seed, stream = 2 * step + 1,
                                                            device = device })
  return ids, targets
end

-- One training step; returns the loss as a number, which waits for the
-- device (see the header).
local function train_step(B, step)
  local ids, targets = batch_of(B, step)
  local loss = model:loss(ids, targets)
  loss:backward()
  opt:step()
  opt:zero_grad()
  return loss:item()
end

-- Drop whatever a failed step left behind (its graph, half-made gradients)
-- and return the cached blocks, so the next try starts from the same
-- persistent state.
local function clean_up()
  model:zero_grad()
  collectgarbage('collect'); collectgarbage('collect')
  fsdp.empty_cache(device)
end

local function is_oom(err) return tostring(err):find('out of memory', 1, true) ~= nil end

-- Two steps at batch B (the second holds the optimizer state made by the
-- first): true when it fits, false on out-of-memory; other errors raise.
local function fits(B)
  local ok, err = pcall(function() train_step(B, 0); train_step(B, 1) end)
  clean_up()
  if ok then return true end
  if not is_oom(err) then error(err, 0) end
  return false
end

local B = cfg.batch
if cfg.find_batch then
  local good, bad = 0, nil
  local b = 1
  while b <= cfg.max_batch do
    local ok = fits(b)
    print(('find_batch: batch %d %s'):format(b, ok and 'fits' or 'is out of memory'))
    if not ok then bad = b; break end
    good = b
    b = b * 2
  end
  if good == 0 then error(('find_batch: batch 1 x seq %d does not fit on %s'):format(T, device), 0) end
  -- Bisect between the last fitting power of two and the first that did not.
  while bad and bad - good > 1 do
    local mid = math.floor((good + bad) / 2)
    local ok = fits(mid)
    print(('find_batch: batch %d %s'):format(mid, ok and 'fits' or 'is out of memory'))
    if ok then good = mid else bad = mid end
  end
  B = good
  print(('find_batch: largest batch %d'):format(B))
end

local cuda_device = device:match('^cuda') ~= nil
-- Measure: warmup steps, then reset the peak so it covers steady-state
-- steps only (as torch.cuda.reset_peak_memory_stats on the other side).
local loss0, loss, times
local function measure()
  loss0, times = nil, {}
  for step = 1, cfg.warmup do
    loss = train_step(B, step)
    loss0 = loss0 or loss
  end
  fsdp.reset_memory_stats(device)
  fsdp.reset_bytes_moved()
  if cuda_device then fsdp.cuda.reset_launches() end
  for step = cfg.warmup + 1, cfg.warmup + cfg.steps do
    local t0 = clock.now()
    loss = train_step(B, step)
    loss0 = loss0 or loss
    times[#times + 1] = clock.now() - t0
  end
end
-- A batch that found_batch saw fit by a hair can fail here (dead tensors
-- awaiting the collector, fragmentation): then one less, as often as needed.
while true do
  local ok, err = pcall(measure)
  if ok then break end
  clean_up()
  if not (cfg.find_batch and is_oom(err) and B > 1) then error(err, 0) end
  print(('find_batch: batch %d ran out of memory while measured; measuring %d'):format(B, B - 1))
  B = B - 1
end

local total = 0
for _, dt in ipairs(times) do total = total + dt end
local step_s = total / #times
local tokens_s = B * T / step_s
local flops_tok = llama.flops_per_token(c, T, n_params)
local mfu = flops_tok * tokens_s / (cfg.peak_tflops * 1e12)
local mem = fsdp.memory_stats(device)
-- What the memory-bound ops (all but the GEMMs and attention) read and
-- wrote per step, counted from their operands ([Note: bytes moved]).
local bytes_step = fsdp.bytes_moved() / cfg.steps
-- The backend's kernel launches per step ([Note: kernel launches counted]:
-- its own kernels; cuBLAS's and cuDNN's are not among them): small
-- kernels cost a launch each, and CPU time to issue it.
local launches_step = cuda_device and fsdp.cuda.launches() / cfg.steps or nil

print(('batch %d x seq %d: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %g TFLOP/s')
  :format(B, T, step_s * 1e3, tokens_s, flops_tok * tokens_s / 1e12, 100 * mfu, cfg.peak_tflops))
print(('peak memory %.3f GiB allocated, %.3f GiB reserved; loss %.4f -> %.4f (ln V = %.4f)')
  :format(mem.peak / 2^30, (mem.reserved or 0) / 2^30, loss0, loss, math.log(c.vocab_size)))
print(('memory-bound ops moved %.2f GB per step (benchmarks/step_bytes.lua lists them per op)')
  :format(bytes_step / 1e9))
if launches_step then
  print(('kernel launches per step: %.0f (the backend\'s own; cuBLAS and cuDNN launch theirs besides)')
    :format(launches_step))
end
-- Which attention ran (cuDNN's fused engine or the flash-style kernels):
-- on a GPU never seen before, the first thing to know about the speed.
local paths = fsdp.cuda.is_available() and fsdp.cuda.attention_paths() or nil
if paths then
  print(('attention calls: cuDNN %d forward, %d backward; kernels %d forward, %d backward%s')
    :format(paths.cudnn_forward, paths.cudnn_backward, paths.kernel_forward, paths.kernel_backward,
      paths.kernel_forward > 0 and ' (FSDP_CUDNN_DEBUG=1 says why cuDNN was not used)' or ''))
end
print('RESULT ' .. cjson.encode({
  impl = 'fsdp-lua', model = cfg.model, device = device, dtype = cfg.dtype, params = n_params,
  batch = B, seq = T, steps = cfg.steps, warmup = cfg.warmup, step_ms = step_s * 1e3,
  tokens_per_s = tokens_s, flops_per_token = flops_tok, tflops = flops_tok * tokens_s / 1e12,
  mfu = mfu, peak_tflops = cfg.peak_tflops, peak_bytes = mem.peak, reserved_bytes = mem.reserved or 0,
  loss_first = loss0, loss_last = loss, attention_paths = paths, bytes_moved_per_step = bytes_step,
  launches_per_step = launches_step,
}))

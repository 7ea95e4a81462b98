-- benchmarks/step_bytes.lua: the bytes a Llama training step's
-- memory-bound ops read and write, per op, counted on meta tensors (no
-- memory, no device: a 70B step on a laptop), beside the step's FLOPs.
--
--   fsdp-lua benchmarks/step_bytes.lua                       # Llama-3.2-1B, bf16, batch 8 x 2048
--   fsdp-lua benchmarks/step_bytes.lua --model=Llama-2-7b --batch=2 --bandwidth=3.35e12
--
-- Every op but matmul/linear, conv2d and attention counts each operand it
-- reads and each output it writes once ([Note: bytes moved] in
-- core/base/internal.h): the floor a streaming kernel reaches. Divided by a
-- memory bandwidth (--bandwidth, bytes/s; default the H100's 3.35e12), it
-- is the least time those ops can take; a profile's kernel times over it
-- give how far each kernel is from the floor. The step is the one
-- benchmarks/llama_gpu.lua times: forward, loss, backward, AdamW with
-- moments in the parameters' dtype, gradients zeroed.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'

local cfg = options.config({
  model = { 'Llama-3.2-1B', 'a models/llama.lua config' },
  dtype = { 'bf16', 'parameter and compute dtype' },
  seq = { 2048, 'sequence length' },
  batch = { 8, 'sequences per step' },
  bandwidth = { 3.35e12, 'memory bandwidth in bytes/s for the floor column (H100 SXM: 3.35e12)' },
  fused_loss = { true, 'the LM head and cross-entropy as one chunked op (false: logits, then the loss)' },
}, arg, 'benchmarks/step_bytes.lua')

local c = llama.config(cfg.model)
local model = llama.build(c, { device = 'meta', dtype = cfg.dtype })
model.fused_loss = cfg.fused_loss
local opt = optim.AdamW(model:named_parameters(), { lr = 1e-4, weight_decay = 0.1 })
local shape = { cfg.batch, cfg.seq }
local ids = fsdp.empty(shape, { dtype = 'i64', device = 'meta' })
local targets = fsdp.empty(shape, { dtype = 'i64', device = 'meta' })

fsdp.reset_bytes_moved()
fsdp.reset_flops()
local loss = model:loss(ids, targets)
loss:backward()
opt:step()
opt:zero_grad()
local flops = fsdp.flops()

local rows, total = fsdp.bytes_moved_by_op(), fsdp.bytes_moved()
table.sort(rows, function(a, b) return a.bytes > b.bytes end)
print(('%s, %s, batch %d x seq %d: one training step (forward, backward, AdamW)')
  :format(cfg.model, cfg.dtype, cfg.batch, cfg.seq))
print(('%-26s %7s %10s %6s %10s'):format('op', 'calls', 'GB', 'share', 'floor ms'))
for _, r in ipairs(rows) do
  print(('%-26s %7d %10.3f %5.1f%% %10.2f'):format(r.op, r.calls, r.bytes / 1e9, 100 * r.bytes / total,
    r.bytes / cfg.bandwidth * 1e3))
end
print(('%-26s %7s %10.3f %5.1f%% %10.2f'):format('all', '', total / 1e9, 100, total / cfg.bandwidth * 1e3))
print(('FLOPs counted: %.1f TFLOP (the GEMMs and attention: %.1f ms at 989 TFLOP/s)')
  :format(flops / 1e12, flops / 989e12 * 1e3))

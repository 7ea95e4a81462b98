-- fsdp.plan.steps: what the planner's model profiles (fsdp.plan.models,
-- fsdp.plan.families) share: dtype sizes, class tests by name, the f32
-- staging of low-precision products on devices that compute them in f32,
-- a linear layer's backward step, and the families' own FLOP formulas.
local M = {}

local F32, I64 = 4, 8

-- A function of a model family's file (models/<family>.lua), if it loads:
-- the planner uses the families' own FLOP formulas.
local function family_fn(module, name)
  local ok, mod = pcall(require, module)
  return ok and type(mod) == 'table' and mod[name] or nil
end

-- Whether module m is an instance of a class called `name` (subclasses
-- count: the chain of `super` classes, as Module:is_instance_of walks it).
local function is_a(m, name)
  local cls = getmetatable(m)
  while type(cls) == 'table' do
    if rawget(cls, '__name') == name then return true end
    cls = rawget(cls, 'super')
  end
  return false
end

-- f32 copies a product makes of its operands and output when the device
-- computes low precision in f32 (the CPU backend: OpenBLAS has no bf16
-- GEMM): m x k times k x n.
local function staging(ctx, m, n, k)
  if not ctx.f32_gemm or ctx.s == F32 then return 0 end
  return (m * k + k * n + m * n) * F32
end

-- Backward of a linear y = x W^T (x saved by it): dx and dW (each product
-- with its staging, one after the other).
local function linear_step(N, din, dout, ctx, free)
  return { a = N * din * ctx.s, w = din * dout * ctx.ps, f = free or 0, t = staging(ctx, N, din, dout) }
end

M.F32, M.I64 = F32, I64
M.family_fn, M.is_a, M.staging, M.linear_step = family_fn, is_a, staging, linear_step
return M

-- fsdp.testing: helpers for tests of ops, models and scripts.
--
-- gradcheck compares the gradients autograd computes with central finite
-- differences, in f64 on small inputs: the check every op's backward gets.
-- Per-element Lua loops are fine here (tests, tiny tensors), never in ops.
-- sh / run_script / capture_stdout / tmpdir are what the specs that drive
-- the executable or read printed output share.
local fsdp = require 'fsdp'
local Tensor = require 'fsdp.tensor'
local host = require 'fsdp.host'
local files = require 'fsdp.io.files'

local M = {}

-- Flat read/write of element i (0-based, row-major) of a contiguous tensor.
local function flat(t) return t:contiguous():view(-1) end

-- The scalar sum(fn(inputs) * weights): weighting by fixed random values
-- makes every output element matter with a different coefficient.
local function weighted_sum(fn, inputs, weights)
  local outs = { fn(unpack(inputs)) }
  local total
  for k, out in ipairs(outs) do
    if Tensor.is_tensor(out) and out:is_floating_point() then
      local w = weights[k]
      if not w then
        w = fsdp.randn(out.shape, { seed = 1234, stream = k, dtype = out.dtype })
        weights[k] = w
      end
      local s = (out * w):sum_to({})
      total = total and total + s or s
    end
  end
  return total
end

-- gradcheck(fn, inputs, opts): inputs is an array of tensors (f64 for
-- precision) and other values; tensors that require grad are checked.
-- opts: eps (1e-6), atol (1e-5), rtol (1e-4). Returns true, or false and a
-- message naming the input, element, and both values.
function M.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-4
  local weights = {}
  for _, x in ipairs(inputs) do
    if Tensor.is_tensor(x) then x.grad = nil end
  end
  local loss = weighted_sum(fn, inputs, weights)
  loss:backward()
  for idx, x in ipairs(inputs) do
    if Tensor.is_tensor(x) and x.requires_grad then
      local analytic = x.grad and flat(x.grad):to('f64') or fsdp.zeros(x:numel(), { dtype = 'f64' })
      local data = flat(x:detach())
      assert(data:storage_offset() == x:detach():storage_offset() and x:is_contiguous(),
             'gradcheck: inputs must be contiguous')
      for i = 0, x:numel() - 1 do
        local orig = data:get(i)
        data:set(orig + eps, i)
        local plus = fsdp.no_grad(weighted_sum, fn, inputs, weights):item()
        data:set(orig - eps, i)
        local minus = fsdp.no_grad(weighted_sum, fn, inputs, weights):item()
        data:set(orig, i)
        local numeric = (plus - minus) / (2 * eps)
        local got = analytic:get(i)
        if math.abs(got - numeric) > atol + rtol * math.abs(numeric) then
          return false, ('gradcheck: input %d element %d: autograd %.10g, finite difference %.10g')
            :format(idx, i, got, numeric)
        end
      end
    end
  end
  return true
end

-- Max |a - b| over all elements (as f64, 0 for empty tensors), for
-- comparing tensors in tests; reduced by the core, as normalised_error.
function M.max_abs_diff(a, b)
  local d = (a:to('f64') - b:to('f64')):abs()
  if d:numel() == 0 then return 0 end
  return fsdp.F.max(flat(d), 0):item()
end

-- Whether cuDNN's fused attention is offered a backward with Tk keys
-- (core/cuda/cuda_sdpa.cu, layout_refusal): the cuDNN loaded at run time
-- must be 9.16 or newer unless Tk is a multiple of 128 (older ones need a
-- padding mask there). The GPU specs expect paths by this rule; an H100
-- machine whose system cuDNN was older than its PyTorch's showed why.
function M.cudnn_takes_backward(Tk)
  local v = fsdp.cuda.library_version('cudnn') or 0
  return v >= 91600 or Tk % 128 == 0
end

-- max |got - want| / max |want|, both taken to f64 on the CPU: the error
-- measure of the backend comparisons, tolerant of where the largest values
-- are. Shapes must agree.
function M.normalised_error(got, want)
  local g, w = got:to('cpu'):to('f64'), want:to('cpu'):to('f64')
  if table.concat(g.shape, 'x') ~= table.concat(w.shape, 'x') then
    error(('normalised_error: shapes %s and %s differ'):format(table.concat(g.shape, 'x'),
      table.concat(w.shape, 'x')), 2)
  end
  local F = fsdp.F
  local scale = F.max(F.abs(w):view(-1), 0):item()
  local diff = F.max(F.abs(g - w):view(-1), 0):item()
  return diff / math.max(scale, 1e-30)
end

-- Shell quoting for one argument (fsdp.quote.shell).
M.quote = require('fsdp.quote').shell

-- Run a shell command from the project root; returns its output (stdout
-- and stderr together) and exit status.
function M.sh(cmd)
  local p = assert(io.popen(('cd %s && (%s) 2>&1; echo "@rc=$?"'):format(M.quote(host.root), cmd)))
  local out = p:read('*a')
  p:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  return body, tonumber(rc)
end

-- Run a script of the project (e.g. 'recipes/mnist.lua') with the
-- executable under test, bounded in time: output and exit status.
function M.run_script(script, args, seconds)
  return M.sh(('timeout %d %s %s %s'):format(seconds or 120, M.quote(host.exe), script, args or ''))
end

-- Run the executable under test with `args` (shell words) from the
-- project root, bounded in time: exit status, stdout and stderr apart
-- (for specs that check which stream a message went to).
function M.run_exe(args, seconds)
  local err = os.tmpname()
  local p = assert(io.popen(('cd %s && timeout %d %s %s 2>%s; echo "@rc=$?"'):format(M.quote(host.root),
    seconds or 120, M.quote(host.exe), args, M.quote(err))))
  local out = p:read('*a')
  p:close()
  local stdout, rc = out:match('^(.-)@rc=(%d+)\n?$')
  local stderr = files.read(err) or ''
  os.remove(err)
  return tonumber(rc), stdout, stderr
end

-- What fn prints to io.stdout (io.write and print through it), as a string.
function M.capture_stdout(fn)
  local saved, chunks = io.stdout, {}
  io.stdout = { write = function(self, ...)
    for i = 1, select('#', ...) do chunks[#chunks + 1] = tostring((select(i, ...))) end
    return self
  end, flush = function() end }
  local ok, err = pcall(fn)
  io.stdout = saved
  assert(ok, err)
  return table.concat(chunks)
end

-- A fresh empty directory.
function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(require('lfs').mkdir(d))
  return d
end

-- fn() must fail with a message containing `text` (plain, not a pattern);
-- fails the test otherwise, showing the message it got.
function M.raises(fn, text)
  local ok, err = pcall(fn)
  if ok then error('expected an error containing ' .. text, 2) end
  err = tostring(err)
  if not err:find(text, 1, true) then error(('expected an error containing %q, got: %s'):format(text, err), 2) end
end

return M

-- tests/mpi/ckpt_tensors.lua: what the non-finite guard's tests check in a
-- sharded checkpoint on disk (tests/mpi/nonfinite.sh, nonfinite_spec.lua).
--
--   fsdp-lua tests/mpi/ckpt_tensors.lua finite STEP_DIR
--       every tensor of every rank file is finite: prints "finite N tensors"
--   fsdp-lua tests/mpi/ckpt_tensors.lua same STEP_DIR_A STEP_DIR_B
--       the two steps hold the same tensors with identical values
--       (parameters and optimizer state): prints "same N tensors"
-- Anything else exits 1 naming the file and tensor.
local fsdp = require 'fsdp'
local st = require 'fsdp.io.safetensors'
local files = require 'fsdp.io.files'
local F = fsdp.F

local function fail(fmt, ...)
  io.stderr:write('ckpt_tensors: ', fmt:format(...), '\n')
  os.exit(1)
end

-- file name -> {tensor name -> tensor} of a step directory's rank files.
local function tensors_of(dir)
  local out, n = {}, 0
  for _, name in ipairs(files.list(dir)) do
    if name:match('%.safetensors$') then
      out[name] = (st.load(files.join(dir, name)))
      n = n + 1
    end
  end
  if n == 0 then fail('%s holds no rank file', dir) end
  return out
end

local cmd, a, b = ...
if cmd == 'finite' then
  local count = 0
  for file, ts in pairs(tensors_of(a)) do
    for name, t in pairs(ts) do
      if t:numel() > 0 and t:is_floating_point() then
        local s = t:to('f64'):abs():sum():item()
        if s ~= s or s == math.huge then fail('%s/%s: tensor %s is not finite (sum of |x| = %s)', a, file, name, s) end
      end
      count = count + 1
    end
  end
  print(('finite %d tensors'):format(count))
elseif cmd == 'same' then
  local ta, tb, count = tensors_of(a), tensors_of(b), 0
  for file, ts in pairs(ta) do
    local other = tb[file] or fail('%s has no %s', b, file)
    for name, t in pairs(ts) do
      local u = other[name] or fail('%s/%s has no tensor %s', b, file, name)
      if t:numel() ~= u:numel() then fail('%s: %s has %d elements in %s, %d in %s', file, name, t:numel(), a, u:numel(), b) end
      if t:numel() > 0 then
        local differ = F.ne(t:view(-1), u:view(-1)):to('i64'):sum():item()
        if differ > 0 then fail('%s: %s differs in %d of %d elements between %s and %s', file, name, differ, t:numel(), a, b) end
      end
      count = count + 1
    end
  end
  print(('same %d tensors'):format(count))
else
  fail('usage: ckpt_tensors.lua finite STEP_DIR | same STEP_DIR_A STEP_DIR_B')
end

-- fsdp.checkpointing.full: the full state dict of a sharded model written
-- as one safetensors file with Hugging Face names, streamed unit by unit.
--
--   ckpt.save_full_state_dict('out/model.safetensors', model)   -- collective
--   fsdp.load_safetensors_into(model2, 'out/model.safetensors')  -- loads into shards
--
-- PyTorch's rank0_only + offload_to_cpu save gathers every unit and keeps
-- the whole model on rank 0 before writing it. Here rank 0 declares every
-- tensor first (names, shapes, dtypes are known from the units without
-- gathering), which fixes the header and every tensor's offset; then each
-- unit is gathered (fsdp.sharding.each_full_unit), its parameters appended
-- to the file and the gathered buffer freed before the next unit. No rank
-- ever holds more than one unit whole; the file appears atomically at the
-- end (the core's safetensors writer: temporary file, fsync, rename). A
-- tensor-parallel model's file holds the logical tensors, each TP slice
-- gathered over its TP group (fsdp.sharding.each_full_unit): the file of
-- the same model trained without TP.
local core = require 'fsdp.core'
local factories = require 'fsdp.factories'
local dist = require 'fsdp.dist'
local Tensor = require 'fsdp.tensor'
local sharding = require 'fsdp.sharding'
local autograd = require 'fsdp.autograd'
local safetensors = require 'fsdp.io.safetensors'
local C = core.C

local M = {}

-- Persistent buffers by name (state_dict entries that are not parameters).
local function buffers(model)
  local is_param = {}
  for _, p in ipairs(model:parameters()) do is_param[p] = true end
  local own, keys = model:state_dict()
  local out = {}
  for _, key in ipairs(keys) do
    if not is_param[own[key]] then out[#out + 1] = { key, own[key] } end
  end
  return out
end

local shape_buf = core.ffi.new('int64_t[?]', C.FL_MAX_DIMS)
local function declare(w, name, dtype, shape)
  for d, s in ipairs(shape) do shape_buf[d - 1] = s end
  core.check(C.fl_safetensors_writer_declare(w, name, core.dtype(dtype), #shape, shape_buf))
end

-- Write the whole parameters (and persistent buffers) of `model` to `path`
-- on rank 0. Collective on a sharded model: every rank calls it. opts:
-- dtype (convert floating-point tensors, e.g. 'bf16' for export; default
-- the master dtype), metadata (string map; default {format = 'pt'}, which
-- transformers requires), checksum (default true: the data's checksum in
-- the metadata, verified by our loaders, ignored by others), finite
-- (refuse NaN/inf, naming the tensor; default false: buffers such as
-- masks may hold infinities). Returns path.
function M.save_full_state_dict(path, model, opts)
  opts = opts or {}
  if type(path) ~= 'string' or path == '' then core.fail('save_full_state_dict: path must be a file name') end
  local S = rawget(model, '_fsdp')
  local rank0 = dist.rank() == 0
  if not S then
    -- Not sharded: every rank holds the model already (a TP model its
    -- slices, gathered into the logical tensors: collective); rank 0 writes it.
    local tps = rawget(model, '_tp')
    local list = {}
    for _, np in ipairs(model:named_parameters()) do
      local tp, t = tps and tps.size > 1 and rawget(np[2], 'tp'), np[2]
      if tp then t = autograd.no_grad(function() return sharding.logical(np[2], tp, tps.group) end) end
      list[#list + 1] = { np[1], t }
    end
    if rank0 then
      for _, nb in ipairs(buffers(model)) do list[#list + 1] = nb end
      if opts.dtype then
        for i, e in ipairs(list) do
          if e[2]:is_floating_point() then list[i] = { e[1], e[2]:to({ dtype = opts.dtype }) } end
        end
      end
      safetensors.save(path, list, opts.metadata or { format = 'pt' },
        { checksum = opts.checksum ~= false, finite = opts.finite })
    end
    if dist.world_size() > 1 then dist.barrier() end
    return path
  end
  local function dtype_of(d) return (opts.dtype and core.dtype_is_float(core.dtype(d))) and opts.dtype or d end
  local w, failed = nil, nil
  local function try(fn)
    if rank0 and not failed then
      local ok, err = pcall(fn)
      if not ok then failed = err end
    end
  end
  local bufs = buffers(model)
  try(function()
    w = C.fl_safetensors_writer_new(path)
    if w == nil then core.raise() end
    for _, u in ipairs(S.units) do
      for _, p in ipairs(u.params) do declare(w, p.name, dtype_of(u.master_dtype), sharding.full_shape(p)) end
    end
    for _, nb in ipairs(bufs) do declare(w, nb[1], dtype_of(nb[2].dtype), nb[2].shape) end
    for k, v in pairs(opts.metadata or { format = 'pt' }) do
      core.check(C.fl_safetensors_writer_metadata(w, tostring(k), tostring(v)))
    end
    if opts.checksum ~= false then core.check(C.fl_safetensors_writer_checksum(w)) end
    if opts.finite then core.check(C.fl_safetensors_writer_finite(w, true)) end
  end)
  -- Every rank takes part in every gather, even after rank 0 failed, so
  -- no rank is left waiting in a collective.
  sharding.each_full_unit(model, function(u, by)
    try(function()
      for _, p in ipairs(u.params) do
        local t = by[p]
        if opts.dtype and t:is_floating_point() and t.dtype ~= opts.dtype then
          local converted = t:to({ dtype = opts.dtype })
          core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(converted)))
          converted:free()
        else
          core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(t)))
        end
      end
    end)
  end)
  try(function()
    for _, nb in ipairs(bufs) do
      local t = nb[2]
      if opts.dtype and t:is_floating_point() then t = t:to({ dtype = opts.dtype }) end
      core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(t)))
    end
    core.check(C.fl_safetensors_writer_finish(w))
  end)
  if w ~= nil then C.fl_safetensors_writer_free(w) end
  if dist.world_size() > 1 then
    local flag = factories.tensor({ failed and 1 or 0 }, { dtype = 'i32' })
    dist.broadcast(flag, 0)
    if flag:item() ~= 0 and not rank0 then
      core.fail(('save_full_state_dict: rank 0 could not write %s (see its error)'):format(path))
    end
  end
  if failed then error(failed, 0) end
  return path
end

return M

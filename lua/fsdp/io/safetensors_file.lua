-- fsdp.io.safetensors_file: load and save one safetensors file (the C
-- reader maps the file and validates it; tensors are views of the
-- mapping). Users reach it through fsdp.io.safetensors, which adds the
-- multi-file checkpoints (fsdp.io.safetensors_sharded, built on this file).
--
--   local st = require 'fsdp.io.safetensors'
--   local tensors, names, meta = st.load('model.safetensors')
--   st.save('out.safetensors', {['w'] = w, ['b'] = b}, {format = 'pt'}, {checksum = true})
--   local f = st.open(path); f:info(name); f:get(name); f:verify(); f:close()
--
-- A file written with checksum = true records an XXH3-64 checksum of its
-- tensor data in the metadata (fsdp_checksum; other readers such as
-- Hugging Face's ignore it). load() and the multi-file loaders verify it
-- when present and refuse a damaged file, naming it; open() stays lazy
-- (verify() on demand).
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local ffi, C = core.ffi, core.C

local M = {}

local File = {}
File.__index = File

-- A lazily read file: nothing but the header is touched until :get.
function M.open(path)
  local h = C.fl_safetensors_open(path)
  if h == nil then core.raise() end
  return setmetatable({ _h = ffi.gc(h, C.fl_safetensors_close), path = path }, File)
end

function File:names()
  local out = {}
  for i = 0, C.fl_safetensors_count(self._h) - 1 do
    out[#out + 1] = ffi.string(C.fl_safetensors_name(self._h, i))
  end
  return out
end

-- Whether the file holds a tensor of that name.
function File:has(name)
  return C.fl_safetensors_find(self._h, name) >= 0
end

local function index_of(self, name)
  local i = C.fl_safetensors_find(self._h, name)
  if i < 0 then core.fail(('%s: no tensor named %s'):format(self.path, name)) end
  return i
end

local info_dtype = ffi.new('fl_dtype[1]')
local info_ndim = ffi.new('int[1]')
local info_shape = ffi.new('int64_t[?]', C.FL_MAX_DIMS)

-- {dtype = 'bf16', shape = {4096, 4096}} without reading the data.
function File:info(name)
  core.check(C.fl_safetensors_info(self._h, index_of(self, name), info_dtype, info_ndim, info_shape))
  local shape = {}
  for d = 0, info_ndim[0] - 1 do shape[d + 1] = tonumber(info_shape[d]) end
  return { dtype = core.dtype_name(info_dtype[0]), shape = shape }
end

-- The tensor (a CPU view of the mapped file; clone it to modify it).
function File:get(name)
  return Tensor.wrap(C.fl_safetensors_get(self._h, index_of(self, name)))
end

-- Recompute the checksum of the data and compare it with the recorded
-- one; raises naming the file when they differ. Returns whether the file
-- had a checksum to verify.
local verify_checked = ffi.new('bool[1]')
function File:verify()
  core.check(C.fl_safetensors_verify(self._h, verify_checked))
  return verify_checked[0]
end

function File:metadata()
  local meta = {}
  for k = 0, C.fl_safetensors_metadata_count(self._h) - 1 do
    local key = ffi.string(C.fl_safetensors_metadata_key(self._h, k))
    meta[key] = ffi.string(C.fl_safetensors_metadata(self._h, key))
  end
  return meta
end

function File:close()
  C.fl_safetensors_close(ffi.gc(self._h, nil))
  self._h = nil
end

-- All tensors: returns name -> Tensor, the names in file order, metadata.
function M.load(path)
  local f = M.open(path)
  local ok, err = pcall(f.verify, f)
  if not ok then
    f:close()
    error(err, 0)
  end
  local tensors, names = {}, f:names()
  for _, name in ipairs(names) do tensors[name] = f:get(name) end
  local meta = f:metadata()
  f:close()
  return tensors, names, meta
end

-- Save name -> Tensor (written in sorted name order) or an array of
-- {name, tensor} pairs (written in that order), with string metadata.
-- opts: checksum (record the data's checksum, verified by load), finite
-- (refuse a NaN or infinity, naming the tensor).
function M.save(path, tensors, metadata, opts)
  opts = opts or {}
  local pairs_list = {}
  if tensors[1] ~= nil then
    pairs_list = tensors
  else
    local names = {}
    for name in pairs(tensors) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do pairs_list[#pairs_list + 1] = { name, tensors[name] } end
  end
  local w = C.fl_safetensors_writer_new(path)
  if w == nil then core.raise() end
  local ok, err = pcall(function()
    for _, p in ipairs(pairs_list) do
      local c = Tensor.cptr(p[2])
      core.check(C.fl_safetensors_writer_declare(w, p[1], c.dtype, c.ndim, c.shape))
    end
    for k, v in pairs(metadata or {}) do
      core.check(C.fl_safetensors_writer_metadata(w, tostring(k), tostring(v)))
    end
    if opts.checksum then core.check(C.fl_safetensors_writer_checksum(w)) end
    if opts.finite then core.check(C.fl_safetensors_writer_finite(w, true)) end
    for _, p in ipairs(pairs_list) do core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(p[2]))) end
    core.check(C.fl_safetensors_writer_finish(w))
  end)
  -- Freeing at once (not at garbage collection) removes the temporary
  -- file of a failed write before the error reaches the caller.
  C.fl_safetensors_writer_free(w)
  if not ok then error(err, 0) end
end

return M

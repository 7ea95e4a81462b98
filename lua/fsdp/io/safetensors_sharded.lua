-- fsdp.io.safetensors_sharded: checkpoints in several safetensors files, the
-- way Hugging Face ships large models: a directory of
-- model-00001-of-0000N.safetensors files and model.safetensors.index.json,
-- whose "weight_map" names the file holding each tensor.
--
--   local st = require 'fsdp.io.safetensors'
--   local ck = st.open_checkpoint('llama-dir')  -- a directory, an index, or one file
--   ck:names(); ck:info(name); ck:get(name); ck:files()
--   st.load_into(model, 'llama-dir')           -- file by file into the model
--   st.save_sharded('out-dir', model:state_dict(), {max_shard_size = '2GB'})
--
-- Loading into a model streams: each file is mapped, copied into the
-- parameters and released before the next is opened, so only one file's
-- pages are ever touched at once. Everything is validated before the first
-- copy (the index, that every file exists and holds what the index says,
-- names and shapes against the model), so a broken checkpoint never leaves
-- a model half loaded.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Tensor = require 'fsdp.tensor'
local cjson = require 'cjson'
local files = require 'fsdp.io.files'
local publish = require 'fsdp.io.publish'
local st_file = require 'fsdp.io.safetensors_file'
local autograd = require 'fsdp.autograd'
local tables = require 'fsdp.tables'

local M = {}

M.INDEX_NAME = 'model.safetensors.index.json'
M.SINGLE_NAME = 'model.safetensors'

-- The single-file reader and writer.
local function st() return st_file end
-- The progress bars of long loads and saves (fsdp.observe.progress, which
-- brings fsdp.dist and the console).
local function progress()
  return require 'fsdp.observe.progress' -- lazy: start-up (require 'fsdp' loads this file, not the bars)
end

local mode, join = files.mode, files.join

local function dirname(path)
  local d = path:match('^(.*)/[^/]*$')
  if d == nil then return '.' end
  return d == '' and '/' or d
end

local sorted = tables.sorted_keys

-- reading -------------------------------------------------------------------------------

local Checkpoint = {}
Checkpoint.__index = Checkpoint

-- The index's weight_map as name -> file path, validated: a JSON object
-- whose "weight_map" maps names to plain file names in the index's
-- directory (no paths: a checkpoint never points outside itself).
local function read_index(path)
  local text, err = files.read(path, files.LIMITS.text[1], 'a safetensors index')
  if not text then core.fail('safetensors: cannot read the index: ' .. err) end
  local ok, doc = pcall(cjson.decode, text)
  if not ok then
    core.fail(('safetensors: index %s is not valid JSON (%s)'):format(path, tostring(doc):gsub('^.-: ', '')))
  end
  if type(doc) ~= 'table' or type(doc.weight_map) ~= 'table' then
    core.fail(('safetensors: index %s has no "weight_map" object'):format(path))
  end
  local dir, map = dirname(path), {}
  for name, file in pairs(doc.weight_map) do
    if type(name) ~= 'string' or type(file) ~= 'string' or file == '' or file:find('/', 1, true)
        or file == '.' or file == '..' then
      core.fail(('safetensors: index %s: weight_map entry %s -> %s must name a file in the index\'s directory')
        :format(path, tostring(name), tostring(file)))
    end
    map[name] = join(dir, file)
  end
  local meta = {}
  if type(doc.metadata) == 'table' then
    for k, v in pairs(doc.metadata) do meta[k] = v end
  end
  return map, meta
end

-- name -> path for the tensors of `paths` (safetensors files), from their
-- headers; a name in two files is an error.
local function map_files(paths)
  local map, meta = {}, {}
  for _, path in ipairs(paths) do
    local f = st().open(path)
    for _, name in ipairs(f:names()) do
      if map[name] then
        core.fail(('safetensors: tensor %s is in both %s and %s'):format(name, map[name], path))
      end
      map[name] = path
    end
    if #paths == 1 then meta = f:metadata() end
    f:close()
  end
  return map, meta
end

-- A regular file at p (true), nothing (false), or a FIFO, a device or a
-- directory where a file belongs: refused naming it, never read.
local function is_file(p)
  local ok, is = pcall(files.is_file, p)
  if not ok then core.fail('safetensors: ' .. is) end
  return is
end

-- Open a checkpoint: `path` is one .safetensors file, an index JSON file,
-- or a directory holding model.safetensors, model.safetensors.index.json,
-- or (neither) some *.safetensors files, taken together. Every file is
-- checked here: it exists, is a valid safetensors file, and holds the
-- tensors the index assigns to it.
function M.open_checkpoint(path)
  if type(path) ~= 'string' then core.fail('safetensors: a checkpoint path must be a string') end
  local m = mode(path)
  if m == nil then
    core.fail(('safetensors: %s: no such file or directory%s'):format(path, publish.missing_hint(path)))
  end
  -- An export of ours that is unfinished or mixes two exports is refused
  -- before any file is read ([Note: exports are published whole]).
  if m == 'directory' then publish.check(path) elseif path:match('%.json$') then publish.check(dirname(path)) end
  local map, meta, index
  if m == 'directory' then
    if is_file(join(path, M.SINGLE_NAME)) then
      map, meta = map_files({ join(path, M.SINGLE_NAME) })
    elseif is_file(join(path, M.INDEX_NAME)) then
      index = join(path, M.INDEX_NAME)
    else
      local found = {}
      for _, name in ipairs(files.list(path)) do
        if name:match('%.safetensors$') then found[#found + 1] = join(path, name) end
      end
      if #found == 0 then
        core.fail(('safetensors: %s holds neither %s, %s nor any .safetensors file')
          :format(path, M.SINGLE_NAME, M.INDEX_NAME))
      end
      map, meta = map_files(found)
    end
  elseif path:match('%.json$') then
    index = path
  else
    map, meta = map_files({ path })
  end
  if index then
    map, meta = read_index(index)
    -- Each file once: it exists and holds what the index says it does.
    local by_file = {}
    for name, file in pairs(map) do
      by_file[file] = by_file[file] or {}
      table.insert(by_file[file], name)
    end
    for _, file in ipairs(sorted(by_file)) do
      if not is_file(file) then
        core.fail(('safetensors: index %s assigns %d tensors (%s, ...) to %s, which does not exist')
          :format(index, #by_file[file], by_file[file][1], file))
      end
      local f = st().open(file)
      for _, name in ipairs(by_file[file]) do
        if not f:has(name) then
          f:close()
          core.fail(('safetensors: index %s puts tensor %s in %s, which has no tensor of that name')
            :format(index, name, file))
        end
      end
      f:close()
    end
  end
  local files = {}
  for _, file in pairs(map) do files[file] = true end
  return setmetatable({ path = path, index = index, map = map, metadata = meta, _files = sorted(files) },
    Checkpoint)
end

-- The tensor names, sorted.
function Checkpoint:names() return sorted(self.map) end

-- The files, sorted (the order loads go in).
function Checkpoint:files() return self._files end

-- The file holding `name`.
function Checkpoint:file_of(name)
  local file = self.map[name]
  if not file then core.fail(('safetensors: %s: no tensor named %s'):format(self.path, name)) end
  return file
end

-- f:<method>(name) on the file that holds name, opened for it alone.
local function from_file_of(self, method, name)
  local f = st().open(self:file_of(name))
  local v = f[method](f, name)
  f:close()
  return v
end

function Checkpoint:info(name) return from_file_of(self, 'info', name) end

-- One tensor (a view of its file's mapping, which lives as long as it does).
function Checkpoint:get(name) return from_file_of(self, 'get', name) end

-- Iterate file by file: `for path, tensors in ck:each_file() do ... end`
-- with tensors the name -> Tensor views of that file's share of the
-- checkpoint. The previous file's views are freed before the next file
-- is mapped, so keep (clone) what must outlive the step.
function Checkpoint:each_file()
  local i, previous = 0, nil
  local by_file = {}
  for name, file in pairs(self.map) do
    by_file[file] = by_file[file] or {}
    table.insert(by_file[file], name)
  end
  return function()
    if previous then
      for _, t in pairs(previous) do t:free() end
      previous = nil
    end
    i = i + 1
    local file = self._files[i]
    if not file then return nil end
    local f = st().open(file)
    local ok, err = pcall(f.verify, f) -- a recorded checksum must hold before anything is copied
    if not ok then
      f:close()
      error(err, 0)
    end
    local tensors = {}
    for _, name in ipairs(by_file[file]) do tensors[name] = f:get(name) end
    f:close()
    previous = tensors
    return file, tensors
  end
end

-- Every tensor at once: name -> Tensor, the sorted names, the metadata
-- (the index's, or the single file's).
function M.load_dir(path)
  local ck = M.open_checkpoint(path)
  local tensors = {}
  for _, file in ipairs(ck._files) do
    local f = st().open(file)
    local ok, err = pcall(f.verify, f)
    if not ok then
      f:close()
      error(err, 0)
    end
    for name, owner in pairs(ck.map) do
      if owner == file then tensors[name] = f:get(name) end
    end
    f:close()
  end
  return tensors, ck:names(), ck.metadata
end

-- Load a checkpoint (any form open_checkpoint takes) into `model`'s
-- parameters and buffers, one file at a time. A model may declare other
-- names for its tensors in `state_dict_aliases` (name in the checkpoint ->
-- its own name; T5's encoder.embed_tokens.weight is shared.weight). With
-- strict (the default) a missing or unexpected name is an error; shapes
-- must always match. Both are checked from the headers before anything is
-- copied. opts.allow_missing(name): names the file need not have (new
-- LoRA adapters on a pretrained base). A model that stores a parameter
-- in pieces (checkpoint_piece: [Note: checkpoint pieces] in
-- models/decoder_parts.lua) has them copied into place. Returns the
-- missing and unexpected names.
function M.load_into(model, path, opts)
  opts = opts or {}
  local strict = opts.strict ~= false
  local ck = M.open_checkpoint(path)
  local own, keys = model:state_dict()
  local aliases = model.state_dict_aliases or {}
  -- Tensors stored in pieces ([Note: checkpoint pieces] in
  -- models/decoder_parts.lua): name -> {dst, offset}; a parameter is
  -- covered when its pieces add up to all of its elements.
  local piece_of = model.checkpoint_piece
  local pieces, piece_elems = {}, {}
  local covered, unexpected = {}, {}
  local total_bytes = 0
  for _, name in ipairs(ck:names()) do
    local key = own[name] and name or aliases[name]
    local dst = key and own[key]
    local info = ck:info(name)
    local shape = info.shape
    local numel = 1
    for _, d in ipairs(shape) do numel = numel * d end
    total_bytes = total_bytes + numel * tonumber(core.C.fl_dtype_size(core.dtype(info.dtype)))
    if dst == nil and piece_of then
      local pkey, offset, pshape = piece_of(model, name)
      local pdst = pkey and own[pkey]
      if pdst ~= nil then
        if core.format_shape(shape) ~= core.format_shape(pshape) then
          core.fail(('load_into: size mismatch for %s: %s has %s, the model %s (its part of %s)')
            :format(name, ck:file_of(name), core.format_shape(shape), core.format_shape(pshape), pkey))
        end
        pieces[name] = { pdst, offset }
        local n = 1
        for _, d in ipairs(shape) do n = n * d end
        piece_elems[pdst] = (piece_elems[pdst] or 0) + n
      end
    end
    if pieces[name] then -- (counted above)
    elseif dst == nil then
      unexpected[#unexpected + 1] = name
    else
      if rawget(dst, 'tp') then
        core.fail(('load_into: %s is tensor-parallel (fsdp.tp); loading checkpoints into a TP model is not '
          .. 'supported yet: load before tp.parallelize, or train from init'):format(name))
      end
      local want = rawget(dst, 'fsdp_shape') or dst.shape -- a sharded model's whole shape
      if core.format_shape(shape) ~= core.format_shape(want) then
        core.fail(('load_into: size mismatch for %s: %s has %s, the model %s')
          :format(name, ck:file_of(name), core.format_shape(shape), core.format_shape(want)))
      end
      covered[dst] = true
    end
  end
  for dst, n in pairs(piece_elems) do
    local whole = 1
    for _, d in ipairs(rawget(dst, 'fsdp_shape') or dst.shape) do whole = whole * d end
    if n == whole then covered[dst] = true end
  end
  local missing = {}
  for _, key in ipairs(keys) do
    if not covered[own[key]] and not (opts.allow_missing and opts.allow_missing(key)) then
      missing[#missing + 1] = key
    end
  end
  if strict and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = 'missing keys: ' .. table.concat(missing, ', ') end
    if #unexpected > 0 then parts[#parts + 1] = 'unexpected keys: ' .. table.concat(unexpected, ', ') end
    core.fail(('load_into: %s does not fit the model: %s'):format(path, table.concat(parts, '; ')))
  end
  -- one update per file (fsdp.observe.progress)
  local bar = progress().start('loading ' .. path, { total = total_bytes, unit = 'B' })
  local ok, err = pcall(function()
    for _, tensors in ck:each_file() do
      model:load_state_dict(tensors, { strict = false })
      local bytes = 0
      for name, t in pairs(tensors) do
        local p = pieces[name]
        if p then M.copy_piece(p[1], t, p[2]) end
        bytes = bytes + t:numel() * t:element_size()
      end
      bar:add(bytes)
    end
  end)
  bar:finish(not ok and 'failed' or nil)
  if not ok then error(err, 0) end
  return missing, unexpected
end

-- Copy src into elements [offset, offset + src:numel()) of the parameter
-- whose tensor (or, sharded, whose shard segment: elements fsdp_offset ...
-- of the whole) is dst: only the part dst holds.
function M.copy_piece(dst, src, offset)
  local n = src:numel()
  local seg = rawget(dst, 'fsdp_offset') or 0
  local lo, hi = math.max(offset, seg), math.min(offset + n, seg + dst:numel())
  if lo >= hi then return end
  autograd.no_grad(function()
    dst:view(-1):narrow(0, lo - seg, hi - lo):copy_(src:reshape(-1):narrow(0, lo - offset, hi - lo))
  end)
end

-- writing -------------------------------------------------------------------------------

local UNITS = { B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KIB = 2^10, MIB = 2^20, GIB = 2^30, TIB = 2^40 }

-- Bytes from a number or a string as Hugging Face writes sizes: '5GB'
-- (10^9), '500MiB' (2^20), '2048'.
function M.parse_size(v, what)
  what = what or 'max_shard_size'
  local n = nil
  if type(v) == 'number' then
    n = v
  elseif type(v) == 'string' then
    local num, unit = v:upper():match('^%s*([%d.]+)%s*(%a*)%s*$')
    local scale = num and (unit == '' and 1 or UNITS[unit])
    if scale and tonumber(num) then n = tonumber(num) * scale end
  end
  if not n or validate.problem(n, validate.POSITIVE) then
    core.fail(('safetensors: %s must be a positive size in bytes or a string such as "5GB" or "500MiB", got %s')
      :format(what, tostring(v)))
  end
  return math.floor(n)
end

local function mkdir_p(dir) files.mkdir_p(dir, 'safetensors') end

-- Text published atomically (temporary file, fsync, rename: fsdp.files).
local write_atomic = files.write_atomic

-- HF's index layout: total size in metadata (and the export id of the
-- files beside it, when given), weight_map sorted by name.
local function index_json(total, map, id)
  local lines = { '{', '  "metadata": {', ('    "total_size": %d'):format(total) }
  if id then
    lines[#lines] = lines[#lines] .. ','
    lines[#lines + 1] = ('    %s: %s'):format(cjson.encode(publish.ID_KEY), cjson.encode(id))
  end
  lines[#lines + 1] = '  },'
  lines[#lines + 1] = '  "weight_map": {'
  local names = sorted(map)
  for i, name in ipairs(names) do
    lines[#lines + 1] = ('    %s: %s%s'):format(cjson.encode(name), cjson.encode(map[name]), i < #names and ',' or '')
  end
  lines[#lines + 1] = '  }'
  lines[#lines + 1] = '}'
  return table.concat(lines, '\n') .. '\n'
end

-- The files of a sharded save: entries {name, bytes} in their order,
-- consecutive ones filling a file until the next would take it past max
-- bytes (an entry larger than that gets a file of its own). Returns
-- {file name, {entries}} per file: model.safetensors alone, else
-- model-0000i-of-0000N.safetensors; and the total bytes.
local function plan_files(entries, max)
  local shards, size, total = {}, math.huge, 0
  for _, e in ipairs(entries) do
    if size + e[2] > max then
      shards[#shards + 1] = {}
      size = 0
    end
    table.insert(shards[#shards], e)
    size, total = size + e[2], total + e[2]
  end
  if #shards == 0 then shards[1] = {} end
  local out = {}
  for i, shard in ipairs(shards) do
    out[i] = { #shards == 1 and M.SINGLE_NAME or ('model-%05d-of-%05d.safetensors'):format(i, #shards), shard }
  end
  return out, total
end

-- After a save wrote `written` (file names) in dir: the index when there
-- are several. dir is a publication's fresh directory (fsdp.io.publish),
-- so no file of an earlier save is there to mix with these.
local function finish_files(dir, written, total, map, id)
  if #written > 1 then write_atomic(join(dir, M.INDEX_NAME), index_json(total, map, id)) end
end

-- opts.metadata (default {format = 'pt'}) with the export id added.
local function with_id(metadata, id)
  local out = {}
  for k, v in pairs(metadata or { format = 'pt' }) do out[k] = v end
  out[publish.ID_KEY] = id
  return out
end

-- Save tensors (name -> Tensor, written in sorted name order, or an array
-- of {name, tensor} pairs, in their order) into `dir` as Hugging Face does:
-- consecutive tensors fill a file until the next would take it past
-- max_shard_size (a tensor larger than that gets a file of its own);
-- several files are model-0000i-of-0000N.safetensors plus
-- model.safetensors.index.json, a single one is model.safetensors.
-- opts: max_shard_size (bytes or '5GB'; default '5GB'), metadata (string
-- map for every file; default {format = 'pt'}, which transformers
-- requires). The directory is replaced as a whole ([Note: exports are
-- published whole] in fsdp.io.publish): it must be missing, empty or an
-- earlier save of ours, and a crash leaves it as it was or complete.
-- Returns the file names written.
function M.save_sharded(dir, tensors, opts)
  opts = opts or {}
  if type(dir) ~= 'string' or dir == '' then core.fail('save_sharded: dir must be a directory path') end
  if type(tensors) ~= 'table' then core.fail('save_sharded: tensors must be a table of name -> Tensor') end
  local max = M.parse_size(opts.max_shard_size or '5GB')
  local list = {}
  if tensors[1] ~= nil then
    local seen = {}
    for i, p in ipairs(tensors) do
      if type(p) ~= 'table' or type(p[1]) ~= 'string' then
        core.fail(('save_sharded: entry %d must be a {name, tensor} pair'):format(i))
      end
      if seen[p[1]] then core.fail(('save_sharded: tensor name %s appears twice'):format(p[1])) end
      seen[p[1]] = true
      list[#list + 1] = p
    end
  else
    for _, name in ipairs(sorted(tensors)) do list[#list + 1] = { name, tensors[name] } end
  end
  local entries = {}
  for i, p in ipairs(list) do
    if not Tensor.is_tensor(p[2]) then
      core.fail(('save_sharded: %s is a %s, not a Tensor'):format(p[1], type(p[2])))
    end
    entries[i] = { p[1], p[2]:numel() * p[2]:element_size(), p[2] }
  end
  local plan, total = plan_files(entries, max)
  local stage = publish.begin(dir, { what = 'save_sharded' })
  local metadata = with_id(opts.metadata, stage.id)
  local written, map = {}, {}
  local bar = progress().start('saving ' .. dir, { total = total, unit = 'B' })
  local ok, err = pcall(function()
    for _, f in ipairs(plan) do
      local shard, bytes = {}, 0
      for _, e in ipairs(f[2]) do
        shard[#shard + 1] = { e[1], e[3] }
        map[e[1]] = f[1]
        bytes = bytes + e[2]
      end
      st().save(join(stage.dir, f[1]), shard, metadata)
      written[#written + 1] = f[1]
      bar:add(bytes)
    end
    finish_files(stage.dir, written, total, map, stage.id)
    stage:commit()
  end)
  bar:finish(not ok and 'failed' or nil)
  if not ok then
    stage:abort()
    error(err, 0)
  end
  return written
end

-- A sharded save whose tensors come one at a time (a sharded model's
-- units, gathered one after another), so they are never all in memory:
--
--   local w = st.stream_sharded(dir, {{name, dtype, shape}, ...}, opts)
--   w:write(name, tensor)   -- in the declared order
--   local names = w:finish()
--
-- The files are planned from the declarations as save_sharded plans them
-- (opts as its, plus checksum, and finite: refuse a NaN or infinity,
-- naming the tensor); each is opened when its first tensor
-- comes and published (atomically) after its last. abort() removes the
-- file being written. dir is the fresh directory of a publication
-- (fsdp.io.publish: stage.dir, which the caller commits after finish) and
-- opts.id its stage.id, which every file and the index carry.
local Stream = {}
Stream.__index = Stream

function M.stream_sharded(dir, decls, opts)
  opts = opts or {}
  if type(dir) ~= 'string' or dir == '' then core.fail('stream_sharded: dir must be a directory path') end
  local max = M.parse_size(opts.max_shard_size or '5GB')
  local entries = {}
  for i, d in ipairs(decls) do
    local n = 1
    for _, s in ipairs(d[3]) do n = n * s end
    entries[i] = { d[1], n * tonumber(core.C.fl_dtype_size(core.dtype(d[2]))), d }
  end
  local plan, total = plan_files(entries, max)
  mkdir_p(dir)
  local map = {}
  for _, f in ipairs(plan) do
    for _, e in ipairs(f[2]) do map[e[1]] = f[1] end
  end
  return setmetatable({ dir = dir, plan = plan, total = total, map = map, file = 0, pos = 0, written = {},
                        bar = progress().start(opts.label or 'writing safetensors files',
                                               { total = total, unit = 'B' }),
                        metadata = opts.id and with_id(opts.metadata, opts.id) or opts.metadata or { format = 'pt' },
                        id = opts.id, checksum = opts.checksum, finite = opts.finite }, Stream)
end

local shape_buf = core.ffi.new('int64_t[?]', core.C.FL_MAX_DIMS)

-- Open the next file and declare its tensors.
function Stream:_open()
  self.file, self.pos = self.file + 1, 0
  local f = self.plan[self.file]
  local C = core.C
  local w = C.fl_safetensors_writer_new(join(self.dir, f[1]))
  if w == nil then core.raise() end
  self.w = w
  for _, e in ipairs(f[2]) do
    local d = e[3]
    for i, s in ipairs(d[3]) do shape_buf[i - 1] = s end
    core.check(C.fl_safetensors_writer_declare(w, d[1], core.dtype(d[2]), #d[3], shape_buf))
  end
  for k, v in pairs(self.metadata) do core.check(C.fl_safetensors_writer_metadata(w, tostring(k), tostring(v))) end
  if self.checksum then core.check(C.fl_safetensors_writer_checksum(w)) end
  if self.finite then core.check(C.fl_safetensors_writer_finite(w, true)) end
end

function Stream:_close()
  local C = core.C
  local ok, err = pcall(core.check, C.fl_safetensors_writer_finish(self.w))
  C.fl_safetensors_writer_free(self.w)
  self.w = nil
  if not ok then error(err, 0) end
  self.written[#self.written + 1] = self.plan[self.file][1]
end

function Stream:write(name, t)
  if not self.w then
    if self.file >= #self.plan then core.fail(('stream_sharded: %s was not declared'):format(name)) end
    self:_open()
  end
  local f = self.plan[self.file]
  local want = f[2][self.pos + 1][1]
  if name ~= want then
    core.fail(('stream_sharded: %s written where %s was declared (tensors go in the declared order)')
      :format(name, want))
  end
  local c = Tensor.cptr(t)
  core.check(core.C.fl_safetensors_writer_write(self.w, c))
  self.bar:add(tonumber(c.numel) * tonumber(core.C.fl_dtype_size(c.dtype)))
  self.pos = self.pos + 1
  if self.pos == #f[2] then self:_close() end
end

-- After every declared tensor: the index (as save_sharded). Returns the
-- file names written.
function Stream:finish()
  while self.file < #self.plan and #self.plan[self.file + 1][2] == 0 do -- an empty model: one empty file
    self:_open()
    self:_close()
  end
  if self.w or self.file < #self.plan then
    core.fail(('stream_sharded: finish() before every declared tensor of %s was written'):format(self.dir))
  end
  finish_files(self.dir, self.written, self.total, self.map, self.id)
  self.bar:finish()
  return self.written
end

function Stream:abort()
  self.bar:finish('failed')
  if self.w then
    core.C.fl_safetensors_writer_free(self.w)
    self.w = nil
  end
end

return M

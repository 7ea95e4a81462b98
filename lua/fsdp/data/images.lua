-- fsdp.data.images: labelled images for DeepViT, synthetic or from raw
-- uint8 arrays, behind the interface of the token datasets (next,
-- batches, state, load_state).
--
--   local images = require 'fsdp.data.images'
--   local src = images.synthetic({ num_classes = 10, channels = 3, image_size = 32, batch_size = 8, seed = 0 })
--   local ds = images.open('data/imgs', { split = 'train', channels = 3, image_size = 256, batch_size = 8 })
--   local x, y = ds:next()          -- f32 [8, 3, 256, 256] (normalised), i64 [8]
--
-- Raw files, in a directory: <split>_images.u8 holds N images as uint8
-- [N, channels, image_size, image_size] back to back (row-major, no
-- header: N is the file size over the image size, which must divide it),
-- and <split>_labels.txt one integer class per line, N lines. Pixels are
-- normalised as (x / 255 - mean) / std (0.5 / 0.5 by default: [-1, 1]).
-- The order, the ranks' parts and the state follow fsdp.data.sampler.
--
-- Synthetic images are a fixed random image per class (from the seed)
-- plus unit noise, drawn from (seed, batch index): learnable at a glance.
-- Batch k of rank r is batch k * world_size + r; validation batches come
-- from a region (index 2^30 on) training never reaches.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Sampler = require 'fsdp.data.sampler'
local files = require 'fsdp.io.files'
local mesh = require 'fsdp.mesh'

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.images: ' .. fmt:format(...)) end

local function dist_opts(opts)
  if opts.rank ~= nil and opts.world_size ~= nil then return opts.rank, opts.world_size end
  -- the data-parallel ranks ([Note: data-parallel rank and size] in fsdp/mesh.lua)
  return opts.rank or mesh.data_parallel_rank(), opts.world_size or mesh.data_parallel_size()
end

-- synthetic -------------------------------------------------------------------

local Synthetic = {}
Synthetic.__index = Synthetic

local VAL_BASE = 2 ^ 30

function M.synthetic(opts)
  local self = setmetatable({}, Synthetic)
  self.num_classes, self.channels, self.image_size = opts.num_classes, opts.channels or 3, opts.image_size
  self.batch_size, self.seed = opts.batch_size, opts.seed or 0
  self.rank, self.world_size = dist_opts(opts)
  self.pixels = self.channels * self.image_size * self.image_size
  self.templates = fsdp.randn({ self.num_classes, self.pixels }, { seed = self.seed, stream = 7 })
  self.step = 0
  return self
end

function Synthetic:batch(k)
  local B, P = self.batch_size, self.pixels
  local y = fsdp.randint(0, self.num_classes, { B }, { seed = self.seed, stream = 8, offset = k * B })
  local noise = fsdp.randn({ B, self.channels, self.image_size, self.image_size },
    { seed = self.seed, stream = 9, offset = k * B * P })
  local x = fsdp.F.embedding(y, self.templates):view(B, self.channels, self.image_size, self.image_size) + noise
  return x, y
end

function Synthetic:next()
  local k = self.step * self.world_size + self.rank
  self.step = self.step + 1
  return self:batch(k)
end

function Synthetic:batches(n)
  local k = 0
  return function()
    if k >= n then return nil end
    k = k + 1
    return self:batch(VAL_BASE + (k - 1) * self.world_size + self.rank)
  end
end

function Synthetic:state() return { kind = 'synthetic_images', step = self.step, seed = self.seed } end

function Synthetic:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'synthetic_images' or s.seed ~= self.seed then
    fail('load_state expects a synthetic image state with seed %d, got %s', self.seed,
      type(s) == 'table' and ('kind ' .. tostring(s.kind) .. ', seed ' .. tostring(s.seed)) or tostring(s))
  end
  self.step = s.step
end

function Synthetic:__tostring()
  return ('SyntheticImages(%d classes, %dx%dx%d)'):format(self.num_classes, self.channels, self.image_size,
    self.image_size)
end

-- raw files ----------------------------------------------------------------------

local Raw = {}
Raw.__index = Raw

local function read_all(path)
  local s, err = files.read(path, files.LIMITS.data[1], 'a raw image file')
  if not s then fail('%s', err) end
  return s
end

-- opts: split ('train'), channels (3), image_size, batch_size, num_classes
-- (optional: labels are checked against it), seed, shuffle, mean/std,
-- rank/world_size.
function M.open(dir, opts)
  local split = opts.split or 'train'
  local self = setmetatable({ dir = dir, split = split }, Raw)
  self.channels, self.image_size = opts.channels or 3, opts.image_size
  if validate.problem(self.image_size, validate.COUNT) then fail('open: image_size is required (an integer >= 1)') end
  local ipath = ('%s/%s_images.u8'):format(dir, split)
  local lpath = ('%s/%s_labels.txt'):format(dir, split)
  local bytes = read_all(ipath)
  local per = self.channels * self.image_size * self.image_size
  if #bytes == 0 or #bytes % per ~= 0 then
    fail('%s: %d bytes is not a whole number of %dx%dx%d images (%d bytes each)', ipath, #bytes, self.channels,
      self.image_size, self.image_size, per)
  end
  self.n = #bytes / per
  self.images = fsdp.empty({ self.n, self.channels, self.image_size, self.image_size }, { dtype = 'u8' })
  ffi.copy(self.images._c.data, bytes, #bytes)
  bytes = nil
  local labels, line = {}, 0
  for text in read_all(lpath):gmatch('[^\n]*') do
    if text:match('%S') then
      line = line + 1
      local v = tonumber(text)
      if validate.problem(v, { int = true, min = 0, below = opts.num_classes }) then
        fail('%s:%d: %q is not a class id%s', lpath, line, text,
          opts.num_classes and (' in [0, %d)'):format(opts.num_classes) or '')
      end
      labels[line] = v
    end
  end
  if line ~= self.n then fail('%s has %d labels for the %d images of %s', lpath, line, self.n, ipath) end
  self.labels = labels
  self.mean, self.std = opts.mean or 0.5, opts.std or 0.5
  self.batch_size, self.seed = opts.batch_size, opts.seed or 0
  local rank, world = dist_opts(opts)
  self.sampler = Sampler.new({ n = self.n, batch_size = opts.batch_size, seed = self.seed, shuffle = opts.shuffle,
    rank = rank, world_size = world, name = ('fsdp.data.images: %s (%s split, %d images)'):format(dir, split, self.n) })
  return self
end

function Raw:gather(idx)
  local rows, ys = {}, {}
  for b, i in ipairs(idx) do
    rows[b] = self.images:narrow(0, i, 1)
    ys[b] = self.labels[i + 1]
  end
  local x = (fsdp.cat(rows, 0):to('f32') / 255 - self.mean) / self.std
  return x, fsdp.tensor(ys, { dtype = 'i64' })
end

function Raw:next() return self:gather((self.sampler:next())) end

function Raw:batches(n) return self.sampler:gather_batches(self, n) end

function Raw:state()
  local s = self.sampler:state()
  return { kind = 'images', epoch = s.epoch, position = s.position, seed = self.seed, n = self.n }
end

function Raw:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'images' or s.n ~= self.n or s.seed ~= self.seed then
    fail('%s: the saved position is not for these %d images with seed %d', self.dir, self.n, self.seed)
  end
  self.sampler:load_state(s)
end

function Raw:__tostring()
  return ('ImageFiles(%s, %s: %d images %dx%dx%d)'):format(self.dir, self.split, self.n, self.channels,
    self.image_size, self.image_size)
end

return M

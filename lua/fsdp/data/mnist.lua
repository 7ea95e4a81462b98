-- fsdp.data.mnist: MNIST digits, from the idx files of the original
-- distribution (train-images-idx3-ubyte, train-labels-idx1-ubyte, and the
-- t10k- pair), or synthetic digits when no files are given.
--
--   local mnist = require 'fsdp.data.mnist'
--   local train = mnist.load('data/mnist', 'train')     -- or mnist.synthetic(n, {seed=})
--   local x, y = train:batch(i, 64)                      -- f32 [64,1,28,28] normalised, i64 [64]
--
-- Images are normalised as the PyTorch example does: (x / 255 - 0.1307) /
-- 0.3081. Synthetic digits are a fixed random 28x28 pattern per class
-- (from the seed) plus noise: separable, so the tutorial's CNN learns them
-- to near-perfect accuracy in an epoch, which is what a smoke test needs.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local files = require 'fsdp.io.files'

local M = {}

local MEAN, STD = 0.1307, 0.3081

local Dataset = {}
Dataset.__index = Dataset

function Dataset:size() return self.n end

-- Batch i (0-based) of `size` examples, in order (the last may be short).
function Dataset:batch(i, size)
  local first = i * size
  local count = math.min(size, self.n - first)
  if count <= 0 then error(('mnist: batch %d of size %d is past the %d examples'):format(i, size, self.n), 2) end
  return self.images:narrow(0, first, count), self.labels:narrow(0, first, count)
end

local function big_endian_u32(s, pos)
  local a, b, c, d = s:byte(pos, pos + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

local function read_file(path)
  local s, err = files.read(path, files.LIMITS.data[1], 'an MNIST idx file')
  if not s then error('mnist: ' .. err, 3) end
  return s
end

-- A u8 tensor of the bytes of s from `offset` on, with shape.
local function bytes_tensor(s, offset, shape, path)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  if #s - offset < n then
    error(('mnist: %s is truncated: %d bytes of data for %d expected'):format(path, #s - offset, n), 3)
  end
  local t = fsdp.empty(shape, { dtype = 'u8' })
  ffi.copy(t._c.data, ffi.cast('const char *', s) + offset, n)
  return t
end

-- Load split 'train' or 't10k' (also 'test') from a directory of idx files.
function M.load(dir, split)
  split = split == 'test' and 't10k' or (split or 'train')
  local ipath = ('%s/%s-images-idx3-ubyte'):format(dir, split)
  local lpath = ('%s/%s-labels-idx1-ubyte'):format(dir, split)
  local img, lab = read_file(ipath), read_file(lpath)
  if #img < 16 or big_endian_u32(img, 1) ~= 2051 then
    error(('mnist: %s is not an idx3 image file (magic 2051)'):format(ipath), 2)
  end
  if #lab < 8 or big_endian_u32(lab, 1) ~= 2049 then
    error(('mnist: %s is not an idx1 label file (magic 2049)'):format(lpath), 2)
  end
  local n, rows, cols = big_endian_u32(img, 5), big_endian_u32(img, 9), big_endian_u32(img, 13)
  if big_endian_u32(lab, 5) ~= n then
    error(('mnist: %s has %d images but %s has %d labels'):format(ipath, n, lpath, big_endian_u32(lab, 5)), 2)
  end
  local pixels = bytes_tensor(img, 16, { n, 1, rows, cols }, ipath)
  local labels = bytes_tensor(lab, 8, { n }, lpath):to('i64')
  local images = (pixels:to('f32') / 255 - MEAN) / STD
  return setmetatable({ images = images, labels = labels, n = n }, Dataset)
end

-- n synthetic digits: class templates from `seed`, per-example noise from
-- (seed, stream 1 + split offset) so train and test differ.
function M.synthetic(n, opts)
  opts = opts or {}
  local seed, noise = opts.seed or 0, opts.noise or 0.45
  local templates = fsdp.rand({ 10, 1, 28, 28 }, { seed = seed, stream = 100 })
  local labels = fsdp.randint(0, 10, { n }, { seed = seed, stream = 101, offset = opts.offset or 0 })
  -- each example starts as its class's template: a row gather
  local images = fsdp.F.embedding(labels, templates:view(10, 784)):view(n, 1, 28, 28)
  local jitter = fsdp.randn({ n, 1, 28, 28 }, { seed = seed, stream = 102, offset = (opts.offset or 0) * 784,
                                               std = noise })
  images = ((images + jitter):clamp(0, 1) - MEAN) / STD
  return setmetatable({ images = images, labels = labels, n = n }, Dataset)
end

return M

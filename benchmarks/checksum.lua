-- benchmarks/checksum.lua: what checkpoint integrity costs. The checksum
-- (XXH3-64, core/io/checksum.c) and the NaN/inf scan run over every byte a
-- save writes and the checksum over every byte a load reads; this prints
-- their speed next to the speed of reading the same file, so the cost of
-- verifying can be seen against the read it guards. Prints numbers;
-- asserts nothing.
--
--   fsdp-lua benchmarks/checksum.lua [--mib=256] [--repeats=5] [--dir=/tmp]
--
-- One f32 safetensors file of --mib MiB in 8 tensors (a rank file's few
-- large tensors) is written with and without checksum + finiteness check
-- (each write fsync'd), then:
--   checksum, finite scan   in memory, over the tensors' bytes
--   read (warm)             open + copy every tensor out of the mapping
--                           (what a load does), file in the page cache
--   verify (warm)           open + recompute and compare the checksum
--   read / verify (cold)    the same after the file's pages are dropped
--                           (posix_fadvise DONTNEED on the clean file), so
--                           the bytes come from the disk
--   verify + read (cold)    a checked load: the verification brings the
--                           pages in, the copy then finds them in memory
-- The last line compares the checksum with a read from disk and a checked
-- load with an unchecked one.
-- GB/s = 1e9 bytes/s; best of --repeats.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local Tensor = require 'fsdp.tensor'
local st = require 'fsdp.io.safetensors'
local ffi, C = core.ffi, core.C

-- libc, to drop a file's pages from the page cache for the cold reads.
ffi.cdef [[
int open(const char *path, int flags, ...);
int close(int fd);
int posix_fadvise(int fd, long offset, long len, int advice);
]]
local O_RDONLY, POSIX_FADV_DONTNEED = 0, 4

local cfg = options.config({
  mib = { 256, 'size of the file in MiB' },
  repeats = { 5, 'runs of each measurement; the best is printed' },
  dir = { '/tmp', 'where the file is written' },
}, arg, 'benchmarks/checksum.lua')

local N_TENSORS = 8
local numel = math.floor(cfg.mib * 2 ^ 20 / 4 / N_TENSORS)
local tensors = {}
for i = 1, N_TENSORS do tensors[i] = { ('t%d'):format(i), fsdp.randn({ numel }, { seed = i }) } end
local bytes = N_TENSORS * numel * 4
local path = ('%s/fsdp-checksum-bench-%d.safetensors'):format(cfg.dir, math.random(1e9))

local function best(fn, setup)
  local t = math.huge
  for _ = 1, cfg.repeats do
    if setup then setup() end
    local t0 = clock.now()
    fn()
    t = math.min(t, clock.now() - t0)
  end
  return t
end

local function drop_cache()
  local fd = ffi.C.open(path, O_RDONLY)
  assert(fd >= 0, 'cannot open ' .. path)
  ffi.C.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
  ffi.C.close(fd)
end

local function read_all()
  local f = st.open(path)
  for _, e in ipairs(tensors) do
    local v = f:get(e[1])
    local copy = v:clone()
    v:free()
    copy:free()
  end
  f:close()
end

local function verify()
  local f = st.open(path)
  assert(f:verify(), 'the file has no checksum')
  f:close()
end

local r = {}
r.checksum = best(function()
  for _, e in ipairs(tensors) do C.fl_checksum(Tensor.cptr(e[2]).data, numel * 4) end
end)
r.finite = best(function()
  for _, e in ipairs(tensors) do assert(C.fl_first_nonfinite(Tensor.cptr(e[2]).data, numel, C.FL_F32) < 0) end
end)
r.write_plain = best(function() st.save(path, tensors) end)
r.write_checked = best(function() st.save(path, tensors, nil, { checksum = true, finite = true }) end)
r.read_warm = best(read_all, read_all)
r.verify_warm = best(verify, verify)
r.read_cold = best(read_all, drop_cache)
r.verify_cold = best(verify, drop_cache)
r.checked_cold = best(function() verify(); read_all() end, drop_cache)
os.remove(path)

print(('%d MiB of f32 in %d tensors, best of %d'):format(cfg.mib, N_TENSORS, cfg.repeats))
print(('%-44s %9s %8s'):format('operation', 'best s', 'GB/s'))
local function row(what, t) print(('%-44s %9.4f %8.2f'):format(what, t, bytes / t / 1e9)) end
row('checksum (XXH3-64, in memory)', r.checksum)
row('finite scan (in memory)', r.finite)
row('write, fsync (no checksum)', r.write_plain)
row('write, fsync (checksum + finite scan)', r.write_checked)
row('read: open + copy every tensor (warm)', r.read_warm)
row('verify: open + checksum of the data (warm)', r.verify_warm)
row('read: open + copy every tensor (cold)', r.read_cold)
row('verify: open + checksum of the data (cold)', r.verify_cold)
row('verify, then read (cold): a checked load', r.checked_cold)
print(('verify / read time: %.2f warm (page cache), %.2f cold (checksum in memory / read from disk); '
  .. 'checked / unchecked load, cold: %+.0f%%; write with checksum + scan: %+.0f%%'):format(
  r.verify_warm / r.read_warm, r.checksum / r.read_cold, 100 * (r.checked_cold / r.read_cold - 1),
  100 * (r.write_checked / r.write_plain - 1)))

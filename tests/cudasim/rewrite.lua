-- rewrite.lua: turn a CUDA source into C++ that cudasim.h can compile.
--   luajit rewrite.lua IN.cu > OUT.cc
-- The build writes the rewritten .cu and .cuh files side by side into one
-- folder of the object tree, so includes of each other find the rewritten
-- copies; includes that climb out of core/cuda ("../tensor/device_pool.h") are made
-- absolute. Every line stays where it was (compiler messages and debuggers
-- point at the original, named by a #line directive):
--   kernel<T, N><<<grid, block, smem, stream>>>(args)
--     -> fl_sim_launch(__FILE__, __LINE__, "kernel<T, N>", kernel<T, N>,
--                      grid, block, smem, stream)(args)
--   extern __shared__ [__align__(n)] T name[];
--     -> T *name = (T *)fl_sim_dynamic_smem();
local path = assert(arg[1], "usage: rewrite.lua FILE.cu")
local f = assert(io.open(path, "rb"))
local src = f:read("*a")
f:close()

-- The start of the kernel expression ending just before position i: an
-- identifier (with ::) optionally followed by balanced template arguments.
local function kernel_start(s, i)
  local j = i
  while j > 0 and s:sub(j, j):match("%s") do j = j - 1 end
  if s:sub(j, j) == ">" then
    local depth = 0
    while j > 0 do
      local c = s:sub(j, j)
      if c == ">" then depth = depth + 1 elseif c == "<" then depth = depth - 1 end
      if depth == 0 then break end
      j = j - 1
    end
    j = j - 1
  end
  while j > 0 and s:sub(j, j):match("[%w_:]") do j = j - 1 end
  return j + 1
end

local out, pos = {}, 1
while true do
  local a, b = src:find("<<<", pos, true)
  if not a then break end
  local c, d = src:find(">>>", b + 1, true)
  if not c then error(path .. ": '<<<' without '>>>'") end
  local k = kernel_start(src, a - 1)
  out[#out + 1] = src:sub(pos, k - 1)
  local kernel = src:sub(k, a - 1)
  out[#out + 1] = ("fl_sim_launch(__FILE__, __LINE__, %q, %s, %s)"):format(
    (kernel:gsub("%s+", " ")), kernel, src:sub(b + 1, c - 1))
  pos = d + 1
end
out[#out + 1] = src:sub(pos)
local text = table.concat(out)

text = text:gsub("extern%s+__shared__%s+([^;%[]-)%s*([%w_]+)%s*%[%s*%]%s*;", function(ty, name)
  ty = ty:gsub("__align__%b()%s*", "")
  return ("%s *%s = (%s *)fl_sim_dynamic_smem();"):format(ty, name, ty)
end)

local dir = path:match("^(.*)/[^/]*$") or "."
text = text:gsub('#include%s+"(%.%./[^"]+)"', function(rel) return '#include "' .. dir .. "/" .. rel .. '"' end)

io.write('#line 1 "', path, '"\n', text)

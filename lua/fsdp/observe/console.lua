-- fsdp.observe.console: the lines a run prints, rank-aware. [Note: clean logs]
-- With several ranks every line a recipe prints starts with "[rank r] ":
-- what concerns the whole job (configuration, model, data, checkpoints,
-- the step log) comes from rank 0 alone (console.print), what is a rank's
-- own from that rank (console.print_all). With one rank lines carry no
-- prefix. A progress bar (fsdp.metrics) registers itself here so that any
-- line, a checkpoint message too, is printed above it and the bar redrawn
-- below.
--
--   local console = require 'fsdp.observe.console'
--   console.print('config:\n' .. text)      -- rank 0; each line prefixed
--   console.print_all('loaded %d shards', n) -- every rank, prefixed
local dist = require 'fsdp.dist'

local M = {}

local bar -- { clear = fn(), draw = fn() } while a progress bar is on screen

-- "[rank r] " with several ranks, '' with one.
function M.prefix()
  return dist.world_size() > 1 and ('[rank %d] '):format(dist.rank()) or ''
end

-- fmt with arguments formats; a single argument is printed as is
-- (tostring), like print's.
local function text_of(fmt, ...)
  if select('#', ...) > 0 then return fmt:format(...) end
  return tostring(fmt)
end

local function emit(text)
  local out, prefix = io.stdout, M.prefix()
  if bar then bar.clear() end
  for line in (text .. '\n'):gmatch('([^\n]*)\n') do out:write(prefix, line, '\n') end
  if bar then bar.draw() end
  out:flush()
end

-- Print on rank 0 only.
function M.print(fmt, ...)
  if dist.rank() ~= 0 then return end
  emit(text_of(fmt, ...))
end

-- Print on every rank (a rank's own state).
function M.print_all(fmt, ...) emit(text_of(fmt, ...)) end

-- A progress bar: b.clear() erases it, b.draw() draws it; nil when gone.
-- Returns the bar it replaces (fsdp.observe.progress puts it back after).
function M.set_bar(b)
  local previous = bar
  bar = b
  return previous
end

return M

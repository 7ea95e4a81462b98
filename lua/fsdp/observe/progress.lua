-- fsdp.observe.progress (fsdp.progress): one progress line for long work that is not a training
-- step (those have fsdp.metrics' bar): loading weights, saving a checkpoint, exporting,
-- preparing data, training a tokenizer, planning sweeps.
--
--   local progress = require 'fsdp.observe.progress'
--   local p = progress.start('saving checkpoint', {total = bytes, unit = 'B'})
--   for ... do write_one(); p:add(tensor_bytes) end     -- or p:update(done_so_far)
--   p:finish()                                          -- "saving checkpoint: 2.1 GiB in 3.4 s (630 MiB/s)"
--   local ph = progress.phase('training the tokenizer')  -- one long call that cannot report:
--   train(); ph:finish()                                 -- announced before, elapsed after
--
-- Where it goes (progress.mode()): to stderr, so that stdout stays the
-- program's output. On a terminal ('bar') one line redrawn in place at
-- most every M.redraw seconds: label, bar, percent, done/total, rate,
-- ETA. Else ('lines': a file, a pipe, under a launcher) a plain line
-- every M.interval seconds (FSDP_PROGRESS_INTERVAL, 10), the first only
-- once the work has lasted that long, and a closing line when it printed
-- any or the work was a phase: short work in a log adds nothing. Only
-- rank 0 reports (work that concerns the job; [Note: clean logs] in
-- fsdp.observe.console); FSDP_PROGRESS=0 turns it off ('off'), =1 forces
-- the bar, =lines the lines.
--
-- Cost: update/add store a number and read the monotonic clock (one
-- clock_gettime through the FFI, tens of nanoseconds); everything else
-- happens at most once per redraw. Off, start returns a shared object
-- whose methods return at once. Callers report per tensor, file or
-- batch, never per element.
local ffi = require 'ffi'
local clock = require 'fsdp.clock'
local console = require 'fsdp.observe.console'
local dist = require 'fsdp.dist'
pcall(ffi.cdef, 'int isatty(int fd);')

local M = {}

M.redraw = 0.1                  -- seconds between redraws of the bar
M.width = 24                    -- the bar's cells
M.interval = tonumber(os.getenv('FSDP_PROGRESS_INTERVAL') or '') or 10

-- 'bar', 'lines' or 'off' for this process (see the top).
function M.mode()
  if dist.rank() ~= 0 then return 'off' end
  local v = os.getenv('FSDP_PROGRESS')
  if v == '0' then return 'off' end
  if v == '1' then return 'bar' end
  if v == 'lines' then return 'lines' end
  -- A launcher forwards a rank's output line by line: redrawing is noise.
  if dist.launcher_rank() ~= nil then return 'lines' end
  return ffi.C.isatty(2) == 1 and 'bar' or 'lines'
end

-- 1536 -> "1.5 KiB"; counts of other units with thousands separators.
local function amount(n, unit, rate)
  if unit == 'B' then
    local units = { 'B', 'KiB', 'MiB', 'GiB', 'TiB' }
    local i = 1
    while n >= 1024 and i < #units do n, i = n / 1024, i + 1 end
    return i == 1 and ('%d B'):format(n) or ('%.1f %s'):format(n, units[i])
  end
  if n < 10 and (rate or n ~= math.floor(n)) then return ('%.1f'):format(n) .. (unit ~= '' and ' ' .. unit or '') end
  local s = ('%d'):format(math.floor(n + 0.5)):reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')
  return unit ~= '' and (s .. ' ' .. unit) or s
end
M.amount = amount

-- 75 -> "1:15", 4000 -> "1:06:40", 9 -> "9s"
local function duration(s)
  if s ~= s or s == math.huge then return '?' end
  s = math.floor(s + 0.5)
  if s < 60 then return s .. 's' end
  if s < 3600 then return ('%d:%02d'):format(s / 60, s % 60) end
  return ('%d:%02d:%02d'):format(s / 3600, s / 60 % 60, s % 60)
end
M.duration = duration

local function seconds(s) return s < 10 and ('%.1f s'):format(s) or duration(s) end

local Progress = {}
Progress.__index = Progress

local OFF = setmetatable({ mode = 'off' }, Progress)

-- The text of the current state: "label [=====>    ] 45% 1.2 GiB/2.7 GiB 350 MiB/s ETA 4s".
function Progress:text(bar)
  local now = self.now()
  local elapsed = now - self.t0
  local done, total, unit = self.done, self.total, self.unit
  local parts = {}
  local rate = elapsed > 0 and done / elapsed or 0
  if total and total > 0 then
    local f = math.min(1, done / total)
    if bar then
      local cells = math.floor(f * M.width)
      parts[#parts + 1] = '[' .. ('='):rep(cells) .. (cells < M.width and '>' .. (' '):rep(M.width - cells - 1) or '')
        .. ']'
    end
    parts[#parts + 1] = (bar and '%3d%%' or '%d%%'):format(math.floor(f * 100))
    parts[#parts + 1] = unit == 'B' and amount(done, unit) .. '/' .. amount(total, unit)
      or amount(done, '') .. '/' .. amount(total, unit)
  elseif done > 0 then
    parts[#parts + 1] = amount(done, unit)
  end
  if done > 0 and elapsed > 0 then parts[#parts + 1] = amount(rate, unit, true) .. '/s' end
  if total and total > 0 and done > 0 and done < total then
    parts[#parts + 1] = 'ETA ' .. duration((total - done) / rate)
  else
    parts[#parts + 1] = seconds(elapsed)
  end
  return self.label .. (bar and '  ' or ': ') .. table.concat(parts, bar and '  ' or ', ')
end

function Progress:_clear()
  if self.drawn then self.out:write('\r\27[K'); self.drawn = false end
end

function Progress:_draw()
  self.out:write('\r\27[K', self:text(true))
  self.out:flush()
  self.drawn = true
end

-- Report at most once per redraw (bar) or interval (lines).
function Progress:_tick()
  local now = self.now()
  if now < self.next then return end
  if self.mode == 'bar' then
    self.next = now + M.redraw
    self:_draw()
  else
    self.next = now + M.interval
    self.lines = self.lines + 1
    self.out:write(console.prefix(), self:text(false), '\n')
    self.out:flush()
  end
end

-- The work done so far (absolute), in the task's unit.
function Progress:update(done)
  if self.mode == 'off' then return end
  self.done = done
  return self:_tick()
end

-- n more done.
function Progress:add(n)
  if self.mode == 'off' then return end
  self.done = self.done + (n or 1)
  return self:_tick()
end

-- The total, when it becomes known after start.
function Progress:set_total(total)
  if self.mode == 'off' then return end
  self.total = total
end

-- Around output of one's own that does not go through fsdp.observe.console
-- (a plain print): hide() clears the bar, show() draws it again.
function Progress:hide()
  if self.mode == 'bar' then self:_clear(); self.out:flush() end
end

function Progress:show()
  if self.mode == 'bar' and not self.finished then self:_draw() end
end

-- The closing line: "label: 2.1 GiB in 3.4 s (630 MiB/s)", or with a note
-- ("label: done in 28.3 s, 32,000 pieces"). In lines mode only when the
-- work printed a line before or is a phase.
function Progress:finish(note)
  if self.mode == 'off' or self.finished then return end
  self.finished = true
  local elapsed = self.now() - self.t0
  local what = self.done > 0 and amount(self.done, self.unit) .. ' in ' or 'done in '
  local text = self.label .. ': ' .. what .. seconds(elapsed)
  if self.done > 0 and elapsed > 0 then
    text = text .. (' (%s/s)'):format(amount(self.done / elapsed, self.unit, true))
  end
  if note then text = text .. ', ' .. note end
  if self.mode == 'bar' then
    self:_clear()
    self.out:write(text, '\n')
    console.set_bar(self.previous)
    if self.previous then self.previous.draw() end
  elseif self.lines > 0 or self.is_phase then
    self.out:write(console.prefix(), text, '\n')
  end
  self.out:flush()
end

-- Start reporting `label`. opts: total (the work in units; nil: unknown,
-- only the count and rate show), unit ('B': bytes shown as KiB/MiB/GiB;
-- else a word such as 'tensors'; default ''), and for tests: mode, out (a
-- file; io.stderr), now (a clock in seconds).
function M.start(label, opts)
  opts = opts or {}
  local mode = opts.mode or M.mode()
  if mode == 'off' then return OFF end
  local now = opts.now or clock.now
  local p = setmetatable({
    label = label, total = opts.total, unit = opts.unit or '', done = 0, mode = mode, out = opts.out or io.stderr,
    now = now, t0 = now(), lines = 0, is_phase = opts.phase or false,
  }, Progress)
  if mode == 'bar' then
    -- Lines printed through fsdp.observe.console go above the bar.
    p.previous = console.set_bar({ clear = function() p:_clear() end, draw = function() p:_draw() end })
    if p.previous then p.previous.clear() end
    p.next = p.t0 + M.redraw
    p:_draw()
  else
    p.next = p.t0 + M.interval
    if p.is_phase then
      p.out:write(console.prefix(), label, ' ...\n')
      p.out:flush()
    end
  end
  return p
end

-- A phase: one long call that cannot report as it goes. Announced at
-- once (the bar shows its label and elapsed time; a log gets "label ..."),
-- closed by :finish(note) with the elapsed time.
function M.phase(label, opts)
  local o = { phase = true }
  for k, v in pairs(opts or {}) do o[k] = v end
  return M.start(label, o)
end

-- progress.each(label, list, fn, opts): fn(item, i) for every item of the
-- list, counted (opts.size(item) -> its units when they are not 1 each).
function M.each(label, list, fn, opts)
  opts = opts or {}
  local size = opts.size
  local total = #list
  if size then
    total = 0
    for _, item in ipairs(list) do total = total + size(item) end
  end
  local o = { total = total }
  for k, v in pairs(opts) do if k ~= 'size' then o[k] = v end end
  local p = M.start(label, o)
  for i, item in ipairs(list) do
    fn(item, i)
    p:add(size and size(item) or 1)
  end
  p:finish()
end

return M

-- fsdp.repl.summary (fsdp.summary): a table of a model's modules with their parameters, shapes,
-- dtypes and bytes, and the totals.
--
--   local s = fsdp.summary(model)               -- prints the table
--   local s = fsdp.summary(model, {depth = 2})  -- modules deeper than 2 folded into their parent
--   s.total_params == model:num_parameters()
--   s.rows[3].name, s.rows[3].class, s.rows[3].params, s.rows[3].bytes ...
--
-- One row per module, depth first in registration order (the order of
-- named_modules), each with the parameters and bytes of its whole subtree
-- and the shapes of the parameters it holds itself. A tensor shared by two
-- modules (tied embeddings) belongs to the first that registers it, as in
-- named_parameters(), so the totals equal num_parameters(). Bytes are the
-- storage the parameters take or would take (meta and fake tensors count
-- numel x dtype size), so full-size models can be sized without memory.
--
-- Runs of identical layers (a ModuleList's children with the same classes,
-- shapes and dtypes throughout) fold into one row, "layers.0-79" of class
-- "80 x DecoderLayer" counting them all, followed by the rows inside the
-- first of them, as print(model) folds them.
--
-- Options: depth (nil: every module; 0: the model alone), fold (false: a
-- row for every layer), print (false: only return the data).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local tables = require 'fsdp.tables'
local C = core.C

local M = {}

-- 68976648192 -> "68,976,648,192"
function M.commas(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^(%-?),', '%1'))
end

-- 1536 -> "1.5 KiB"
function M.human_bytes(n)
  local units = { 'B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB' }
  local i = 1
  while n >= 1024 and i < #units do n, i = n / 1024, i + 1 end
  return i == 1 and ('%d B'):format(n) or ('%.1f %s'):format(n, units[i])
end

local function tensor_bytes(t)
  local c = t._c
  return tonumber(c.numel) * tonumber(C.fl_dtype_size(c.dtype))
end

local function parent_path(name)
  return name:match('^(.*)%.[^.]*$') or ''
end

local function depth_of(path)
  if path == '' then return 0 end
  local _, dots = path:gsub('%.', '')
  return dots + 1
end

-- Sorted "a+b" of a set's keys.
local function joined(set)
  return table.concat(tables.sorted_keys(set), '+')
end

local function check_args(model, opts)
  if type(model) ~= 'table' or type(model.named_modules) ~= 'function' then
    core.fail(('fsdp.summary: expected an nn.Module, got %s'):format(type(model)))
  end
  if opts ~= nil and type(opts) ~= 'table' then
    core.fail(('fsdp.summary: expected an options table, got %s'):format(type(opts)))
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= 'depth' and k ~= 'print' and k ~= 'fold' then
      core.fail(('fsdp.summary: unknown option %s (valid: depth, fold, print)'):format(tostring(k)))
    end
  end
  local depth = opts.depth
  if depth ~= nil and validate.problem(depth, validate.INDEX) then
    core.fail(('fsdp.summary: depth must be a non-negative integer, got %s'):format(validate.show(depth)))
  end
  return opts
end

-- A string equal for two modules exactly when their subtrees have the same
-- classes, names, parameter shapes and dtypes (memoised per module).
local function signature(m, memo)
  local sig = memo[m]
  if sig then return sig end
  local parts = { m:class_name(), '(' }
  for _, np in ipairs(m:named_parameters({ prefix = '' })) do
    if not np[1]:find('.', 1, true) then
      parts[#parts + 1] = ('%s:%s:%s;'):format(np[1], core.format_shape(np[2].shape), np[2].dtype)
    end
  end
  for _, nc in ipairs(m:named_children()) do
    parts[#parts + 1] = nc[1] .. '=' .. signature(nc[2], memo) .. ';'
  end
  parts[#parts + 1] = ')'
  sig = table.concat(parts)
  memo[m] = sig
  return sig
end

-- Replace runs of identical siblings named n, n+1, ... (a ModuleList of
-- equal layers) by one row "layers.0-79" of class "80 x Layer" counting the
-- whole run, followed by the rows of the first one's subtree.
local function fold_runs(rows, modules)
  local memo, out = {}, {}
  local n = #rows
  -- end_of[i]: the index after row i's subtree (rows are depth first).
  local end_of = {}
  for i = 1, n do
    local j = i + 1
    while j <= n and rows[j].depth > rows[i].depth do j = j + 1 end
    end_of[i] = j
  end
  local i = 1
  while i <= n do
    local row = rows[i]
    local index = tonumber(row.name:match('%.(%d+)$') or row.name:match('^(%d+)$'))
    local j, count = end_of[i], 1
    if index then
      local sig = signature(modules[i], memo)
      local parent = row.name:match('^(.*)%.%d+$')
      while j <= n and rows[j].depth == row.depth do
        local next_parent = rows[j].name:match('^(.*)%.%d+$')
        local next_index = tonumber(rows[j].name:match('%.(%d+)$') or rows[j].name:match('^(%d+)$'))
        if next_parent ~= parent or next_index ~= index + count
           or signature(modules[j], memo) ~= sig then break end
        count, j = count + 1, end_of[j]
      end
    end
    if count == 1 then
      out[#out + 1] = row
      i = i + 1
    else
      local prefix = row.name:match('^(.*%.)%d+$') or ''
      out[#out + 1] = { name = ('%s%d-%d'):format(prefix, index, index + count - 1),
                        class = ('%d x %s'):format(count, row.class), depth = row.depth,
                        count = count, params = row.params * count, bytes = row.bytes * count,
                        tensors = row.tensors * count, shapes = {}, dtypes = row.dtypes,
                        devices = row.devices }
      for k = i + 1, end_of[i] - 1 do out[#out + 1] = rows[k] end
      i = j
    end
  end
  return out
end

-- The rows and totals of a model, without printing.
function M.collect(model, opts)
  opts = check_args(model, opts)
  local max_depth = opts.depth or math.huge
  local all, modules, by_path = {}, {}, {}
  for _, nm in ipairs(model:named_modules()) do
    local path, m = nm[1], nm[2]
    local row = { name = path, class = m:class_name(), depth = depth_of(path), params = 0, bytes = 0,
                  tensors = 0, shapes = {}, dtypes = {}, devices = {} }
    by_path[path] = row
    all[#all + 1], modules[#all + 1] = row, m
  end
  local data = { total_params = 0, total_bytes = 0, by_dtype = {}, devices = {},
                 buffers = 0, buffer_bytes = 0 }
  for _, np in ipairs(model:named_parameters()) do
    local name, p = np[1], np[2]
    local owner = parent_path(name)
    local numel, bytes = p:numel(), tensor_bytes(p)
    local dtype, device = p.dtype, p.device
    if p:is_fake() then device = device .. ' (fake)' end
    local row = by_path[owner]
    row.shapes[#row.shapes + 1] = ('%s %s'):format(name:match('[^.]*$'), core.format_shape(p.shape))
    -- The owner and every ancestor count the tensor.
    local path = owner
    while true do
      local r = by_path[path]
      r.params, r.bytes, r.tensors = r.params + numel, r.bytes + bytes, r.tensors + 1
      r.dtypes[dtype], r.devices[device] = true, true
      if path == '' then break end
      path = parent_path(path)
    end
    data.total_params = data.total_params + numel
    data.total_bytes = data.total_bytes + bytes
    local t = data.by_dtype[dtype] or { params = 0, bytes = 0 }
    t.params, t.bytes = t.params + numel, t.bytes + bytes
    data.by_dtype[dtype] = t
    data.devices[device] = true
  end
  for _, nb in ipairs(model:named_buffers()) do
    data.buffers = data.buffers + nb[2]:numel()
    data.buffer_bytes = data.buffer_bytes + tensor_bytes(nb[2])
  end
  if opts.fold ~= false then all = fold_runs(all, modules) end
  local rows = {}
  for _, row in ipairs(all) do
    if row.depth <= max_depth then
      row.dtype = joined(row.dtypes)
      row.device = joined(row.devices)
      row.shape = table.concat(row.shapes, ', ')
      row.count = row.count or 1
      row.dtypes, row.devices, row.shapes = nil, nil, nil
      rows[#rows + 1] = row
    end
  end
  data.rows = rows
  data.device = joined(data.devices)
  data.devices = nil
  return data
end

-- The printed table of collected data.
function M.format(data)
  local header = { 'module', 'class', 'params', 'shape', 'dtype', 'bytes' }
  local right = { false, false, true, false, false, true }
  local lines = {}
  for i, row in ipairs(data.rows) do
    local name = row.name == '' and '(model)' or row.name
    lines[i] = { name, row.class, M.commas(row.params), row.shape, row.dtype,
                 row.params > 0 and M.human_bytes(row.bytes) or '' }
  end
  local widths = {}
  for c = 1, #header do
    widths[c] = #header[c]
    for _, l in ipairs(lines) do widths[c] = math.max(widths[c], #l[c]) end
  end
  local function render(cells)
    local out = {}
    for c = 1, #cells do
      local pad = (' '):rep(widths[c] - #cells[c])
      out[c] = right[c] and pad .. cells[c] or (c < #cells and cells[c] .. pad or cells[c])
    end
    return (table.concat(out, '  '):gsub('%s+$', ''))
  end
  local rule = {}
  for c = 1, #header do rule[c] = ('-'):rep(widths[c]) end
  local text = { render(header), render(rule) }
  for _, l in ipairs(lines) do text[#text + 1] = render(l) end
  text[#text + 1] = render(rule)
  text[#text + 1] = ('total: %s parameters, %s (%s bytes) on %s'):format(M.commas(data.total_params),
    M.human_bytes(data.total_bytes), M.commas(data.total_bytes), data.device ~= '' and data.device or '-')
  local dtypes = {}
  for dtype in pairs(data.by_dtype) do dtypes[#dtypes + 1] = dtype end
  table.sort(dtypes)
  if #dtypes > 1 then
    for _, dtype in ipairs(dtypes) do
      local t = data.by_dtype[dtype]
      text[#text + 1] = ('  %s: %s parameters, %s'):format(dtype, M.commas(t.params), M.human_bytes(t.bytes))
    end
  end
  if data.buffers > 0 then
    text[#text + 1] = ('buffers: %s elements, %s'):format(M.commas(data.buffers), M.human_bytes(data.buffer_bytes))
  end
  return table.concat(text, '\n')
end

local Summary = {}
Summary.__index = Summary
function Summary.__tostring(s)
  return ('summary: %s parameters, %s in %d modules'):format(M.commas(s.total_params),
    M.human_bytes(s.total_bytes), #s.rows)
end

-- fsdp.summary(model, opts): print the table (unless opts.print == false)
-- and return the data: rows (name, class, depth, params, bytes, tensors,
-- shape, dtype, device), total_params, total_bytes, by_dtype, buffers,
-- buffer_bytes, device; data.text is the printed table.
function M.summary(model, opts)
  local data = M.collect(model, opts)
  data.text = M.format(data)
  if not (opts and opts.print == false) then
    io.stdout:write(data.text, '\n')
    io.stdout:flush()
  end
  return setmetatable(data, Summary)
end

return M

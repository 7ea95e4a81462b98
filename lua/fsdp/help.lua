-- fsdp.help: the REPL's help(): what there is to use, found rather than
-- listed by hand, so it stays true as the library grows.
--
--   help()            the keys, the fsdp library, models/, recipes/ and the
--                     globals a recipe exposed (fsdp-lua -i recipe.lua)
--   help(value)       the fields and methods of a value (what Tab offers)
--
-- Models and recipes are the .lua files of the project root's models/ and
-- recipes/, each described by the first line of its header comment.
local M = {}

local complete = require 'fsdp.complete'

local function out(...) io.stdout:write(...) end

-- Names laid out in columns within `width`.
local function columns(names, indent, width)
  width = width or 80
  local longest = 0
  for _, n in ipairs(names) do longest = math.max(longest, #n) end
  local col = longest + 2
  local per_line = math.max(1, math.floor((width - #indent) / col))
  local lines, line = {}, {}
  for i, n in ipairs(names) do
    line[#line + 1] = n .. (' '):rep(col - #n)
    if #line == per_line or i == #names then
      lines[#lines + 1] = indent .. table.concat(line):gsub('%s+$', '')
      line = {}
    end
  end
  return table.concat(lines, '\n')
end

-- The .lua files of a directory with the first line of their header
-- comment ("-- models/llama.lua: the Llama 2 / ..." -> "the Llama 2 / ...").
local function described_files(dir)
  local files = {}
  local p = io.popen('ls ' .. ("'" .. dir:gsub("'", "'\\''") .. "'") .. ' 2>/dev/null')
  if not p then return files end
  for name in p:lines() do
    if name:match('%.lua$') then
      local f = io.open(dir .. '/' .. name)
      local first = f and f:read('*l') or ''
      if f then f:close() end
      local text = first:match('^%-%-%s*(.*)$') or ''
      text = text:gsub('^[%w_./-]+%.lua:%s*', '')
      files[#files + 1] = { name = name:gsub('%.lua$', ''), text = text }
    end
  end
  p:close()
  return files
end

local function sorted(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- The library's functions and submodules, split by kind.
local function library_names(fsdp)
  local funcs, tables = {}, {}
  for _, k in ipairs(sorted(complete.names(fsdp))) do
    if k:sub(1, 1) ~= '_' then
      local ok, v = pcall(function() return fsdp[k] end)
      if ok and type(v) == 'function' then funcs[#funcs + 1] = k
      elseif ok and type(v) == 'table' then tables[#tables + 1] = 'fsdp.' .. k end
    end
  end
  return funcs, tables
end

local function overview()
  local host = require 'fsdp.host'
  out('fsdp-lua ', tostring(host.version), ': an interactive Lua (LuaJIT) with the fsdp library.\n\n')
  out('keys: Tab completes names (fsdp.ra<Tab>, model.layers.0.<Tab>, x:<Tab> for methods),\n',
      '      Tab Tab lists the choices; Up/Down recall history (', tostring(host.history_file()),
      ');\n      Ctrl-C cancels the line or interrupts a run; Ctrl-D exits.\n',
      'values: expressions print their value; help(x) lists what x has.\n\n')
  local ok, fsdp = pcall(require, 'fsdp')
  if ok then
    local funcs, tables = library_names(fsdp)
    out("fsdp (global `fsdp`, or require 'fsdp'):\n", columns(funcs, '  '), '\n')
    out('  submodules: ', table.concat(tables, ' '), '\n')
    out("  e.g. fsdp.summary(model), fsdp.fake(fn, {device = 'cuda:0'}), fsdp.memory_stats('cpu')\n")
    out("       fsdp.plan(model, {world = 64, strategy = 'FULL_SHARD', mixed_precision = 'bf16',\n",
        "                 device = 'h100-80g', batch = 1, seq = 4096})   per-rank memory, comm, time\n",
        "       (devices: fsdp.devices.names(); the largest batch: fsdp.plan.max_batch(model, {...}))\n\n")
  else
    out('the fsdp library did not load: ', tostring(fsdp), '\n\n')
  end
  if host.root then
    local models = {}
    for _, m in ipairs(described_files(host.root .. '/models')) do
      if m.name ~= 'common' then models[#models + 1] = m end  -- shared code, not a model
    end
    if #models > 0 then
      out("models (local llama = require 'models.llama'; llama.build('Llama-2-70b', {device = 'meta'})):\n")
      for _, m in ipairs(models) do out(('  models.%-10s %s\n'):format(m.name, m.text)) end
      out('\n')
    end
    local recipes = described_files(host.root .. '/recipes')
    if #recipes > 0 then
      out('recipes (fsdp-lua recipes/NAME.lua --help; -i before it keeps its objects here):\n')
      for _, r in ipairs(recipes) do out(('  %-14s %s\n'):format(r.name, r.text)) end
    end
  end
  local recipe = package.loaded['fsdp.recipe']
  local exposed = recipe and recipe.exposed and sorted(recipe.exposed) or {}
  if #exposed > 0 then out('\nfrom the recipe: ', table.concat(exposed, ', '), '\n') end
end

-- What a value has: its fields and methods (functions), as Tab offers them.
local function describe(value)
  local fields, methods = {}, {}
  for _, k in ipairs(sorted(complete.names(value))) do
    if k:sub(1, 1) ~= '_' then
      local ok, v = pcall(function() return value[k] end)
      if ok and type(v) == 'function' then methods[#methods + 1] = k else fields[#fields + 1] = k end
    end
  end
  local mt = getmetatable(value)
  local class = type(mt) == 'table' and rawget(mt, '__name') or type(value)
  out(tostring(class), '\n')
  if #fields > 0 then out('fields:\n', columns(fields, '  '), '\n') end
  if #methods > 0 then out('methods:\n', columns(methods, '  '), '\n') end
  if #fields == 0 and #methods == 0 then out('(nothing to list)\n') end
end

function M.help(...)
  if select('#', ...) == 0 then overview() else describe((...)) end
  io.stdout:flush()
end

return M

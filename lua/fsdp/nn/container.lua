-- fsdp.nn.container: the containers of modules, as in PyTorch.
--
--   nn.Sequential(m1, m2, ...)        calls its children in order
--   nn.ModuleList({m1, m2, ...})      holds children; its forward is the caller's
--   nn.ModuleDict({{'a', m1}, ...})   children by name, in insertion order
--
-- Children of Sequential and ModuleList are named '0', '1', ... (PyTorch's
-- names, so checkpoint keys such as "layers.0.mlp.up_proj.weight" match),
-- and are also stored as a Lua array so `#list` and `ipairs(list)` work:
-- Lua position i holds the child named i-1.
local core = require 'fsdp.core'
local Module = require 'fsdp.nn.module'
local repr = require 'fsdp.nn.repr'
local tables = require 'fsdp.tables'

local M = {}

local function append(self, m, what)
  if not Module.is_module(m) then
    core.fail(('%s: element %d is a %s, not a Module'):format(what, #self + 1, type(m)))
  end
  local n = #self
  self:add_module(tostring(n), m)
  rawset(self, n + 1, m)
  return self
end

-- Sequential ---------------------------------------------------------------------------

local Sequential = Module:extend('Sequential')
M.Sequential = Sequential

-- nn.Sequential(m1, m2, ...) or nn.Sequential({{'conv', m1}, {'relu', m2}})
-- for named children (PyTorch's OrderedDict form).
function Sequential:__init(...)
  local first = ...
  if select('#', ...) == 1 and type(first) == 'table' and not Module.is_module(first) then
    for i, pair in ipairs(first) do
      if type(pair) ~= 'table' or Module.is_module(pair) then
        core.fail(('Sequential: entry %d of the named form must be a {name, module} pair'):format(i))
      end
      self:add_module(pair[1], pair[2])
      rawset(self, i, pair[2])
    end
    return
  end
  for i = 1, select('#', ...) do append(self, (select(i, ...)), 'Sequential') end
end

function Sequential:append(m) return append(self, m, 'Sequential:append') end

function Sequential:forward(x, ...)
  local out = x
  for i = 1, #self do
    if i == 1 then out = self[i](x, ...) else out = self[i](out) end
  end
  return out
end

-- ModuleList ----------------------------------------------------------------------------

local ModuleList = Module:extend('ModuleList')
M.ModuleList = ModuleList
-- Holders are never called, only their children are: fsdp.shard will not
-- make one a unit (its parameters would never be gathered).
ModuleList.is_holder = true

function ModuleList:__init(modules)
  if modules ~= nil and type(modules) ~= 'table' then
    core.fail(('ModuleList expects an array of modules, got %s'):format(type(modules)))
  end
  for _, m in ipairs(modules or {}) do append(self, m, 'ModuleList') end
end

function ModuleList:append(m) return append(self, m, 'ModuleList:append') end

-- list:extend({m3, m4}) appends modules. (On the class, ModuleList:extend
-- ('Name') derives a new class as for every module.)
function ModuleList:extend(modules)
  if rawget(self, '__is_module_class') then return Module.extend(self, modules) end
  for _, m in ipairs(modules) do append(self, m, 'ModuleList:extend') end
  return self
end

function ModuleList:forward()
  core.fail('ModuleList has no forward(); iterate over it: for i, layer in ipairs(list) do ... end')
end

-- PyTorch's ModuleList repr: runs of children with identical reprs are
-- collapsed into one entry "(0-31): 32 x Block(...)".
function ModuleList:__repr()
  local n = #self
  if n == 0 then return self:class_name() .. '()' end
  local reprs = {}
  for i = 1, n do reprs[i] = tostring(self[i]) end
  local lines = {}
  local start = 1
  for i = 2, n + 1 do
    if i > n or reprs[i] ~= reprs[start] then
      local s
      if i - 1 == start then
        s = ('(%d): %s'):format(start - 1, reprs[start])
      else
        s = ('(%d-%d): %d x %s'):format(start - 1, i - 2, i - start, reprs[start])
      end
      lines[#lines + 1] = repr.addindent(s, 2)
      start = i
    end
  end
  return self:class_name() .. '(\n  ' .. table.concat(lines, '\n  ') .. '\n)'
end

-- ModuleDict -----------------------------------------------------------------------------

local ModuleDict = Module:extend('ModuleDict')
M.ModuleDict = ModuleDict
ModuleDict.is_holder = true

-- nn.ModuleDict({{'a', m1}, {'b', m2}}) keeps that order; a plain map
-- {a = m1, b = m2} is inserted in sorted key order (Lua maps have none).
function ModuleDict:__init(entries)
  if entries == nil then return end
  if type(entries) ~= 'table' then
    core.fail(('ModuleDict expects a table of modules, got %s'):format(type(entries)))
  end
  if #entries > 0 then
    for i, pair in ipairs(entries) do
      if type(pair) ~= 'table' or Module.is_module(pair) then
        core.fail(('ModuleDict: entry %d must be a {name, module} pair'):format(i))
      end
      self:add_module(pair[1], pair[2])
    end
    return
  end
  for _, k in ipairs(tables.sorted_keys(entries)) do self:add_module(k, entries[k]) end
end

function ModuleDict:get(name) return rawget(self, '_modules')[name] end
function ModuleDict:set(name, m) return self:add_module(name, m) end

function ModuleDict:keys()
  local out = {}
  for _, nc in ipairs(self:named_children()) do out[#out + 1] = nc[1] end
  return out
end

-- for name, m in dict:items() do ... end, in insertion order.
function ModuleDict:items()
  local list, i = self:named_children(), 0
  return function()
    i = i + 1
    local e = list[i]
    if e then return e[1], e[2] end
  end
end

function ModuleDict:forward()
  core.fail('ModuleDict has no forward(); look its modules up by name')
end

return M

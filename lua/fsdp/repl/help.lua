-- fsdp.repl.help: the REPL's help(): what there is to use, found rather than
-- listed by hand, so it stays true as the library grows.
--
--   help()            the keys, the fsdp library, models/, recipes/ and the
--                     globals a recipe exposed (fsdp-lua -i options.lua)
--   help(fn)          a function's signature, options and description
--   help(value)       the fields and methods of a value (what Tab offers),
--                     after its module's description when it is a module
--
-- Models and recipes are the .lua files of the project root's models/ and
-- recipes/, each described by the first sentence of its header comment.
--
-- [Note: help texts are doc comments]
-- A function's help is the comment block right above its definition in
-- the source (debug.getinfo says where), or, when that is empty (a
-- function made by a factory, an anonymous forwarder), above the line
-- that assigns it to its public name. A first line `name(args): ...`
-- (`fsdp.plan(model, opts): ...`) is the signature; otherwise the
-- signature is made from the definition's parameters. An nn.Module class
-- shows its constructor (__init without self) and the comment above its
-- `Module:extend('Name')`, else its file's header. A function that
-- takes an options table documents every option it reads, with its
-- default, in that comment (`opts: dtype ('f32'), device (...)`), and the
-- comment ends with a full sentence: tests/lua/help_spec.lua walks every
-- public function of `fsdp` and checks both against the source. A public
-- name that forwards to a function loaded later (fsdp.shard to
-- fsdp.sharding.shard) registers the target in fsdp's `_forwards` so help
-- shows the target's comment.
local M = {}

local complete = require 'fsdp.repl.complete'
local tables = require 'fsdp.tables'

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

-- The first sentence of a header comment's first paragraph (after the
-- "file.lua:" prefix): it ends at a '.' followed by the end of the
-- paragraph or by a capital letter, outside parentheses.
function M.first_sentence(paragraph)
  local depth = 0
  for k = 1, #paragraph do
    local c = paragraph:sub(k, k)
    if c == '(' then depth = depth + 1
    elseif c == ')' then depth = math.max(0, depth - 1)
    elseif c == '.' and depth == 0 then
      local after = paragraph:sub(k + 1)
      if after == '' or after:match('^%s+%u') then return paragraph:sub(1, k) end
    end
  end
  return paragraph
end

-- The comment lines at the start of a file, up to its first blank comment
-- line or code: the header's first paragraph, joined.
local function header_paragraph(path)
  local f = io.open(path)
  if not f then return '' end
  local parts = {}
  for line in f:lines() do
    local text = line:match('^%-%-%s?(.*)$')
    if not text or text:match('^%s*$') then break end
    parts[#parts + 1] = text
  end
  f:close()
  return (table.concat(parts, ' '):gsub('%s+', ' '):gsub('^[%w_./-]+%.lua:%s*', ''))
end

-- What help() says of a models/ or recipes/ file: the first sentence of
-- its header comment.
function M.file_summary(path) return M.first_sentence(header_paragraph(path)) end

-- The .lua files of a directory, each with the first sentence of its
-- header comment ("-- models/llama.lua: the Llama 2 / ..." -> "the Llama 2 / ...").
local function described_files(dir)
  local files, lfs = {}, require 'lfs'
  if lfs.attributes(dir, 'mode') ~= 'directory' then return files end
  local names = {}
  for name in lfs.dir(dir) do
    -- (a FIFO or a device named .lua would block the header's read)
    if name:match('^[^.].*%.lua$') and lfs.attributes(dir .. '/' .. name, 'mode') == 'file' then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    files[#files + 1] = { name = name:gsub('%.lua$', ''), text = M.file_summary(dir .. '/' .. name) }
  end
  return files
end

-- Words laid out in lines that fit in `width` after `indent` (the first
-- line's own prefix is as long), every line after the first indented.
local function wrap(text, indent, width)
  width = width or 80
  local lines, line = {}, ''
  for word in text:gmatch('%S+') do
    if line ~= '' and #indent + #line + 1 + #word > width then
      lines[#lines + 1] = line
      line = word
    else
      line = line == '' and word or (line .. ' ' .. word)
    end
  end
  lines[#lines + 1] = line
  return table.concat(lines, '\n' .. indent)
end

local sorted = tables.sorted_keys

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
  -- lazy: optional (pcall): the overview still shows the keys when the library fails to load
  local ok, fsdp = pcall(require, 'fsdp')
  if ok then
    local funcs, tables = library_names(fsdp)
    out("fsdp (global `fsdp`, or require 'fsdp'):\n", columns(funcs, '  '), '\n')
    out('  submodules: ', table.concat(tables, ' '), '\n')
    out("  e.g. fsdp.summary(model), fsdp.fake(fn, {device = 'cuda:0'}), fsdp.memory_stats('cpu')\n")
    out("       fsdp.plan(model, {nodes = 8, strategy = 'FULL_SHARD', mixed_precision = 'bf16',\n",
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
      for _, m in ipairs(models) do
        out(('  models.%-10s %s\n'):format(m.name, wrap(m.text, (' '):rep(20))))
      end
      out('\n')
    end
    local recipes = described_files(host.root .. '/recipes')
    if #recipes > 0 then
      out('recipes (fsdp-lua recipes/NAME.lua --help; -i before it keeps its objects here):\n')
      for _, r in ipairs(recipes) do
        out(('  %-14s %s\n'):format(r.name, wrap(r.text, (' '):rep(17))))
      end
    end
  end
  local options = package.loaded['fsdp.options']
  local exposed = options and options.exposed and sorted(options.exposed) or {}
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

-- Functions: where they are defined, their doc comment, their options --------

-- The comment lines at the top of a file, its "fsdp.x.y:" prefix taken off.
local function header_comment(lines)
  local doc = {}
  for _, l in ipairs(lines or {}) do
    local text = l:match('^%-%-%s?(.*)$')
    if not text then break end
    doc[#doc + 1] = text
  end
  if doc[1] then doc[1] = doc[1]:gsub('^[%w_./]+:%s*', '') end
  return doc
end

local source_cache = {}
local function source_lines(path)
  if source_cache[path] == nil then
    local lines = false
    local f = path and io.open(path)
    if f then
      lines = {}
      for l in f:lines() do lines[#lines + 1] = l end
      f:close()
    end
    source_cache[path] = lines
  end
  return source_cache[path] or nil
end

-- The comment block right above line n (contiguous `--` lines), as text
-- lines without the `-- ` marks; {} when there is none.
local function comment_above(lines, n)
  local parts = {}
  local i = n - 1
  while i >= 1 and lines[i]:match('^%s*%-%-') and not lines[i]:match('^%s*%-%-%[%[') do
    table.insert(parts, 1, (lines[i]:gsub('^%s*%-%-%s?', '')))
    i = i - 1
  end
  return parts
end

local function module_file(modname)
  return package.searchpath and package.searchpath(modname, package.path) or nil
end

-- The public keys of table t holding value, sorted.
local function keys_of(t, value)
  local keys = {}
  for k, v in pairs(t) do
    if rawequal(v, value) and type(k) == 'string' and k:sub(1, 1) ~= '_' then keys[#keys + 1] = k end
  end
  table.sort(keys)
  return keys
end

-- The public name of a value: 'fsdp.KEY' when the library holds it, else
-- 'fsdp.SUB.KEY' for a table the library holds (fsdp.dist, fsdp.cuda),
-- else 'MODULE.KEY' for a loaded fsdp or models module (sorted, so the
-- same value always gets the same name), with the module's name (nil for
-- a plain table) and the key.
function M.name_of(value)
  local fsdp = package.loaded.fsdp
  if type(fsdp) == 'table' then
    local keys = keys_of(fsdp, value)
    if keys[1] then return 'fsdp.' .. keys[1], 'fsdp', keys[1] end
    local subs = {}
    for k, v in pairs(fsdp) do
      if type(k) == 'string' and k:sub(1, 1) ~= '_' and type(v) == 'table' then subs[#subs + 1] = k end
    end
    table.sort(subs)
    for _, sub in ipairs(subs) do
      keys = keys_of(fsdp[sub], value)
      if keys[1] then
        local modname
        for name, mod in pairs(package.loaded) do
          if rawequal(mod, fsdp[sub]) then modname = name end
        end
        return ('fsdp.%s.%s'):format(sub, keys[1]), modname, keys[1]
      end
    end
  end
  local mods = {}
  for modname, mod in pairs(package.loaded) do
    if type(mod) == 'table' and type(modname) == 'string'
       and (modname:match('^fsdp%.') or modname:match('^models%.')) then
      mods[#mods + 1] = modname
    end
  end
  table.sort(mods)
  for _, modname in ipairs(mods) do
    local keys = {}
    for k, v in pairs(package.loaded[modname]) do
      if rawequal(v, value) and type(k) == 'string' and k:sub(1, 1) ~= '_' then keys[#keys + 1] = k end
    end
    table.sort(keys)
    if keys[1] then return modname .. '.' .. keys[1], modname, keys[1] end
  end
end

-- The loaded module a value is, if any (its name).
local function module_name(value)
  local names = {}
  for modname, mod in pairs(package.loaded) do
    if rawequal(mod, value) and type(modname) == 'string' then names[#names + 1] = modname end
  end
  table.sort(names)
  return names[1]
end

-- The function behind a callable: itself; for a callable module
-- (fsdp.plan), the module's function of its own name (plan.plan) when it
-- has one, else its __call; or what a forwarder registered in
-- fsdp._forwards resolves to.
local function target_of(value)
  local f = value
  if type(value) == 'table' and rawget(value, '__is_module_class') then
    -- an nn.Module class: its constructor (a class without one builds with
    -- no arguments: its forward says where it is defined)
    return rawget(value, '__init') or rawget(value, 'forward')
  end
  if type(value) == 'table' then
    local mt = getmetatable(value)
    f = type(mt) == 'table' and rawget(mt, '__call') or nil
    local modname = f and module_name(value)
    local own = modname and rawget(value, modname:match('([%w_]+)$'))
    if type(own) == 'function' then f = own end
  end
  if type(f) ~= 'function' then return nil end
  local fsdp = package.loaded.fsdp
  local forwards = type(fsdp) == 'table' and rawget(fsdp, '_forwards')
  if forwards and forwards[f] then
    local ok, target = pcall(forwards[f])
    if ok and type(target) == 'function' then f = target end
  end
  return f
end

-- The parameter names of a Lua function ('...' for a vararg); a callable
-- table's __call loses its first (the table itself).
local function params_of(f, is_table)
  local info = debug.getinfo(f, 'u')
  local names = {}
  for i = 1, info.nparams or 0 do names[#names + 1] = debug.getlocal(f, i) end
  if info.isvararg then names[#names + 1] = '...' end
  if is_table then table.remove(names, 1) end
  return names
end

-- What help knows of a callable: { name =, signature =, doc = {lines},
-- where = 'file:line', options = {keys of its options table it reads} }.
-- nil for a value that is not callable.
function M.info(value)
  local f = target_of(value)
  if not f then return nil end
  local name, modname, key = M.name_of(value)
  name = name or 'function'
  local info = debug.getinfo(f, 'S')
  local path = info.source:sub(1, 1) == '@' and info.source:sub(2) or nil
  local lines = source_lines(path)
  local doc, def = {}, nil
  if lines and info.linedefined > 0 then
    def = lines[info.linedefined]
    doc = comment_above(lines, info.linedefined)
  end
  if #doc == 0 and key then
    -- the line that gives it its public name, in the file that defines it
    -- or in its module's
    for _, mlines in ipairs({ lines or {}, modname and source_lines(module_file(modname)) or {} }) do
      local k = key:gsub('%p', '%%%0')
      for i, l in ipairs(mlines) do
        if l:match('^M%.' .. k .. '%s*=') or l:match('^function%s+M%.' .. k .. '%s*%(') then
          doc = comment_above(mlines, i)
          if #doc > 0 then break end
        end
      end
      if #doc > 0 then break end
    end
  end
  -- a callable module: its header comment
  local modname_of_value = type(value) == 'table' and module_name(value)
  if modname_of_value then doc = header_comment(source_lines(module_file(modname_of_value))) end
  -- an nn.Module class: the comment above its `Module:extend('Name')`, else
  -- its file's header
  local class = type(value) == 'table' and rawget(value, '__is_module_class') and rawget(value, '__name')
  if class and lines then
    doc = {}
    for i, l in ipairs(lines) do
      if l:find(("extend('%s')"):format(class), 1, true) or l:find(('extend("%s")'):format(class), 1, true) then
        doc = comment_above(lines, i)
        break
      end
    end
    if #doc == 0 then doc = header_comment(lines) end
  end
  -- the signature: a first doc line "name(args): ..." or "name(args)", else the parameters
  local signature
  local first = doc[1] or ''
  local call = first:match('^([%w_.:]+%b())')
  -- (a signature of this function: `F.lt(a, b)` heading the comparisons'
  -- shared comment is not F.eq's, `softmax(...)` starting a formula neither)
  if call and key and call:match('([%w_]+)%b()$') ~= key then call = nil end
  if call then
    signature = call:gsub('^[%w_.:]-([%w_]+%b())$', '%1')
    signature = name:gsub('[%w_]+$', '') .. signature
    doc[1] = first:sub(#call + 1):gsub('^:%s*', '')
    if doc[1] == '' then table.remove(doc, 1) end
    -- the first paragraph lost its start to the signature: flow it again
    local n = 0
    while doc[n + 1] and doc[n + 1]:match('^%S') do n = n + 1 end
    if n > 0 then
      local text = table.concat(doc, ' ', 1, n)
      local flowed = {}
      for l in (wrap(text, '', 76) .. '\n'):gmatch('(.-)\n') do flowed[#flowed + 1] = l end
      for _ = 1, n do table.remove(doc, 1) end
      for k = #flowed, 1, -1 do table.insert(doc, 1, flowed[k]) end
    end
  else
    local is_call = type(value) == 'table' and not rawequal(f, rawget(value, (name:match('([%w_]+)$'))))
    local params = params_of(f, class or is_call)     -- a class's __init(self, ...): self goes
    if class and not rawget(value, '__init') then params = {} end
    signature = ('%s(%s)'):format(name, table.concat(params, ', '))
  end
  -- the options it reads: `opts.key` in its body, for a parameter named opts/options
  local options, seen = {}, {}
  if lines and info.linedefined > 0 then
    local params = params_of(f, false)
    for _, p in ipairs(params) do
      if p == 'opts' or p == 'options' then
        for i = info.linedefined, info.lastlinedefined do
          for k in (lines[i]:gsub('%-%-.*$', '')):gmatch(p .. '%.([%a_][%w_]*)') do
            if not seen[k] then seen[k] = true; options[#options + 1] = k end
          end
        end
      end
    end
  end
  return { name = name, signature = signature, doc = doc, options = options,
           where = path and (path:gsub('^.*/lua/', 'lua/') .. ':' .. info.linedefined) or info.short_src }
end

-- A module's description: the header comment of its file, when the value
-- is a loaded module.
local function module_doc(value)
  local modname = module_name(value)
  if not modname then return nil end
  local path = module_file(modname)
  local lines = source_lines(path)
  if not lines then return nil end
  local parts = {}
  for _, l in ipairs(lines) do
    local text = l:match('^%-%-%s?(.*)$')
    if not text then break end
    parts[#parts + 1] = text
  end
  return modname, parts
end

local function show_function(value)
  local i = M.info(value)
  out(i.signature, '\n')
  for _, l in ipairs(i.doc) do out('  ', l, '\n') end
  if #i.doc == 0 then out('  (no description)\n') end
  out('  [', i.where, ']\n')
end

function M.help(...)
  if select('#', ...) == 0 then
    overview()
  else
    local value = ...
    if M.info(value) then
      show_function(value)
      if type(value) == 'table' then describe(value) end
    else
      local name, doc = module_doc(value)
      if name then
        out(name, ':\n')
        for _, l in ipairs(doc) do out('  ', l, '\n') end
      end
      describe(value)
    end
  end
  io.stdout:flush()
end

return M

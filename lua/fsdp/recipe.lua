-- fsdp.recipe: the command line and configuration of training recipes.
--
--   local recipe = require 'fsdp.recipe'
--   local cfg = recipe.config({
--     model = {'Llama-2-7b', 'model config name'},
--     lr = {3e-4, 'peak learning rate'},
--     ...
--   }, arg)
--
-- Every key of the defaults is overridable as --key=value, typed by its
-- default (numbers, booleans: true/false/1/0/yes/no, strings); a flag
-- without a value sets a boolean to true (--dry-run is --dry_run=true:
-- dashes and underscores are the same). An unknown key is an error that
-- lists the valid ones. --config file.lua layers a Lua file returning a
-- table of keys first, so the command line wins over it. --help prints the
-- keys with their defaults and descriptions.
local M = {}

local function canonical(key) return (key:gsub('%-', '_')) end

local function parse_value(key, text, default)
  local t = type(default)
  if t == 'number' then
    local n = tonumber(text)
    if not n then error(('--%s expects a number, got %q'):format(key, text), 0) end
    return n
  elseif t == 'boolean' then
    local map = { ['true'] = true, ['1'] = true, yes = true, ['false'] = false, ['0'] = false, no = false }
    local b = map[text:lower()]
    if b == nil then error(('--%s expects true or false, got %q'):format(key, text), 0) end
    return b
  end
  return text
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- The usage text of a spec.
function M.usage(spec, script)
  local lines = { ('usage: fsdp-lua %s [--key=value ...] [--config file.lua]'):format(script or 'recipe.lua'), '' }
  for _, k in ipairs(sorted_keys(spec)) do
    local d = spec[k]
    lines[#lines + 1] = ('  --%-28s %-14s %s'):format(k, tostring(d[1]), d[2] or '')
  end
  return table.concat(lines, '\n')
end

local function apply(cfg, spec, key, value, source)
  key = canonical(key)
  local d = spec[key]
  if not d then
    error(('unknown option %s%s (valid: %s)'):format(source == 'cli' and '--' or '', key,
      table.concat(sorted_keys(spec), ', ')), 0)
  end
  if type(value) == 'string' and type(d[1]) ~= 'string' then value = parse_value(key, value, d[1]) end
  if type(d[1]) ~= type(value) and d[1] ~= nil then
    error(('option %s expects a %s, got %s'):format(key, type(d[1]), type(value)), 0)
  end
  cfg[key] = value
end

-- Resolve a config from spec = {key = {default, description}} and the
-- script's arguments. Returns the config table and the positional
-- arguments. Exits after printing usage on --help; a bad option prints its
-- message (no traceback: it is a usage mistake, not a program error) and
-- exits with status 2.
function M.config(spec, args, script)
  local ok, cfg, positional = pcall(M.parse, spec, args, script)
  if not ok then
    io.stderr:write(('fsdp-lua: %s\nTry --help for the options.\n'):format(tostring(cfg)))
    os.exit(2)
  end
  return cfg, positional
end

-- M.config without the exit: raises an error for a bad option.
function M.parse(spec, args, script)
  local cfg, positional = {}, {}
  for k, d in pairs(spec) do cfg[k] = d[1] end
  args = args or {}
  -- A --config file first, so the command line overrides it.
  for i, a in ipairs(args) do
    local path = a:match('^%-%-config=(.+)$') or (a == '--config' and args[i + 1])
    if path then
      local chunk, err = loadfile(path)
      if not chunk then error(('--config %s: %s'):format(path, err), 0) end
      local ok, t = pcall(chunk)
      if not ok or type(t) ~= 'table' then
        error(('--config %s: must return a table of options (%s)'):format(path, tostring(t)), 0)
      end
      for _, k in ipairs(sorted_keys(t)) do apply(cfg, spec, k, t[k], 'file') end
    end
  end
  local skip = false
  for i, a in ipairs(args) do
    if skip then
      skip = false
    elseif a == '--help' or a == '-h' then
      print(M.usage(spec, script))
      os.exit(0)
    elseif a == '--config' then
      skip = true
    elseif a:match('^%-%-config=') then
      -- handled above
    elseif a:match('^%-%-') then
      local key, value = a:match('^%-%-([%w_%-]+)=(.*)$')
      if not key then
        key = canonical(a:sub(3))
        local d = spec[key]
        if d and type(d[1]) ~= 'boolean' then
          error(('--%s expects a value (--%s=...)'):format(key, key), 0)
        end
        value = 'true'
      end
      apply(cfg, spec, key, value, 'cli')
    else
      positional[#positional + 1] = a
    end
  end
  return cfg, positional
end

-- Names a recipe exposed (a set), for the REPL's help().
M.exposed = {}

-- Make a recipe's objects globals for the REPL that follows when the
-- recipe runs with -i (`fsdp-lua -i recipes/llama2_7b.lua --dry-run`, then
-- `model`, `cfg` at the prompt). Without -i it does nothing: a recipe's
-- locals stay local. Returns its argument.
-- Option specs combined, later tables winning on a clash: the shared
-- option sets (fsdp.sharding.recipe, fsdp.checkpointing.recipe) under a
-- recipe's own.
function M.merge(...)
  local all = {}
  for i = 1, select('#', ...) do
    for k, v in pairs((select(i, ...))) do all[k] = v end
  end
  return all
end

function M.expose(objects)
  local ok, host = pcall(require, 'fsdp.host')
  if not (ok and host.interactive) then return objects end
  for k, v in pairs(objects) do
    rawset(_G, k, v)
    M.exposed[k] = true
  end
  return objects
end

-- The resolved config as printed at the start of a run.
function M.format(cfg)
  local lines = {}
  for _, k in ipairs(sorted_keys(cfg)) do lines[#lines + 1] = ('  %s = %s'):format(k, tostring(cfg[k])) end
  return table.concat(lines, '\n')
end

return M

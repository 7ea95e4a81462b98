-- fsdp.config_file: the files `--config FILE` reads (YAML or Lua) and the
-- resolved config a run writes beside its checkpoints (YAML that --config
-- reads back), for fsdp.options.
--
--   local t, where = config_file.read('run.yaml')   -- {lr = 1e-4, ...}, {lr = 'training.lr'}
--   config_file.write('ck/config.yaml', {lr = 1e-4, model = 'tiny'}, 'recipes/llama2_7b.lua')
--
-- [Note: config files]
-- A file ending in .yaml or .yml is YAML (Debian's lua-yaml, `lyaml`); any
-- other is Lua returning a table. Both hold the recipe's options by name
-- (aliases too), either at the top level or in sections one level deep,
-- whose names are free: `training: {lr: 1e-4}` is lr, as `lr: 1e-4` is.
-- A section is any key that is not an option and holds a table; deeper
-- nesting, a key set twice (at the top and in a section, or in two
-- sections), a key without a value and an unknown key are refused in one
-- line naming the file and the key as written ("training.lrr"). The
-- command line overrides the file (fsdp.options applies the file first).
local files = require 'fsdp.io.files'
local tables = require 'fsdp.tables'
local M = {}

-- (keys of YAML mappings may mix numbers and strings)
local function sorted_keys(t) return tables.sorted_keys(t, tables.by_string) end

local function is_yaml(path) return path:lower():match('%.ya?ml$') ~= nil end

-- The table a file holds, before flattening. Raises "--config PATH: why".
local function load(path)
  -- read like every input: a regular file, up to a bound
  -- (fsdp.io.files: [Note: inputs are regular files])
  local text, why = files.read(path, files.LIMITS.text[1], 'a --config file')
  if not text then error(('--config: %s'):format(why), 0) end
  if is_yaml(path) then
    local ok, lyaml = pcall(require, 'lyaml')
    if not ok then
      error(('--config %s: reading YAML needs the lyaml module (Debian: apt-get install lua-yaml)'):format(path), 0)
    end
    local parsed, t = pcall(lyaml.load, text)
    if not parsed then
      error(('--config %s: not valid YAML: %s'):format(path, (tostring(t):gsub('^[^\n:]+:%d+: ', ''))), 0)
    end
    if t == nil then t = {} end -- an empty file
    if type(t) ~= 'table' or #t > 0 then
      error(('--config %s: must hold a mapping of options (key: value), not %s'):format(path,
        type(t) == 'table' and 'a list' or type(t)), 0)
    end
    return t, lyaml.null
  end
  local chunk, err = loadstring(text, '@' .. path)
  if not chunk then
    local hint = text:match('^%s*[%w_]+%s*:') and ' (a YAML file must end in .yaml or .yml)' or ''
    error(('--config %s: %s%s'):format(path, err, hint), 0)
  end
  local ok, t = pcall(chunk)
  if not ok or type(t) ~= 'table' then
    error(('--config %s: must return a table of options (%s)'):format(path, tostring(t)), 0)
  end
  return t
end

-- The options of the file at `path` as a flat table name -> value, and
-- where each came from (name -> the key as written, 'training.lr').
-- is_option(name): whether a key is an option (or an alias), so a table
-- under it is a value, not a section. unknown(name, written): raises the
-- refusal of an unknown key.
function M.read(path, is_option, unknown)
  local t, null = load(path)
  local out, where = {}, {}
  local function add(k, v, written)
    if type(k) ~= 'string' then
      error(('--config %s: %s is not an option name'):format(path, tostring(written)), 0)
    end
    if v == null then error(('--config %s: %s has no value'):format(path, written), 0) end
    if not is_option(k) then unknown(k, written) end
    if where[k] then
      error(('--config %s: %s and %s set the same option: give it once'):format(path, where[k], written), 0)
    end
    out[k], where[k] = v, written
  end
  for _, k in ipairs(sorted_keys(t)) do
    local v = t[k]
    if type(k) == 'string' and type(v) == 'table' and v ~= null and not is_option(k) then
      for _, k2 in ipairs(sorted_keys(v)) do
        local written = ('%s.%s'):format(k, tostring(k2))
        if type(v[k2]) == 'table' and v[k2] ~= null then
          error(('--config %s: %s: sections nest one level (training: {lr: 1e-4} sets lr)'):format(path, written), 0)
        end
        add(k2, v[k2], written)
      end
    else
      add(k, v, tostring(k))
    end
  end
  return out, where
end

-- A value as YAML writes it and reads back the same: strings quoted
-- (JSON's escapes are YAML's), numbers in the fewest digits that give the
-- same double back.
local function yaml_value(v)
  if type(v) == 'string' then return require('cjson').encode(v):gsub('\\/', '/') end
  if type(v) == 'number' then
    if v == math.floor(v) and math.abs(v) < 2^53 then return ('%d'):format(v) end
    for digits = 1, 17 do
      local s = ('%.' .. digits .. 'g'):format(v)
      if tonumber(s) == v then return s end
    end
  end
  return tostring(v)
end
M.yaml_value = yaml_value

-- The lines "key: value" of cfg's keys `keys` (all when nil), sorted.
function M.yaml_lines(cfg, keys)
  local lines = {}
  for _, k in ipairs(keys or sorted_keys(cfg)) do lines[#lines + 1] = ('%s: %s'):format(k, yaml_value(cfg[k])) end
  return lines
end

-- Write `cfg` (name -> value) to `path` as YAML that --config reads, with
-- a comment naming the script that takes it. Replaces the file whole
-- (written beside it, then renamed). Returns the path.
function M.write(path, cfg, script)
  local text = ('# resolved options of this run: fsdp-lua %s --config %s\n%s\n'):format(script or 'RECIPE', path,
    table.concat(M.yaml_lines(cfg), '\n'))
  local tmp = path .. '.tmp'
  local f = assert(io.open(tmp, 'w'))
  f:write(text)
  f:close()
  assert(os.rename(tmp, path))
  return path
end

return M

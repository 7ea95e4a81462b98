-- fsdp.options: the command line and configuration of training recipes.
--
--   local options = require 'fsdp.options'
--   local cfg = options.config({
--     model = {'Llama-2-7b', 'model config name', one_of = names},
--     lr = {3e-4, 'peak learning rate', positive = true},
--     warmup_steps = {10, 'linear warmup steps', int = true, min = 0, less_than = 'max_steps'},
--     ...
--   }, arg, 'recipes/x.lua', function(cfg) ... checks needing the model config ... end)
--
-- Every key of the defaults is overridable as --key=value, typed by its
-- default (numbers, booleans: true/false/1/0/yes/no, strings); a flag
-- without a value sets a boolean to true (--dry-run is --dry_run=true:
-- dashes and underscores are the same). --config file.lua layers a Lua
-- file returning a table of keys first, so the command line wins over it.
-- --help prints the keys with their defaults, descriptions and constraints.
--
-- [Note: options are checked before anything is built]
-- Each spec entry carries its constraints (M.CONSTRAINTS below), and every
-- option is checked against them as the command line is read: types,
-- integer-ness, ranges, enums, relations between options, and paths
-- (inputs exist; outputs' directories are created and shown writable by a
-- probe file). A recipe's own checks that need more than one value (its
-- model config: heads dividing the width, a model name's fields) go in the
-- function passed as options.config's fourth argument, which runs right
-- after. Any failure is a usage error: one line `fsdp-lua: --key ...`
-- naming the option, no traceback, exit status 2, before a model is built
-- or a byte allocated. An unknown option, enum value or model config key
-- gets a "did you mean ...?" (fsdp.suggest). --validate_options stops
-- after the checks (recipes/sweep.lua checks a whole grid that way before
-- running any point).
--
-- [Note: option aliases]
-- An entry may list other names for its option (`aliases`): the seed's
-- PyTorch recipe calls --seq_len --max_context_width, and its sbatch lines
-- run unchanged here. An alias is a list entry (a plain other name) or
-- name = translation, where the translation maps the alias's values to the
-- option's ({llama_v2 = 'Llama-2-7b'}: any other value is refused naming
-- those it knows) or is a function(text) returning the option's value, or
-- nil and why not, and optionally a table of other options the value
-- implies ({checkpoint_dir = text} for --resume_from_checkpoint=DIR). A
-- translation with a `true` key also makes the alias a flag (--bf16).
-- `values` maps other spellings of an option's values under any of its
-- names (full = 'FULL_SHARD'). Every check then runs on the translated
-- value and names the option as the user wrote it: "--max_context_width
-- must be >= 1". The same option given under two names, or an implied
-- option given otherwise with another value, is refused. --help lists each
-- option's aliases.
local suggest = require 'fsdp.suggest'
local checks = require 'fsdp.validate'
local core = require 'fsdp.core'
local publish = require 'fsdp.io.publish'
local files = require 'fsdp.io.files'
local config_file = require 'fsdp.config_file'
local hub = require 'fsdp.data.hub'
local tables = require 'fsdp.tables'

local M = {}

-- Constraints a spec entry may carry (besides [1] the default and [2] the
-- description). Relations name another option of the same spec and are
-- checked when both are set (a number other than 0, a non-empty string,
-- true): 0 and '' mean "off" or "keep the model's" throughout the recipes.
M.CONSTRAINTS = {
  int = 'the value is an integer',
  min = 'the value is >= this',
  max = 'the value is <= this',
  positive = 'the value is > 0',
  below = 'the value is < this',
  one_of = 'the value is one of this list (or of what this function returns)',
  input = "a path that must exist (true; 'file' or 'dir' to require that kind; 'glob': or a glob pattern, "
          .. 'which its reader expands), unless empty; a file must be a regular file (no FIFO, no device)',
  stdin = "with input = 'file': '-' means standard input",
  hub = 'with input: a Hugging Face hub name OWNER/NAME[@REVISION] that is not a local path is looked up in the hub '
        .. "cache instead (fsdp.data.hub's model_dir: a snapshot holding a config.json)",
  output = "'file': an output file whose directory is created and must be writable; 'dir': an output directory, the same",
  less_than = 'the value is < the named option\'s',
  at_most = 'the value is <= the named option\'s',
  multiple_of = 'the value is a multiple of the named option\'s',
  needs = 'when set (given, or other than a default that is on), the named option (or each of a list) must be set too',
  check = 'function(value, cfg) returning nil, or what is wrong (a phrase after "--key ")',
  aliases = 'other names of the option: a list of names, and name = {their value = ours} or '
            .. 'function(text) -> value (or nil, why), {options it implies}',
  values = 'other spellings of the values under any name: {theirs = ours}, or function(text) -> value, '
           .. '{options it implies} (nil: parse the text as usual)',
  default_from = 'function(cfg) -> the value to use when the option was not given (nil: the default), '
                 .. 'or nil and what is wrong; run after the checks, in the order of the keys',
}

local VALIDATE_FLAG = 'validate_options'
local PRINT_FLAG = 'print_config'

-- cfg -> {spec, script} of the configs M.parse resolved (M.format, M.dump).
local resolved = setmetatable({}, { __mode = 'k' })

local function canonical(key) return (key:gsub('%-', '_')) end

local function parse_value(key, text, default)
  -- key: the option as the user wrote it
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

local sorted_keys = tables.sorted_keys

-- The keys of a table, sorted (model config names for one_of).
M.keys = sorted_keys

local function show(v)
  if type(v) == 'string' then return ("'%s'"):format(v) end
  return tostring(v)
end

local function list_of(d)
  local l = d.one_of
  if type(l) == 'function' then l = l() end
  return l
end

-- The constraints of an entry in words, for --help: "[integer >= 1]".
local function describe(d)
  local parts = {}
  local kind = d.int and 'integer' or nil
  local bounds = {}
  if d.positive then bounds[#bounds + 1] = '> 0' end
  if d.min then bounds[#bounds + 1] = '>= ' .. tostring(d.min) end
  if d.below then bounds[#bounds + 1] = '< ' .. tostring(d.below) end
  if d.max then bounds[#bounds + 1] = '<= ' .. tostring(d.max) end
  if kind or #bounds > 0 then
    parts[#parts + 1] = ((kind or '') .. ' ' .. table.concat(bounds, ', ')):gsub('^ ', ''):gsub(' $', '')
  end
  local l = list_of(d)
  if l then
    local shown = {}
    for i, v in ipairs(l) do shown[i] = v == '' and "''" or tostring(v) end
    parts[#parts + 1] = 'one of ' .. table.concat(shown, ', ')
  end
  if d.less_than then parts[#parts + 1] = '< --' .. d.less_than end
  if d.at_most then parts[#parts + 1] = '<= --' .. d.at_most end
  if d.multiple_of then parts[#parts + 1] = 'multiple of --' .. d.multiple_of end
  if d.needs then
    local list = type(d.needs) == 'table' and d.needs or { d.needs }
    parts[#parts + 1] = 'needs --' .. table.concat(list, ', --')
  end
  if type(d.values) == 'table' then
    local other = sorted_keys(d.values)
    parts[#parts + 1] = 'also ' .. table.concat(other, ', ')
  end
  if d.input then
    parts[#parts + 1] = d.input == 'glob' and 'must exist, or a glob' or d.hub and 'must exist, or be in the Hugging '
      .. 'Face cache' or 'must exist'
  end
  if d.output then parts[#parts + 1] = 'written' end
  if #parts == 0 then return '' end
  return ' [' .. table.concat(parts, '; ') .. ']'
end

-- The usage text of a spec.
function M.usage(spec, script, opts)
  opts = opts or {}
  local lines = { ('usage: fsdp-lua %s [--key=value | --key value | --flag | --no-flag ...] '
    .. '[--config FILE.yaml|.lua]%s'):format(script or 'recipe.lua', opts.positional and (' ' .. opts.positional) or '') }
  if opts.description then lines[#lines + 1] = opts.description end
  lines[#lines + 1] = '--config: a YAML or Lua file of options, flat or in sections one level deep '
    .. '(training: {lr: 1e-4} is --lr); the command line overrides it. A run with --checkpoint_dir saves its options there as config.yaml.'
  lines[#lines + 1] = ''
  for _, k in ipairs(sorted_keys(spec)) do
    local d = spec[k]
    lines[#lines + 1] = ('  --%-28s %-14s %s%s'):format(k, tostring(d[1]), d[2] or '', describe(d))
    for _, a in ipairs(M.alias_names(d)) do
      local tr = d.aliases[a]
      local how = ''
      if type(tr) == 'table' then
        local pairs_ = {}
        for _, v in ipairs(sorted_keys(tr)) do pairs_[#pairs_ + 1] = ('%s -> %s'):format(v, show(tr[v])) end
        how = ' (' .. table.concat(pairs_, ', ') .. ')'
      elseif type(tr) == 'function' then
        how = ' (translated)'
      end
      lines[#lines + 1] = ('      alias --%s%s'):format(a, how)
    end
  end
  lines[#lines + 1] = ('  --%-28s %-14s %s'):format(VALIDATE_FLAG, 'false',
    'check the options (and the model config they make), print "options: ok" and exit')
  lines[#lines + 1] = ('  --%-28s %-14s %s'):format(PRINT_FLAG, 'false',
    'check the options, print every resolved value as YAML (a file --config takes) and exit')
  return table.concat(lines, '\n')
end

-- The aliases of an entry, sorted: list entries and translated names.
function M.alias_names(d)
  local names = {}
  for k, v in pairs(d.aliases or {}) do names[#names + 1] = type(k) == 'number' and v or k end
  table.sort(names)
  return names
end

-- alias name -> {key =, translate = (nil, a table or a function)}.
local function alias_map(spec)
  local map = {}
  for _, k in ipairs(sorted_keys(spec)) do
    local d = spec[k]
    if d.aliases ~= nil then
      if type(d.aliases) ~= 'table' then error(('fsdp.options: spec entry %s: aliases must be a table'):format(k), 0) end
      for a, tr in pairs(d.aliases) do
        if type(a) == 'number' then a, tr = tr, nil end
        if type(a) ~= 'string' or a:find('[^%w_]') then
          error(('fsdp.options: spec entry %s: alias %s must be a name'):format(k, tostring(a)), 0)
        end
        if tr ~= nil and type(tr) ~= 'table' and type(tr) ~= 'function' then
          error(('fsdp.options: spec entry %s: alias %s: the translation must be a table or a function'):format(k, a), 0)
        end
        if spec[a] or map[a] then
          error(('fsdp.options: alias %s of %s is also %s'):format(a, k, spec[a] and 'an option' or
            'an alias of ' .. map[a].key), 0)
        end
        map[a] = { key = k, translate = tr }
      end
    end
    if d.values ~= nil and type(d.values) ~= 'table' and type(d.values) ~= 'function' then
      error(('fsdp.options: spec entry %s: values must be a table {theirs = ours} or a function'):format(k), 0)
    end
  end
  return map
end

-- A spec entry's constraint names are checked too: a misspelt constraint
-- (minimum = 1) would otherwise check nothing.
local function check_spec(spec)
  for _, k in ipairs(sorted_keys(spec)) do
    local d = spec[k]
    if type(d) ~= 'table' then error(('fsdp.options: spec entry %s must be a table {default, description, ...}'):format(k), 0) end
    for name in pairs(d) do
      if name ~= 1 and name ~= 2 and not M.CONSTRAINTS[name] then
        error(('fsdp.options: spec entry %s: unknown constraint %s%s'):format(k, tostring(name),
          suggest.hint(name, sorted_keys(M.CONSTRAINTS))), 0)
      end
    end
    for _, rel in ipairs({ 'less_than', 'at_most', 'multiple_of' }) do
      if d[rel] ~= nil and type(d[rel]) ~= 'string' then
        error(('fsdp.options: spec entry %s: %s must name an option'):format(k, rel), 0)
      end
    end
  end
end

local function unknown(spec, key, source, aliases)
  local names = sorted_keys(spec)
  for a in pairs(aliases or {}) do names[#names + 1] = a end
  table.sort(names)
  local dash = source == 'cli' and '--' or ''
  local hint = suggest.hint(key, names, function(c) return dash .. c end)
  if hint ~= '' then error(('unknown option %s%s%s'):format(dash, key, hint), 0) end
  error(('unknown option %s%s (valid: %s)'):format(dash, key, table.concat(names, ', ')), 0)
end

-- Translate a value given under `name` (an alias with translation tr, or
-- the option itself: tr nil) to the option's; returns the value and the
-- options it implies (or nil).
local function translate(d, name, tr, value)
  if type(value) ~= 'string' then return value end
  if type(tr) == 'function' then
    local v, implied = tr(value)
    if v == nil then error(('--%s %s'):format(name, implied or ('cannot be ' .. show(value))), 0) end
    return v, implied
  elseif type(tr) == 'table' then
    local v = tr[value]
    if v == nil then v = tr[value:lower()] end
    if v == nil then
      local known = sorted_keys(tr)
      error(('--%s must be one of %s; got %s%s'):format(name, table.concat(known, ', '), show(value),
        suggest.hint(value, known)), 0)
    end
    return v
  end
  if type(d.values) == 'function' then
    local v, implied = d.values(value)
    if v ~= nil then return v, implied end
  elseif d.values then
    local v = d.values[value]
    if v == nil then v = d.values[value:lower()] end
    if v ~= nil then return v end
  end
  return value
end

-- Set an option from `key` as written (the option or an alias). st (per
-- parse): names[key] = the name it was set under, implied = {{key, value,
-- from}} for the options an alias's value implies.
local function apply(cfg, spec, key, value, source, st)
  local name = canonical(key)
  local aliases = st and st.aliases or alias_map(spec)
  local d = spec[name]
  key = name
  local tr
  if not d and aliases[name] then
    key, tr = aliases[name].key, aliases[name].translate
    d = spec[key]
  end
  if not d then unknown(spec, name, source, aliases) end
  if st then
    local before = st.names[key]
    if before and before ~= name then
      error(('--%s and --%s are the same option (%s): give it once'):format(before, name, key), 0)
    end
    st.names[key] = name
  end
  local implied
  value, implied = translate(d, name, tr, value)
  if type(value) == 'string' and type(d[1]) ~= 'string' then value = parse_value(name, value, d[1]) end
  if type(d[1]) ~= type(value) and d[1] ~= nil then
    error(('option %s expects a %s, got %s'):format(name, type(d[1]), type(value)), 0)
  end
  cfg[key] = value
  if st and implied then
    for _, k in ipairs(sorted_keys(implied)) do st.implied[#st.implied + 1] = { k, implied[k], name } end
  end
end

-- The options an alias's value implies, once everything else is set: one
-- the user gave otherwise must agree.
local function apply_implied(cfg, spec, st)
  for _, imp in ipairs(st.implied) do
    local key, value, from = imp[1], imp[2], imp[3]
    if spec[key] == nil then error(('fsdp.options: --%s implies an unknown option %s'):format(from, key), 0) end
    local given = st.names[key]
    if given and given ~= from and cfg[key] ~= value then
      error(('--%s=%s and --%s=%s disagree: give one of them'):format(from, tostring(value), given,
        tostring(cfg[key])), 0)
    end
    cfg[key] = value
    if not given then st.names[key] = from end
  end
end

local function is_set(v) return v ~= nil and v ~= 0 and v ~= '' and v ~= false end

-- What is wrong with one value alone, or nil.
local function value_problem(d, v, cfg)
  if type(v) == 'number' then
    -- fsdp.validate: NaN and infinity fail every bound, integers stop at 2^53
    local why = checks.problem(v, d)
    if why then return why end
  end
  local l = list_of(d)
  if l then
    local found = false
    for _, x in ipairs(l) do if x == v then found = true end end
    if not found then
      local shown = {}
      for i, x in ipairs(l) do shown[i] = x == '' and "'' (none)" or tostring(x) end
      local candidates = {}
      for _, x in ipairs(l) do candidates[#candidates + 1] = x end
      if type(d.values) == 'table' then
        for _, x in ipairs(sorted_keys(d.values)) do candidates[#candidates + 1] = x end
      end
      return ('must be one of %s; got %s%s'):format(table.concat(shown, ', '), show(v),
        type(v) == 'string' and suggest.hint(v, candidates) or '')
    end
  end
  if d.check then
    local why = d.check(v, cfg)
    if why then return why end
  end
end

local function relation_problem(spec, cfg, key, d, as, given)
  as = as or function(k) return k end
  local v = cfg[key]
  for _, rel in ipairs({ 'less_than', 'at_most', 'multiple_of' }) do
    local other = d[rel]
    if other and spec[other] ~= nil and is_set(v) and is_set(cfg[other]) then
      local w = cfg[other]
      local bad = (rel == 'less_than' and not (v < w)) or (rel == 'at_most' and not (v <= w))
                  or (rel == 'multiple_of' and v % w ~= 0)
      if bad then
        local words = rel == 'less_than' and 'less than' or rel == 'at_most' and 'at most' or 'a multiple of'
        return ('(%s) must be %s --%s (%s)'):format(tostring(v), words, as(other), tostring(w))
      end
    end
  end
  -- A default that is on (--export_lora=merged) needs nothing until the
  -- user gives it or another value: then it would be ignored silently.
  if d.needs and is_set(v) and ((given and given[key]) or v ~= d[1]) then
    local list = type(d.needs) == 'table' and d.needs or { d.needs }
    for _, other in ipairs(list) do
      if spec[other] ~= nil and not is_set(cfg[other]) then return ('needs --%s'):format(as(other)) end
    end
  end
end

local probe_count = 0

-- Whether a file can be created in dir: by creating (and removing) one, the
-- only test that also holds for root, read-only mounts and quotas.
local function writable_dir(dir)
  probe_count = probe_count + 1
  -- Unique per rank of a job (each rank checks the same paths at once).
  local rank = tonumber(core.C.fl_dist_launcher_rank())
  local probe = ('%s/%s%d-%d-%d-%s'):format(dir, files.WRITE_PROBE, rank, os.time(), probe_count,
    tostring({}):match('0x(%x+)') or '0')
  local f, err = io.open(probe, 'w')
  if not f then return nil, (err:gsub('^[^:]*: ', '')) end
  f:close()
  os.remove(probe)
  return true
end

local function mode(path) return require('lfs').attributes(path, 'mode') end

local function make_dir(key, dir)
  if mode(dir) == 'directory' then return end
  local ok, err = pcall(files.mkdir_p, dir, '--' .. key)
  if not ok then error((tostring(err):gsub('^[^\n:]+:%d+: ', '')), 0) end
end

local function path_problem(key, d, v)
  if type(v) ~= 'string' or v == '' then return end
  if d.input then
    if v == '-' and d.stdin then return end
    local m = mode(v)
    if not m and d.hub and hub.is_model_name(v) then
      local ok, dir = pcall(hub.model_dir, v)
      if not ok then return tostring(dir) end
      v, m = dir, mode(dir)
    end
    if not m and not (d.input == 'glob' and v:find('[%*%?%[]')) then
      return ('%s does not exist%s'):format(v, publish.missing_hint(v))
    end
    if d.input == 'file' and m == 'directory' then return ('%s is a directory, not a file'):format(v) end
    if d.input == 'dir' and m ~= 'directory' then return ('%s is not a directory'):format(v) end
    -- a FIFO would block its reader, a device never ends ([Note: inputs
    -- are regular files]); a directory is what input = true or 'glob' may be
    if m and m ~= 'directory' then
      local ok, why = files.check_input(v)
      if not ok then
        return why .. (d.stdin and (' (for standard input give --%s=-)'):format(key) or '')
      end
    end
  end
  if d.output == 'dir' then
    if mode(v) and mode(v) ~= 'directory' then return ('%s exists and is not a directory'):format(v) end
    make_dir(key, v)
    local ok, why = writable_dir(v)
    if not ok then return ('cannot write in %s: %s'):format(v, why) end
  elseif d.output == 'file' then
    if mode(v) == 'directory' then return ('%s is a directory, not a file'):format(v) end
    -- a FIFO would block the writer until a reader came
    local writable, why = files.check_output(v)
    if not writable then return why end
    local dir = files.dirname(v)
    make_dir(key, dir)
    if mode(v) then
      -- An existing file: opened to append, so nothing in it changes.
      local f, err = io.open(v, 'a')
      if not f then return ('cannot write %s: %s'):format(v, (err:gsub('^[^:]*: ', ''))) end
      f:close()
    else
      local ok, why = writable_dir(dir)
      if not ok then return ('cannot write in %s: %s'):format(dir, why) end
    end
  end
end

-- What is wrong with `v` as an output ('file' or 'dir', as the `output`
-- constraint), creating its directory as that constraint does; nil when
-- fine. For an option that is an output only when another is set (a
-- check function: --profile_dir with --profile_steps).
function M.output_problem(key, kind, v) return path_problem(key, { output = kind }, v) end

-- Check a resolved config against its spec's constraints: each value, then
-- the relations, then the paths (which create output directories), in
-- the order of the keys. Raises the first problem as "--key ...".
-- names (optional): key -> the name the user gave it under (an alias),
-- which the messages use. given (optional, default names): the set of
-- keys the user gave (on the command line or in --config).
function M.validate(spec, cfg, names, given)
  names = names or {}
  given = given or names
  local function as(k) return names[k] or k end
  local keys = sorted_keys(spec)
  for _, k in ipairs(keys) do
    local why = value_problem(spec[k], cfg[k], cfg)
    if why then error(('--%s %s'):format(as(k), why), 0) end
  end
  for _, k in ipairs(keys) do
    local why = relation_problem(spec, cfg, k, spec[k], as, given)
    if why then error(('--%s %s'):format(as(k), why), 0) end
  end
  for _, k in ipairs(keys) do
    local why = path_problem(as(k), spec[k], cfg[k])
    if why then error(('--%s: %s'):format(as(k), why), 0) end
  end
  return cfg
end

-- [Note: defaults that depend on other options]
-- An option the user did not give (on the command line or in --config)
-- whose entry has default_from takes that function's value, computed from
-- the checked config: on a GPU (--device) --mixed_precision defaults to
-- bf16 ([Note: GPU defaults] in fsdp.sharding.device). They run in the
-- order of the keys, so one may read an option sorting before it; the
-- value is checked like a given one.
local function apply_defaults_from(spec, cfg, names)
  for _, k in ipairs(sorted_keys(spec)) do
    local d = spec[k]
    if d.default_from and not names[k] then
      local v, why = d.default_from(cfg)
      if why then error(('--%s %s'):format(k, why), 0) end
      if v ~= nil then
        cfg[k] = v
        local problem = value_problem(d, v, cfg)
        if problem then error(('--%s (default from the other options) %s'):format(k, problem), 0) end
      end
    end
  end
end

-- A message without the "file:line: " an error() with a level puts first.
local function bare(msg)
  return (tostring(msg):gsub('^[^\n:]+:%d+: ', ''))
end
M.bare = bare

-- A usage mistake: one line on stderr (rank 0 of a launched job only, so N
-- ranks do not print it N times), exit status 2. Lines after the first
-- that are indented by two spaces continue it (a command that fixes the
-- mistake: fsdp.data.hub's download commands); anything else after the
-- first line (a traceback) is dropped.
function M.usage_error(msg)
  local rank = tonumber(core.C.fl_dist_launcher_rank())
  if rank <= 0 then
    local text = bare(msg)
    local line = text:match('^[^\n]*')
    for more in text:sub(#line + 1):gmatch('\n([^\n]*)') do
      if more:sub(1, 2) ~= '  ' then break end
      line = line .. '\n' .. more
    end
    io.stderr:write(('fsdp-lua: %s\n'):format(line))
    io.stderr:flush()
  end
  -- Closing the Lua state frees what was built before the refusal (the fit
  -- check's meta model), so a refused run leaks nothing.
  os.exit(2, true)
end

-- An error of a model config function (models/*.lua) in the words of the
-- recipe's options: names maps config fields to options ({dim =
-- 'hidden_width'}), and the options whose fields the message names are
-- appended: "llama config: dim 100 is not a multiple of n_heads 3 (from
-- --hidden_width, --num_heads)".
-- written (optional): option -> the alias the user gave it under.
function M.explain(msg, names, written)
  msg = bare(msg)
  local from, seen = {}, {}
  for _, field in ipairs(sorted_keys(names or {})) do
    local opt = names[field]
    opt = written and written[opt] or opt
    if not seen[opt] and (' ' .. msg .. ' '):find('[^%w_]' .. field:gsub('%p', '%%%0') .. '[^%w_]') then
      seen[opt] = true
      from[#from + 1] = '--' .. opt
    end
  end
  if #from == 0 then return msg end
  table.sort(from)
  return ('%s (from %s)'):format(msg, table.concat(from, ', '))
end

-- Resolve a config from spec = {key = {default, description, constraints}}
-- and the script's arguments, and check it (M.validate, then validate(cfg)
-- when given: the recipe's checks of its model config). Returns the
-- config table and the positional arguments. Exits after printing usage on
-- --help, with "options: ok" after the checks on --validate_options, and
-- after printing the whole resolved config (YAML that --config reads) on
-- --print_config; a bad option prints its one-line message (no traceback:
-- it is a usage mistake, not a program error) and exits with status 2.
-- opts (optional): positional (words naming the positional arguments the
-- script takes, for the usage line: 'CHECKPOINT OUT'; without it any is
-- refused, see [Note: command-line words]), description (a line for the
-- usage text).
function M.config(spec, args, script, validate, opts)
  local ok, cfg, positional, only = pcall(M.parse, spec, args, script, validate, opts)
  if not ok then M.usage_error(cfg) end
  if only == 'print_config' then
    print(M.dump(cfg, true))
    os.exit(0)
  elseif only then
    print('options: ok')
    os.exit(0)
  end
  return cfg, positional
end

-- [Note: command-line words]
-- A value-taking option is --key=value or --key value (the next word,
-- unless it starts with --); a boolean is --flag (true), --no-flag
-- (false: when no_flag is not itself an option) or --flag=false. A word
-- that is not an option is refused in one line unless the script takes
-- positional arguments (options.config's opts.positional): key=value and
-- -key=value ("did you mean --key=value?"), a word after a flag ("did you
-- mean --flag=word?"), anything else naming what the script takes. A
-- script that silently ran its defaults with `model=tiny` trained a 7B.

-- The spec entry and alias of an option as written (or nil).
local function entry(spec, st, key)
  if spec[key] then return spec[key], nil end
  local alias = st.aliases[key]
  if alias then return spec[alias.key], alias end
end

-- Whether the option `key` (an alias too) is a flag: true for a boolean
-- or an alias whose translation knows 'true' (--bf16), false for an
-- option that takes a value, nil for no option.
local function flag_kind(spec, st, key)
  local d, alias = entry(spec, st, key)
  if not d then return nil end
  if alias and type(alias.translate) == 'table' and alias.translate['true'] ~= nil then return true end
  return type(d[1]) == 'boolean'
end

-- The one-line refusal of a word that is not an option (see the Note).
local function refuse_word(spec, st, a, script, after_flag)
  local names = sorted_keys(spec)
  for k in pairs(st.aliases) do names[#names + 1] = k end
  table.sort(names)
  local function known(k) return entry(spec, st, canonical(k)) ~= nil end
  local bare_word = a:gsub('^%-', '')
  local key, value = bare_word:match('^([%w_%-]+)=(.*)$')
  if key then
    local guess = known(key) and key or suggest.closest(canonical(key), names)
    if guess then error(('%s is not an option (did you mean --%s=%s?)'):format(a, guess, value), 0) end
  elseif a:sub(1, 1) == '-' and #bare_word > 0 then
    local guess = known(bare_word) and bare_word or suggest.closest(canonical(bare_word), names)
    if guess then error(('%s is not an option (did you mean --%s?)'):format(a, guess), 0) end
    error(('unknown option %s (options start with --; --help lists them)'):format(a), 0)
  end
  if after_flag then
    error(("unexpected argument '%s' after --%s, which takes no value (did you mean --%s=%s?)"):format(a, after_flag,
      after_flag, a), 0)
  end
  error(("unexpected argument '%s': %s takes options only (--key=value or --key value; --help lists them)"):format(
    a, script or 'this script'), 0)
end

-- M.config without the exits: raises an error for a bad option. The third
-- result is true when --validate_options was given, 'print_config' for
-- --print_config.
function M.parse(spec, args, script, validate, opts)
  opts = opts or {}
  check_spec(spec)
  local st = { aliases = alias_map(spec), names = {}, implied = {} }
  local cfg, positional = {}, {}
  local from_file = {} -- options a --config file gave
  for k, d in pairs(spec) do cfg[k] = d[1] end
  args = args or {}
  -- A --config file first, so the command line overrides it.
  for i, a in ipairs(args) do
    local path = a:match('^%-%-config=(.+)$') or (a == '--config' and args[i + 1])
    if a == '--config' and (not path or path:sub(1, 2) == '--') then
      error('--config expects a file (--config=FILE.yaml, --config FILE.lua)', 0)
    end
    if path then
      local t, where = config_file.read(path, function(k) return entry(spec, st, canonical(k)) ~= nil end,
        function(k, written)
          local names = sorted_keys(spec)
          for a_ in pairs(st.aliases) do names[#names + 1] = a_ end
          error(('--config %s: unknown option %s%s'):format(path, written, suggest.hint(canonical(k), names)), 0)
        end)
      -- Names tracked apart from the command line's (which overrides the
      -- file under any name); implied options go with the rest.
      local file_st = { aliases = st.aliases, names = {}, implied = st.implied }
      for _, k in ipairs(sorted_keys(t)) do
        local v = t[k]
        local d = entry(spec, st, canonical(k))
        -- YAML's 7 for a string option is '7'; a number's "1e-4" is parsed
        if type(v) == 'number' and type(d[1]) == 'string' then v = config_file.yaml_value(v) end
        local ok, err = pcall(apply, cfg, spec, k, v, 'file', file_st)
        if not ok then error(('--config %s: %s: %s'):format(path, where[k], bare(err)), 0) end
      end
      for k in pairs(file_st.names) do from_file[k] = true end
    end
  end
  local skip, only, after_flag = false, false, nil
  for i, a in ipairs(args) do
    local flag_before = after_flag
    after_flag = nil
    if skip then
      skip = false
    elseif a == '--help' or a == '-h' then
      print(M.usage(spec, script, opts))
      os.exit(0)
    elseif a == '--config' then
      skip = true
    elseif a:match('^%-%-config=') then
      -- handled above
    elseif a:sub(1, 2) == '--' and canonical(a:sub(3)) == VALIDATE_FLAG then
      only = only or true
    elseif a:sub(1, 2) == '--' and canonical(a:sub(3)) == PRINT_FLAG then
      only = 'print_config'
    elseif a:match('^%-%-.') then
      local key, value = a:match('^%-%-([%w_%-]+)=(.*)$')
      if not key then
        key = canonical(a:sub(3))
        local kind = flag_kind(spec, st, key)
        local base = key:match('^no_(.+)$')
        if kind == nil and base and flag_kind(spec, st, base) then
          key, value = base, 'false'
        elseif kind == true then
          value = 'true'
          after_flag = key
        elseif kind == false then
          value = args[i + 1]
          if value == nil or value:sub(1, 2) == '--' then
            error(('--%s expects a value (--%s=VALUE or --%s VALUE)'):format(key, key, key), 0)
          end
          skip = true
        end
      end
      apply(cfg, spec, key, value or 'true', 'cli', st)
    elseif opts.positional and (a:sub(1, 1) ~= '-' or a == '-') then
      positional[#positional + 1] = a
    else
      refuse_word(spec, st, a, script, flag_before)
    end
  end
  apply_implied(cfg, spec, st)
  local given = {}
  for k in pairs(from_file) do given[k] = true end
  for k in pairs(st.names) do given[k] = true end
  M.validate(spec, cfg, st.names, given)
  apply_defaults_from(spec, cfg, given)
  if validate then
    local ok, err = pcall(validate, cfg, st.names)
    if not ok then error(bare(err), 0) end
  end
  resolved[cfg] = { spec = spec, script = script }
  return cfg, positional, only
end

-- The keys of a resolved config whose values differ from their defaults
-- (all keys, sorted, for a config M.parse did not make).
function M.changed(cfg)
  local r = resolved[cfg]
  local keys = {}
  for _, k in ipairs(sorted_keys(cfg)) do
    if not r or not r.spec[k] or r.spec[k][1] ~= cfg[k] then keys[#keys + 1] = k end
  end
  return keys
end

-- A resolved config as YAML that --config reads: the values that differ
-- from the defaults, or all of them (full).
function M.dump(cfg, full)
  return table.concat(config_file.yaml_lines(cfg, not full and M.changed(cfg) or nil), '\n')
end

-- Write the options of a run that differ from the defaults to
-- dir/config.yaml ([Note: config files] in fsdp.config_file), so
-- `fsdp-lua SCRIPT --config dir/config.yaml` repeats it. Returns the path
-- and the script (as options.config was told).
function M.save_config(cfg, dir)
  local r = resolved[cfg] or {}
  local changed = {}
  for _, k in ipairs(M.changed(cfg)) do changed[k] = cfg[k] end
  return config_file.write(files.join(dir, M.CONFIG_FILE), changed, r.script), r.script
end
M.CONFIG_FILE = 'config.yaml'

-- Names a recipe exposed (a set), for the REPL's help().
M.exposed = {}

-- Option specs combined, later tables winning on a clash: the shared
-- option sets (fsdp.sharding.options, fsdp.checkpointing.options) under a
-- recipe's own.
function M.merge(...)
  local all = {}
  for i = 1, select('#', ...) do
    for k, v in pairs((select(i, ...))) do all[k] = v end
  end
  return all
end

-- Make a recipe's objects globals for the REPL that follows when the
-- recipe runs with -i (`fsdp-lua -i recipes/llama2_7b.lua --dry-run`, then
-- `model`, `cfg` at the prompt). Without -i it does nothing: a recipe's
-- locals stay local. Returns its argument.
function M.expose(objects)
  local ok, host = pcall(require, 'fsdp.host')
  if not (ok and host.interactive) then return objects end
  for k, v in pairs(objects) do
    rawset(_G, k, v)
    M.exposed[k] = true
  end
  return objects
end

-- The resolved config as printed at the start of a run: the values that
-- differ from the defaults (all of them for a config M.parse did not
-- make, or with full), and a line saying how many are left out.
function M.format(cfg, full)
  local lines, keys = {}, full and sorted_keys(cfg) or M.changed(cfg)
  for _, k in ipairs(keys) do lines[#lines + 1] = ('  %s = %s'):format(k, tostring(cfg[k])) end
  local rest = #sorted_keys(cfg) - #keys
  if rest > 0 then
    lines[#lines + 1] = (#keys == 0 and '  (all %d options at their defaults: --print_config lists them)'
      or '  (%d other options at their defaults: --print_config lists them all)'):format(rest)
  end
  return table.concat(lines, '\n')
end

-- [Note: the list of recipes]
-- `fsdp-lua --list` (or `fsdp-lua recipes`) prints each recipes/*.lua with
-- the first phrase of its purpose comment (up to the first ':', ';' or
-- '. ' outside parentheses), so a recipe's first comment line is its entry
-- and a helper module does not belong in recipes/ (T5's moved to models/).
-- The recipes of the project root `root` (default: fsdp.host's), sorted:
-- {name = 'llama2_7b.lua', path = 'recipes/llama2_7b.lua', summary = '...'}.
function M.recipes(root)
  root = root or require('fsdp.host').root or '.'
  local lfs = require 'lfs'
  local dir = root .. '/recipes'
  local out = {}
  if lfs.attributes(dir, 'mode') ~= 'directory' then return out end
  for name in lfs.dir(dir) do
    if name:match('%.lua$') then
      local f = io.open(dir .. '/' .. name)
      local text = f and f:read(4096) or ''
      if f then f:close() end
      local words = {}
      for line in (text .. '\n'):gmatch('([^\n]*)\n') do
        local c = line:match('^%-%-%s?(.*)$')
        if not c or c:match('^%s*$') then break end
        words[#words + 1] = c
      end
      local purpose = table.concat(words, ' '):gsub('^recipes/[%w_]+%.lua:%s*', '')
      local depth, cut = 0, #purpose
      for i = 1, #purpose do
        local ch = purpose:sub(i, i)
        if ch == '(' then depth = depth + 1 elseif ch == ')' then depth = depth - 1
        elseif depth == 0 and (ch == ':' or ch == ';' or (ch == '.' and purpose:sub(i + 1, i + 1) == ' ')) then
          cut = i - 1
          break
        end
      end
      -- (parentheses left out: one short line each)
      local summary = purpose:sub(1, cut):gsub('%s*%b()', ''):gsub('%.$', '')
      out[#out + 1] = { name = name, path = 'recipes/' .. name, summary = summary }
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- Print the list (see the Note).
function M.list(root)
  local list = M.recipes(root)
  print(('%d recipes (fsdp-lua recipes/NAME.lua --help lists one\'s options):'):format(#list))
  for _, r in ipairs(list) do print(('  %-22s %s'):format(r.path, r.summary)) end
end

return M

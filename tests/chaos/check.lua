-- tests/chaos/check.lua: the judgements of the chaos test (tests/chaos/chaos.sh),
-- run by one fsdp-lua process (no MPI) between and after the killed runs.
--
--   fsdp-lua tests/chaos/check.lua checkpoints CHAIN_DIR REF_DIR
--       every complete checkpoint in CHAIN_DIR: no stale optimizer counter
--       (each parameter's saved state holds step == the checkpoint's step,
--       and every parameter has state), and the checkpoint equals REF_DIR's
--       of the same step: the index's step, world size, parts, optimizer
--       hyper-parameters and per-parameter counters, scheduler, every rank's
--       data position and RNG, and every tensor of every rank file, byte for
--       byte.
--   fsdp-lua tests/chaos/check.lua metrics CHAIN.jsonl REF.jsonl MAX_STEPS
--       every train and validation record of the chain, from every attempt
--       (also those a later restart logged again), has exactly the
--       reference's loss, lr and grad norm for its step, bit for bit (the
--       metrics file writes numbers exactly: fsdp.json.encode_line);
--       steps 1..MAX_STEPS were all logged.
--
-- Prints "ok ..." with counts, or one line per problem and exits 1.
local ffi = require 'ffi'
local cjson = require 'cjson'
local Tensor = require 'fsdp.tensor'
local safetensors = require 'fsdp.io.safetensors'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local directory = require('fsdp.checkpointing').directory

local problems = {}
local function problem(fmt, ...)
  problems[#problems + 1] = fmt:format(...)
end

local function finish(summary)
  if #problems > 0 then
    for i = 1, math.min(#problems, 20) do print(problems[i]) end
    if #problems > 20 then print(('... and %d more'):format(#problems - 20)) end
    os.exit(1)
  end
  print('ok ' .. summary)
  os.exit(0)
end

-- A canonical text of a JSON value (keys sorted, numbers exact), so two
-- decoded indexes compare as strings.
local function canon(v)
  if v == nil then return 'null' end
  return (json.encode(v):gsub('^%s+', ''):gsub('%s+$', ''))
end

-- checkpoints ------------------------------------------------------------------------

-- The parameters that carry optimizer state: every parameter of a unit or
-- an unsharded parameter (buffers have none).
local function param_names(index)
  local out = {}
  for _, part in ipairs(index.parts) do
    if part.kind ~= 'buffer' then
      for _, p in ipairs(part.params) do out[#out + 1] = p.name end
    end
  end
  return out
end

local function stale_counters(index)
  local n = 0
  local st = index.optimizer and index.optimizer.state
  if type(st) ~= 'table' then
    problem('%s: no optimizer state in the index', index.path)
    return 0
  end
  for _, name in ipairs(param_names(index)) do
    local s = st[name]
    if type(s) ~= 'table' then
      problem('%s: parameter %s has no optimizer state', index.path, name)
    elseif s.step ~= index.step then
      problem('%s: stale optimizer counter: %s step %s in the checkpoint of step %d', index.path, name,
        tostring(s.step), index.step)
    end
    n = n + 1
  end
  return n
end

local function bytes_of(t)
  local c = Tensor.cptr(t)
  return ffi.string(c.data, tonumber(c.numel) * t:element_size())
end

-- The tensors of two rank files, byte for byte.
local function same_tensors(path, ref_path)
  local f, g = safetensors.open(path), safetensors.open(ref_path)
  local names, ref_names = f:names(), g:names()
  table.sort(names)
  table.sort(ref_names)
  if table.concat(names, ' ') ~= table.concat(ref_names, ' ') then
    problem('%s holds tensors {%s}, the reference %s {%s}', path, table.concat(names, ', '), ref_path,
      table.concat(ref_names, ', '))
  else
    for _, name in ipairs(names) do
      local a, b = f:get(name), g:get(name)
      if a.dtype ~= b.dtype or a:numel() ~= b:numel() then
        problem('%s: %s is %s[%d], the reference %s[%d]', path, name, a.dtype, a:numel(), b.dtype, b:numel())
      elseif bytes_of(a) ~= bytes_of(b) then
        problem('%s: tensor %s differs from the reference\'s (%s)', path, name, ref_path)
      end
      a:free()
      b:free()
    end
  end
  f:close()
  g:close()
  return #names
end

-- The index fields a resumed run depends on; other fields (a run
-- identifier, checksums) legitimately differ between two runs.
local COMPARED = { 'step', 'world_size', 'strategy', 'parts', 'optimizer', 'scheduler', 'extra' }

-- The first path at which two decoded JSON values differ, with both
-- values there; nil when equal.
local function first_difference(a, b, path)
  if type(a) ~= 'table' or type(b) ~= 'table' then
    if canon(a) ~= canon(b) then return path, canon(a), canon(b) end
    return nil
  end
  local keys = {}
  for k in pairs(a) do keys[#keys + 1] = k end
  for k in pairs(b) do if a[k] == nil then keys[#keys + 1] = k end end
  table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
  for _, k in ipairs(keys) do
    local p, x, y = first_difference(a[k], b[k], path .. '.' .. tostring(k))
    if p then return p, x, y end
  end
  return nil
end

local function same_checkpoint(index, ref)
  for _, k in ipairs(COMPARED) do
    local path, got, want = first_difference(index[k], ref[k], k)
    if path then
      problem('%s: %s is %s, the reference\'s %s (%s)', index.path, path, (got:gsub('%s+', ' ')),
        (want:gsub('%s+', ' ')), ref.path)
    end
  end
  local tensors = 0
  for r, info in ipairs(index.ranks) do
    local want = ref.ranks[r]
    if want == nil then
      problem('%s: rank %d is not in the reference', index.path, r - 1)
    else
      for _, k in ipairs({ 'file', 'data', 'rng' }) do
        if canon(info[k]) ~= canon(want[k]) then
          problem('%s: rank %d\'s %s is %s, the reference\'s %s', index.path, r - 1, k, canon(info[k]),
            canon(want[k]))
        end
      end
      local dir, ref_dir = index.path:match('^(.*)/[^/]*$'), ref.path:match('^(.*)/[^/]*$')
      tensors = tensors + same_tensors(files.join(dir, info.file), files.join(ref_dir, want.file))
    end
  end
  return tensors
end

local function checkpoints(dir, ref_dir)
  local n, counters, tensors = 0, 0, 0
  for _, e in ipairs(directory.scan(dir).complete) do
    local index = directory.read_index(e.path)
    counters = counters + stale_counters(index)
    local ref_path = directory.step_dir(ref_dir, e.step)
    if not directory.is_complete(ref_path) then
      problem('%s: the reference has no complete checkpoint of step %d (%s)', e.path, e.step, ref_path)
    else
      tensors = tensors + same_checkpoint(index, directory.read_index(ref_path))
    end
    n = n + 1
  end
  finish(('%d checkpoints, %d optimizer counters, 0 stale, %d tensors equal to the reference\'s')
    :format(n, counters, tensors))
end

-- metrics ----------------------------------------------------------------------------

local function records(path)
  local out = {}
  local n = 0
  for line in io.lines(path) do
    n = n + 1
    local ok, r = pcall(cjson.decode, line)
    if not ok or type(r) ~= 'table' then
      problem('%s:%d: not a JSON record: %s', path, n, line:sub(1, 120))
    elseif r.type == 'train' or r.type == 'val' then
      out[#out + 1] = r
    end
  end
  return out
end

local function numbers(r)
  -- %.17g: every bit of the decoded double
  local function g(v) return v == nil and '-' or ('%.17g'):format(v) end
  if r.type == 'val' then return 'loss ' .. g(r.loss) end
  return ('loss %s lr %s grad_norm %s'):format(g(r.loss), g(r.lr), g(r.grad_norm))
end

local function metrics(path, ref_path, max_steps)
  local want = {}
  for _, r in ipairs(records(ref_path)) do
    local key = r.type .. ' ' .. r.step
    if want[key] and want[key] ~= numbers(r) then
      problem('%s: the reference logs %s twice with different numbers', ref_path, key)
    end
    want[key] = numbers(r)
  end
  local seen, n = {}, 0
  for _, r in ipairs(records(path)) do
    local key = r.type .. ' ' .. r.step
    n = n + 1
    if want[key] == nil then
      problem('%s: %s is not in the reference', path, key)
    elseif numbers(r) ~= want[key] then
      problem('%s: %s: %s, the uninterrupted run: %s', path, key, numbers(r), want[key])
    end
    if r.type == 'train' then seen[r.step] = true end
  end
  for s = 1, max_steps do
    if not seen[s] then problem('%s: step %d was never logged', path, s) end
  end
  finish(('%d records equal to the reference\'s'):format(n))
end

local cmd = arg[1]
if cmd == 'checkpoints' and arg[3] then
  checkpoints(arg[2], arg[3])
elseif cmd == 'metrics' and arg[4] then
  metrics(arg[2], arg[3], tonumber(arg[4]))
else
  io.stderr:write('usage: fsdp-lua tests/chaos/check.lua checkpoints DIR REF_DIR | metrics FILE REF_FILE MAX_STEPS\n')
  os.exit(2)
end

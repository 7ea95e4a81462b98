-- fsdp.lora: LoRA fine-tuning of a model by module names: apply adapters
-- (fsdp.nn.lora's LoRALinear) to the Linears a list of names picks, freeze
-- everything else, and hand the result back as PEFT's adapter files or
-- merged into the base weights.
--
--   local lora = require 'fsdp.lora'               -- also fsdp.lora
--   local model = llama.CausalLM(c, {device = 'meta'})
--   lora.apply(model, {rank = 8, alpha = 16, dropout = 0.05, targets = {'q_proj', 'v_proj'}})
--   fsdp.shard(model, {...})                       -- adapters sharded, the base frozen
--   local opt = optim.AdamW(lora.trainable(model), {...})
--   ...
--   lora.save_peft(model, 'out/adapter')           -- adapter_config.json + adapter_model.safetensors
--   local sd = lora.merged_state_dict(model)       -- W + B A alpha/r under the base names
--   lora.load_peft(model2, 'out/adapter')          -- an adapter PEFT (or we) wrote
--
-- A target matches a Linear whose full name is the target or ends with
-- "." .. target, PEFT's rule for target_modules (q_proj matches
-- model.layers.3.self_attn.q_proj; layers.3.self_attn.q_proj only that
-- layer's). A target that matches nothing, or matches a module that is not
-- a Linear, is an error naming it and the Linear names the model has.
--
-- [Note: what a LoRA checkpoint holds] The base stays what it was loaded
-- as; only the adapters train. A sharded checkpoint of a LoRA run
-- (fsdp.checkpointing) therefore holds the trainable parameters and their
-- optimizer state and no frozen parameter; resuming rebuilds the base the
-- way the run first did (the recipe's --init_from, or the init rules and
-- --seed) and loads the adapters over it. The checkpoint records the
-- base's fingerprint, and resuming, generating and exporting refuse a
-- base that no longer matches it ([Note: the fingerprint of a LoRA base],
-- models/pretrained.lua).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local dist = require 'fsdp.dist'
local factories = require 'fsdp.factories'
local Module = require 'fsdp.nn.module'
local Linear = require 'fsdp.nn.linear'
local LoRALinear = require 'fsdp.nn.lora'
local parameter = require 'fsdp.nn.parameter'
local autograd = require 'fsdp.autograd'
local layout = require 'fsdp.sharding.layout'
local safetensors = require 'fsdp.io.safetensors'
local nonfinite = require 'fsdp.nonfinite'
local publish = require 'fsdp.io.publish'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local sharding = require 'fsdp.sharding'
local options = require 'fsdp.options'

local M = {}
M.LoRALinear = LoRALinear

local function fail(fmt, ...) core.fail(('lora: ' .. fmt):format(...)) end

-- targets: a list of names or one comma-separated string.
local function target_list(t)
  if type(t) == 'string' then
    local list = {}
    for name in t:gmatch('[^,%s]+') do list[#list + 1] = name end
    t = list
  end
  if type(t) ~= 'table' or #t == 0 then
    fail('targets must be a non-empty list of module names (e.g. {"q_proj", "v_proj"}), got %s',
      type(t) == 'table' and 'an empty list' or tostring(t))
  end
  for _, name in ipairs(t) do
    if type(name) ~= 'string' or name == '' then fail('targets: %s is not a module name', tostring(name)) end
  end
  return t
end
M.target_list = target_list

local function matches(name, target)
  return name == target or name:sub(-#target - 1) == '.' .. target
end

-- The LoRA layers of a model: {{name, module}...} in model order.
function M.layers(model)
  local out = {}
  for _, nm in ipairs(model:named_modules()) do
    if nm[2]:is_instance_of(LoRALinear) then out[#out + 1] = nm end
  end
  return out
end

-- The distinct last components of the model's Linear names, for errors.
local function linear_names(model)
  local seen, list = {}, {}
  for _, nm in ipairs(model:named_modules()) do
    if nm[2]:is_instance_of(Linear) then
      local last = nm[1]:match('([^.]+)$') or nm[1]
      if not seen[last] then seen[last] = true; list[#list + 1] = last end
    end
  end
  return table.concat(list, ', ')
end

-- Put module m in the place of the submodule called `name`.
local function replace(model, name, m)
  local parent_name, key = name:match('^(.*)%.([^.]+)$')
  local parent = model
  if parent_name then
    for _, nm in ipairs(model:named_modules()) do
      if nm[1] == parent_name then parent = nm[2]; break end
    end
  else
    key = name
  end
  parent:add_module(key, m)
end

local OPTIONS = { rank = true, alpha = true, dropout = true, targets = true, base_dtype = true, rslora = true,
                  seed = true }

-- Replace the Linears `opts.targets` names by LoRALinears and freeze every
-- other parameter. opts: rank (required), alpha (default: rank), dropout
-- (0), targets, rslora (scale by alpha/sqrt(rank)), base_dtype (keep the
-- frozen parameters in this dtype: a model on the meta device only, as
-- fsdp.shard then gathers them in the compute dtype), seed (a live
-- model's adapter init). Before fsdp.shard. Returns the adapted names.
function M.apply(model, opts)
  if not Module.is_module(model) then fail('apply expects a module, got %s', type(model)) end
  if rawget(model, '_fsdp') then
    fail('apply: the model is sharded already; apply LoRA before fsdp.shard (so the adapters are sharded too)')
  end
  if rawget(model, '_lora') then fail('apply: the model has LoRA adapters already') end
  opts = opts or {}
  for k in pairs(opts) do
    if not OPTIONS[k] then fail("apply: unknown option '%s' (known: alpha, base_dtype, dropout, rank, rslora, "
      .. 'seed, targets)', tostring(k)) end
  end
  if opts.rank == nil then fail('apply: rank is required') end
  local targets = target_list(opts.targets)
  local base_dtype = opts.base_dtype
  if base_dtype == '' then base_dtype = nil end
  if base_dtype ~= nil then
    local code = type(base_dtype) == 'string' and core.C.fl_dtype_parse(base_dtype) or -1
    if code < 0 or not core.C.fl_dtype_is_float(code) then
      core.C.fl_clear_error()
      fail("apply: base_dtype '%s' is not a floating-point dtype", tostring(base_dtype))
    end
    base_dtype = core.dtype_name(code)
  end

  -- Which module each target picks; every target must pick something,
  -- and only Linears.
  local chosen, order = {}, {}
  for _, target in ipairs(targets) do
    local n = 0
    for _, nm in ipairs(model:named_modules()) do
      local name, m = nm[1], nm[2]
      if name ~= '' and matches(name, target) then
        if not m:is_instance_of(Linear) then
          fail("target '%s' matches %s, a %s, not a Linear (the model's Linears: %s)", target, name,
            m:class_name(), linear_names(model))
        end
        if not chosen[m] then
          chosen[m] = name
          order[#order + 1] = nm
        end
        n = n + 1
      end
    end
    if n == 0 then
      fail("target '%s' matches no module of the model (its Linears: %s)", target, linear_names(model))
    end
  end
  local first = model:parameters()[1]
  if base_dtype and first and not first:is_meta() then
    fail('apply: base_dtype needs the model on the meta device (it is applied before fsdp.shard, which '
      .. 'gathers the frozen weights in the compute dtype); build the model with device = "meta"')
  end

  -- The adapters train in their Linear's dtype, whatever base_dtype does.
  local adapter_dtype = {}
  for _, nm in ipairs(order) do adapter_dtype[nm[2]] = nm[2].weight.dtype end

  -- Freeze the whole model first (the adapters are made after).
  local slots = layout.slots_of(model)
  local done = {}
  for _, p in ipairs(model:parameters()) do
    if not done[p] then
      done[p] = true
      local t = p
      if base_dtype and p:is_floating_point() and p.dtype ~= base_dtype then
        t = factories.empty(p.shape, { dtype = base_dtype, device = 'meta' })
        parameter.mark(t, rawget(p, 'init'))
        for _, slot in ipairs(slots[p]) do slot[1][slot[2]] = t end
      end
      t:requires_grad_(false)
    end
  end

  local names = {}
  for _, nm in ipairs(order) do
    local name, m = nm[1], nm[2]
    local l = LoRALinear(m, { rank = opts.rank, alpha = opts.alpha, dropout = opts.dropout, rslora = opts.rslora,
                              seed = opts.seed, name = name, dtype = adapter_dtype[m] })
    replace(model, name, l)
    names[#names + 1] = name
  end
  rawset(model, '_lora', {
    rank = opts.rank, alpha = opts.alpha or opts.rank, dropout = opts.dropout or 0, targets = targets,
    rslora = opts.rslora and true or false,
  })
  return names
end

-- The LoRA settings apply() recorded on the model, or nil.
function M.config_of(model) return rawget(model, '_lora') end

-- The parameters that train: named_parameters() of those requiring grad
-- (what an optimizer of a LoRA run is given).
function M.trainable(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do
    if np[2].requires_grad then out[#out + 1] = np end
  end
  return out
end

-- Counts: {trainable=, frozen=, total=} parameters (whole, also when sharded).
function M.count(model)
  local r = { trainable = 0, frozen = 0 }
  for _, p in ipairs(model:parameters()) do
    local shape = rawget(p, 'fsdp_shape') or p.shape
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    if p.requires_grad then r.trainable = r.trainable + n else r.frozen = r.frozen + n end
  end
  r.total = r.trainable + r.frozen
  return r
end

-- Whether a parameter name is a LoRA adapter's (...q_proj.lora_A.weight).
local function is_adapter(name) return name:match('%.lora_[AB]%.weight$') ~= nil end
M.is_adapter = is_adapter

-- The adapters' whole tensors by name (model names: ...q_proj.lora_A.weight),
-- cloned. A sharded model gathers its trainable units one at a time
-- (collective: every rank calls it); rank0_only leaves others empty.
function M.adapter_state_dict(model, opts)
  opts = opts or {}
  local keep = not opts.rank0_only or dist.rank() == 0
  local out = {}
  local S = rawget(model, '_fsdp')
  if not S then
    for _, np in ipairs(model:named_parameters()) do
      if keep and is_adapter(np[1]) then out[np[1]] = np[2]:detach():clone() end
    end
    return out
  end
  autograd.no_grad(function()
    for _, u in ipairs(S.units) do
      local wanted = false
      for _, p in ipairs(u.params) do wanted = wanted or is_adapter(p.name) end
      if wanted and not u.frozen then
        local by, full = u:gather_full()
        for _, p in ipairs(u.params) do
          if keep and is_adapter(p.name) then out[p.name] = by[p]:clone() end
        end
        for _, t in pairs(by) do t:free() end
        full:free()
      end
    end
  end)
  return out
end

-- Fold every adapter into its base weight, W <- W + B A * scaling, and
-- put plain Linears back in the LoRALinears' places: the model is then
-- the base architecture with fine-tuned weights (save it with
-- models/hf.lua save_pretrained). An unsharded model with values; the
-- merged weights take opts.dtype (default: the adapter's dtype, f32 for a
-- bf16 base under f32 adapters). For a sharded model see
-- merged_state_dict. Returns the model.
function M.merge(model, opts)
  opts = opts or {}
  if rawget(model, '_fsdp') then
    fail('merge: the model is sharded; lora.merged_state_dict(model) gathers it unit by unit with the '
      .. 'adapters merged')
  end
  local layers = M.layers(model)
  if #layers == 0 then fail('merge: the model has no LoRA layers') end
  autograd.no_grad(function()
    for _, nm in ipairs(layers) do
      local name, l = nm[1], nm[2]
      if l.weight:is_meta() then fail('merge: %s is on the meta device (no values to merge)', name) end
      local dtype = opts.dtype or l.lora_A.weight.dtype
      local w = l.weight:to({ dtype = dtype }) + LoRALinear.delta(l.lora_A.weight, l.lora_B.weight, l.scaling, dtype)
      local lin = Linear(l.in_features, l.out_features, { bias = l.bias ~= nil, device = 'meta' })
      lin:register_parameter('weight', parameter.Parameter(w:contiguous(), { init = rawget(l.weight, 'init') }))
      if l.bias ~= nil then
        lin:register_parameter('bias', parameter.Parameter(l.bias:to({ dtype = dtype }):contiguous(),
                                                           { init = rawget(l.bias, 'init') }))
      end
      replace(model, name, lin)
    end
  end)
  rawset(model, '_lora', nil)
  return model
end

-- The whole state dict under the base model's names with every adapter
-- merged into its weight (W + B A * scaling, in W's dtype unless
-- opts.dtype) and no lora_ names: what an export of the fine-tuned model
-- writes. Sharded: gathered unit by unit (collective); opts.rank0_only.
function M.merged_state_dict(model, opts)
  opts = opts or {}
  local sd
  if rawget(model, '_fsdp') then
    sd = sharding.full_state_dict(model, { rank0_only = opts.rank0_only })
  else
    sd = model:state_dict()
  end
  local out = {}
  if next(sd) == nil then return out end
  autograd.no_grad(function()
    for _, nm in ipairs(M.layers(model)) do
      local name, l = nm[1], nm[2]
      local w, A, B = sd[name .. '.weight'], sd[name .. '.lora_A.weight'], sd[name .. '.lora_B.weight']
      local dtype = opts.dtype or w.dtype
      local delta = LoRALinear.delta(A:to({ dtype = 'f32' }), B:to({ dtype = 'f32' }), l.scaling)
      out[name .. '.weight'] = (w:to({ dtype = 'f32' }) + delta):to({ dtype = dtype }):contiguous()
    end
    for name, t in pairs(sd) do
      if not is_adapter(name) and out[name] == nil then
        out[name] = (opts.dtype and t:is_floating_point() and t.dtype ~= opts.dtype) and t:to({ dtype = opts.dtype }) or t
      end
    end
  end)
  return out
end

-- PEFT ----------------------------------------------------------------------------------

-- What PEFT calls the task of each model class, and whether its Linears
-- are stored transposed in Hugging Face's files (GPT-2's Conv1D).
local TASKS = {
  LlamaForCausalLM = { task = 'CAUSAL_LM' },
  GPT2LMHeadModel = { task = 'CAUSAL_LM', fan_in_fan_out = true },
  T5ForConditionalGeneration = { task = 'SEQ_2_SEQ_LM' },
}
-- Every causal LM class of the decoder families (models/families/).
for _, cls in ipairs({ 'Qwen2', 'Qwen3', 'Mistral', 'Gemma2', 'Gemma3', 'Phi3', 'Olmo2', 'Mixtral', 'Qwen3Moe' }) do
  TASKS[cls .. 'ForCausalLM'] = { task = 'CAUSAL_LM' }
end
local PREFIX = 'base_model.model.'

-- Write `dir`/adapter_config.json and `dir`/adapter_model.safetensors as
-- PEFT's save_pretrained does (the tensors under PEFT's names:
-- base_model.model.<module>.lora_A.weight), loadable by
-- peft.PeftModel.from_pretrained on the Hugging Face export of the base.
-- Collective on a sharded model; rank 0 writes. opts: task_type,
-- base_model_name_or_path, dtype (of the tensors; default theirs).
function M.save_peft(model, dir, opts)
  opts = opts or {}
  local cfg = rawget(model, '_lora')
  if not cfg then fail('save_peft: the model has no LoRA adapters (lora.apply first)') end
  local info = TASKS[model:class_name()] or {}
  local task = opts.task_type or info.task
  if task == nil then
    fail('save_peft: no PEFT task type known for a %s; pass task_type (e.g. "CAUSAL_LM")', model:class_name())
  end
  local sd = M.adapter_state_dict(model, { rank0_only = true })
  local err
  if dist.rank() == 0 then
    -- Built beside dir and swapped in whole ([Note: exports are published
    -- whole] in fsdp.io.publish).
    local stage
    local ok, e = pcall(function()
      stage = publish.begin(dir, { what = 'save_peft' })
      local list = {}
      for name, t in pairs(sd) do
        if opts.dtype and t.dtype ~= opts.dtype then t = t:to({ dtype = opts.dtype }) end
        list[#list + 1] = { PREFIX .. name, t }
      end
      table.sort(list, function(a, b) return a[1] < b[1] end)
      safetensors.save(files.join(stage.dir, 'adapter_model.safetensors'), list,
        { format = 'pt', [publish.ID_KEY] = stage.id }, { finite = true })
      local targets = json.array({})
      for i, t in ipairs(cfg.targets) do targets[i] = t end
      local text = json.encode({
        peft_type = 'LORA', task_type = task, r = cfg.rank, lora_alpha = cfg.alpha,
        lora_dropout = json.float(cfg.dropout), target_modules = targets, bias = 'none',
        fan_in_fan_out = info.fan_in_fan_out or false, use_rslora = cfg.rslora, use_dora = false,
        init_lora_weights = true, inference_mode = true, modules_to_save = json.null,
        layers_to_transform = json.null, layers_pattern = json.null, rank_pattern = {}, alpha_pattern = {},
        base_model_name_or_path = opts.base_model_name_or_path or json.null, revision = json.null,
      })
      files.write_atomic(files.join(stage.dir, 'adapter_config.json'), text)
      stage:commit()
    end)
    if not ok then
      err = e
      if stage then stage:abort() end
    end
  end
  if dist.world_size() > 1 then
    for r, e in ipairs(dist.all_gather_strings(err and tostring(err) or '')) do
      if e ~= '' then err = err or ('rank %d: %s'):format(r - 1, e) end
    end
  end
  if err then error(err, 0) end
  return dir
end

-- PEFT settings we cannot honour: an adapter using them is refused,
-- naming the key, rather than loaded into something else.
local function check_peft_config(h, path, model)
  local function refuse(fmt, ...) fail('load_peft: %s: ' .. fmt, path, ...) end
  if h.peft_type ~= 'LORA' then refuse("peft_type '%s' is not LORA", tostring(h.peft_type)) end
  if h.use_dora == true then refuse('use_dora is true (DoRA is not supported)') end
  if h.bias ~= nil and h.bias ~= 'none' then refuse("bias '%s' (only 'none': biases are not adapted)", tostring(h.bias)) end
  for _, k in ipairs({ 'rank_pattern', 'alpha_pattern' }) do
    if type(h[k]) == 'table' and next(h[k]) ~= nil then refuse('%s is not empty (one rank and alpha for all layers)', k) end
  end
  local null = json.null
  for _, k in ipairs({ 'modules_to_save', 'layers_to_transform', 'layers_pattern', 'exclude_modules',
                       'target_parameters', 'layer_replication', 'trainable_token_indices',
                       'alora_invocation_tokens' }) do
    if h[k] ~= nil and h[k] ~= null then refuse('%s is set (not supported)', k) end
  end
  for _, k in ipairs({ 'lora_bias', 'use_qalora', 'use_bdlora' }) do
    if h[k] == true then refuse('%s is true (not supported)', k) end
  end
  local want = (TASKS[model:class_name()] or {}).fan_in_fan_out or false
  if h.fan_in_fan_out ~= nil and h.fan_in_fan_out ~= want then
    refuse('fan_in_fan_out is %s, but a %s wants %s', tostring(h.fan_in_fan_out), model:class_name(), tostring(want))
  end
  -- Numbers as PEFT reads them, NaN and infinity refused (fsdp.validate):
  -- a NaN lora_alpha scales every update to NaN.
  for k, rule in pairs({ r = validate.COUNT, lora_alpha = validate.POSITIVE, lora_dropout = validate.PROBABILITY }) do
    if k == 'r' or (h[k] ~= nil and h[k] ~= null) then
      local why = validate.problem(h[k], rule)
      if why then refuse('%s %s', k, why) end
    end
  end
  local targets = h.target_modules
  if type(targets) == 'string' then
    refuse("target_modules is the regular expression '%s'; give the module names as a list", targets)
  end
  if type(targets) ~= 'table' or #targets == 0 then refuse('target_modules is missing or empty') end
  for _, t in ipairs(targets) do
    if type(t) ~= 'string' then refuse('target_modules holds %s, not a module name', validate.show(t)) end
  end
end

-- Load a PEFT adapter directory (adapter_config.json +
-- adapter_model.safetensors) into `model`: applies LoRA as the config says
-- when the model has none yet (its rank, alpha, dropout, targets must then
-- agree), then copies the adapter weights, every adapter of the model
-- covered and no name left over. The model holds values (loaded or
-- sharded); not on the meta device. Returns the model.
function M.load_peft(model, dir, opts)
  opts = opts or {}
  -- A regular file or none: a FIFO or a device is refused naming it.
  local function regular(path)
    local ok, is = pcall(files.is_file, path)
    if not ok then fail('load_peft: %s', is) end
    if not is then fail('load_peft: %s: no such file', path) end
  end
  local cpath = files.join(dir, 'adapter_config.json')
  regular(cpath)
  local text, err = files.read(cpath, files.LIMITS.text[1], 'a JSON config')
  if not text then fail('load_peft: %s', err) end
  local ok, h = pcall(json.decode, text)
  if not ok then fail('load_peft: %s: %s', cpath, tostring(h)) end
  if type(h) ~= 'table' then fail('load_peft: %s: not a JSON object', cpath) end
  check_peft_config(h, cpath, model)
  local targets = {}
  for i, t in ipairs(h.target_modules) do targets[i] = t end
  table.sort(targets) -- PEFT writes a set: its order means nothing
  local null = json.null
  local want = { rank = h.r, alpha = (h.lora_alpha ~= nil and h.lora_alpha ~= null) and h.lora_alpha or 8,
                 dropout = (h.lora_dropout ~= nil and h.lora_dropout ~= null) and h.lora_dropout or 0,
                 targets = targets, rslora = h.use_rslora == true }
  -- The rank against the adapters' shapes in the file's header, before
  -- anything is made: lora_A is [r, in], lora_B [out, r].
  local wpath = files.join(dir, 'adapter_model.safetensors')
  regular(wpath)
  do
    local f = safetensors.open(wpath)
    for _, name in ipairs(f:names()) do
      local which = name:match('%.(lora_[AB])%.[^.]*%.?weight$')
      local shape = f:info(name).shape
      local got = which == 'lora_A' and shape[1] or which == 'lora_B' and shape[2] or nil
      if got and got ~= h.r then
        f:close()
        fail('load_peft: %s: r is %s, but %s in %s is [%s] (its rank %d)', cpath, validate.show(h.r), name, wpath,
          table.concat(shape, ', '), got)
      end
    end
    f:close()
  end
  local have = rawget(model, '_lora')
  if have then
    local same = have.rank == want.rank and have.alpha == want.alpha and have.rslora == want.rslora
    if not same then
      fail('load_peft: %s has r=%s lora_alpha=%s use_rslora=%s, the model\'s adapters rank=%s alpha=%s rslora=%s',
        cpath, tostring(want.rank), tostring(want.alpha), tostring(want.rslora), tostring(have.rank),
        tostring(have.alpha), tostring(have.rslora))
    end
  else
    M.apply(model, want)
  end
  local f = safetensors.open(wpath)
  local state, unexpected, file_name = {}, {}, {}
  for _, name in ipairs(f:names()) do
    -- PEFT writes lora_A.weight; older versions (and other tools) keep the
    -- adapter name: lora_A.default.weight.
    local ours = name:sub(1, #PREFIX) == PREFIX and name:sub(#PREFIX + 1) or nil
    if ours then ours = ours:gsub('%.(lora_[AB])%.[^.]+%.weight$', '.%1.weight') end
    if ours and is_adapter(ours) then
      state[ours], file_name[ours] = f:get(name), name
    else
      unexpected[#unexpected + 1] = name
    end
  end
  local missing = {}
  for _, np in ipairs(model:named_parameters()) do
    if is_adapter(np[1]) then
      if state[np[1]] == nil then missing[#missing + 1] = np[1] end
    end
  end
  local own = {}
  for _, np in ipairs(model:named_parameters()) do own[np[1]] = true end
  for name in pairs(state) do
    if not own[name] then unexpected[#unexpected + 1] = PREFIX .. name end
  end
  if #missing > 0 or #unexpected > 0 then
    table.sort(unexpected)
    f:close()
    fail('load_peft: %s does not fit the model: %s%s', wpath,
      #missing > 0 and ('missing ' .. table.concat(missing, ', ')) or '',
      #unexpected > 0 and ((#missing > 0 and '; ' or '') .. 'unexpected ' .. table.concat(unexpected, ', ')) or '')
  end
  local ok2, err = pcall(function()
    f:verify()
    -- Values that are not finite would make every logit NaN: refused,
    -- naming the tensor (a C scan of each mapped tensor).
    local names = {}
    for name in pairs(state) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      local at = nonfinite.first_nonfinite_element(state[name])
      if at then
        fail('load_peft: %s: %s holds a NaN or infinite value (element %d)', wpath, file_name[name], at)
      end
    end
    local params = {}
    for _, np in ipairs(model:named_parameters()) do params[np[1]] = np[2] end
    for name, t in pairs(state) do
      if params[name].dtype ~= t.dtype then state[name] = t:to({ dtype = params[name].dtype }) end
    end
    model:load_state_dict(state, { strict = false })
  end)
  f:close()
  if not ok2 then error(err, 0) end
  return model
end

-- recipes -------------------------------------------------------------------------------

-- The recipes' options (--lora_rank=0 is full fine-tuning).
M.OPTIONS = {
  lora_rank = { 0, 'LoRA: rank of the adapters (0: no LoRA, every parameter trains)', int = true, min = 0 },
  lora_alpha = { 16, 'LoRA: alpha; the update B A is scaled by alpha/rank', positive = true, needs = 'lora_rank' },
  lora_dropout = { 0, 'LoRA: dropout probability on the adapters\' input', min = 0, below = 1, needs = 'lora_rank' },
  lora_targets = { '', 'LoRA: comma-separated module names to adapt (a name matches the Linears whose path ends '
                       .. 'with it; empty: the recipe\'s default)', needs = 'lora_rank' },
  lora_base_dtype = { '', 'LoRA: keep the frozen base in this dtype (bf16 halves its bytes; empty: the model\'s)',
                      one_of = { '', 'bf16', 'f32', 'f16' }, needs = 'lora_rank' },
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return options.merge(M.OPTIONS, own) end

local function apply_cfg(model, cfg, default_targets)
  local targets = cfg.lora_targets ~= '' and cfg.lora_targets or default_targets
  local ok, names = pcall(M.apply, model, {
    rank = cfg.lora_rank, alpha = cfg.lora_alpha, dropout = cfg.lora_dropout, targets = targets,
    base_dtype = cfg.lora_base_dtype ~= '' and cfg.lora_base_dtype or nil, seed = cfg.seed,
  })
  if not ok then
    return nil, ('--lora_targets %s: %s'):format(targets, (options.bare(names):gsub('^lora: ', '')))
  end
  return names, targets
end

-- For a recipe's option checks (options.config's function): with
-- --lora_rank > 0, whether the targets fit the model build() makes (on
-- meta: cheap), so a wrong name is refused with the other bad options,
-- before the run prints or builds anything. Raises the usage message.
function M.check_options(cfg, build, default_targets)
  if (cfg.lora_rank or 0) == 0 then return end
  local names, err = apply_cfg(build(), cfg, default_targets)
  if not names then error(err, 0) end
end

-- The recipe's one line: with --lora_rank > 0, apply LoRA to `model` (on
-- meta, before sharding) with the options, `default_targets` when
-- --lora_targets is empty; a target the model lacks is a usage error
-- naming --lora_targets. Prints what trains. Returns the adapted names or nil.
function M.apply_options(model, cfg, default_targets)
  if (cfg.lora_rank or 0) == 0 then return nil end
  local names, targets = apply_cfg(model, cfg, default_targets)
  if not names then options.usage_error(targets) end
  local n = M.count(model)
  print(('lora: rank %d, alpha %s on %d Linears (%s): %d trainable of %d parameters (%.2f%%)%s'):format(
    cfg.lora_rank, tostring(cfg.lora_alpha), #names, tostring(targets), n.trainable, n.total,
    100 * n.trainable / n.total, cfg.lora_base_dtype ~= '' and (', base in ' .. cfg.lora_base_dtype) or ''))
  return names
end

return M

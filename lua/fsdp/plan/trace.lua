-- fsdp.plan.trace: what a model's training step keeps, frees and computes,
-- measured by running that step on meta tensors (fsdp.plan's input).
--
-- The model's own forward, loss and backward run once on the meta device,
-- whose memory statistics count the bytes every meta tensor stands for
-- ([Note: virtual storage] in core/tensor/storage.c: views share their
-- base's bytes, the autograd engine frees saved tensors as it would on a
-- device). Hooks on the blocks (the repeated layers the planner shards,
-- checkpoints and offloads one by one) cut the step into the segments
-- fsdp.plan.sim replays with the sharding around them:
--   stem     from the batch to the first block's input (embeddings)
--   blocks   each block's forward and backward; a block whose class and
--            parameter shapes were seen before is not measured again but
--            takes the profile of the first such block (a 70B model's 80
--            layers cost one)
--   gaps     code between two blocks of different kinds (T5's encoder
--            norm between its encoder and decoder stacks), kept with the
--            block after it
--   head     from the last block's output to the loss and back
-- and a forward without grad measures what a checkpointed block keeps and
-- how high its recompute goes. Nothing here knows a model family: any model
-- with a loss and an example batch is traced.
--
-- [Note: exact collection while tracing]
-- A tensor's bytes go when its last reference does, and a Lua handle is
-- dropped only when the collector runs. Lua's automatic collector is
-- held for the whole trace (Tensor.hold_collector): running in steps as
-- the Lua heap grows, it freed the trace's own dead tensors at moments
-- that depended on what the process had allocated before, so a plan's
-- activations moved by a few KiB from one call to the next. The measured
-- runs this predicts (tests/mpi/plan_memory.lua) collect before every
-- tensor is wrapped (fsdp.set_collect_budget(0)). The trace collects at
-- every boundary of the segments it measures (until a cycle frees
-- nothing), so what they keep is exact, and before every
-- wrap inside the measured blocks' forward (with and without grad) and
-- the head's, where Lua temporaries would otherwise raise the high mark
-- (the next op's output allocated while the last one's dead input still
-- counts), and inside every backward segment: backward runs in C, but
-- Lua nodes wrap there too (fsdp.tp's collectives: a sequence-parallel
-- region's reduce-scatter leaves its transposed copy and its output as
-- garbage, which raised a planned block's backward high mark by 74 KiB
-- in tests/mpi/plan_memory.lua mesh). The stem and gaps' forward hold few
-- temporaries, and blocks it does not measure take their
-- profile from the first of their kind: there garbage is left for the
-- next boundary. A full collection walks the whole Lua heap (about a
-- millisecond for Llama-2-70B's, ten for DeepViT-8B's 952 blocks), so
-- this is the trace's cost: benchmarks/plan_time.lua.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local autograd = require 'fsdp.autograd'
local factories = require 'fsdp.factories'
local ffi = require 'ffi'
local hooks = require 'fsdp.sharding.hooks'
local C = core.C

local M = {}

local META = C.fl_device_make(C.FL_DEVICE_META, 0)
local stats = ffi.new('fl_memory_stats')

local function in_use()
  C.fl_memory_stats_get(META, stats)
  return tonumber(stats.in_use)
end
local function peak()
  C.fl_memory_stats_get(META, stats)
  return tonumber(stats.peak)
end
local function reset_peak() C.fl_memory_stats_reset(META) end
-- Cycles until one frees nothing: a finalizer that runs in one cycle may
-- drop the last reference to another object, whose own finalizer (a
-- tensor's, say) runs only in the next, and chains of them can be any
-- length. Garbage left by whatever ran before the plan cannot move the
-- bytes read here at all ([Note: frees from before a trace], storage.c:
-- run brackets the trace); this loop is for the trace's own temporaries.
local function collect()
  local bytes, kb = in_use(), collectgarbage('count')
  repeat
    local bytes0, kb0 = bytes, kb
    Tensor.full_collection() -- (keeps the automatic collector held)
    bytes, kb = in_use(), collectgarbage('count')
  until bytes == bytes0 and kb >= kb0
end
local function size_of(dtype) return tonumber(C.fl_dtype_size(core.dtype(dtype))) end

-- At a segment's start: collect now, and with per_wrap before every
-- wrap too; at its end (on = false): no collections until the next
-- segment (meta bytes do not pace the collector, so nothing else would).
-- See [Note: exact collection while tracing].
local function exact(on, per_wrap)
  Tensor.set_collect_budget((on and per_wrap) and 0 or math.huge)
  if on then collect() end
end

-- The blocks' kinds: class name and parameter shapes and dtypes.
local function kind_of(m)
  local parts = { m:class_name() }
  for _, np in ipairs(m:named_parameters()) do
    parts[#parts + 1] = np[1] .. ':' .. np[2].dtype .. '[' .. table.concat(np[2].shape, ',') .. ']'
  end
  return table.concat(parts, ' ')
end

-- Bytes of the gradients the given parameters hold now.
local function grad_bytes(params)
  local n = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g then n = n + g:numel() * size_of(g.dtype) end
  end
  return n
end

-- Put compute-dtype stand-ins in place of the model's parameters and
-- buffers (what fsdp.shard gathers and casts: each unit's param dtype,
-- the buffer dtype); returns the function that puts the originals back.
local function cast_model(model, param_dtype_of, buffer_dtype)
  local undo, made = {}, {}
  local function stand_in(t, dtype, grad)
    if not made[t] then
      local s = factories.empty(t.shape, { dtype = dtype, device = 'meta' })
      if grad then s:requires_grad_(true) end
      made[t] = s
    end
    return made[t]
  end
  for _, m in ipairs(model:modules()) do
    local ps, bs = rawget(m, '_parameters'), rawget(m, '_buffers')
    for name, p in pairs(ps or {}) do
      local d = p:is_floating_point() and param_dtype_of(p) or p.dtype
      undo[#undo + 1] = { ps, name, p }
      ps[name] = stand_in(p, d, p.requires_grad)
    end
    for name, b in pairs(bs or {}) do
      if buffer_dtype and b:is_floating_point() then
        undo[#undo + 1] = { bs, name, b }
        bs[name] = stand_in(b, buffer_dtype, false)
      end
    end
  end
  return made, function()
    for i = #undo, 1, -1 do
      local u = undo[i]
      u[1][u[2]] = u[3]
    end
  end
end

-- A segment's measurement: bytes in use at its start (after collection),
-- and at its end its net change, its peak above the start and the
-- gradient bytes it added to `params`.
-- The records of the TP collectives a planning group made (fsdp.dist's
-- [Note: planning groups]) while a trace runs, or nil; each segment keeps
-- those made inside it (`collectives`).
local tp_log
local function slice(log, from, to)
  local r = {}
  for i = from, to do r[#r + 1] = log[i] end
  return r
end
local function open(params)
  reset_peak()
  return { start = in_use(), grads = params and grad_bytes(params) or 0, params = params, flops = C.fl_flops(),
           log0 = tp_log and #tp_log or 0 }
end
local function close(seg)
  local p = peak()
  collect()
  local now = in_use()
  local w = seg.params and (grad_bytes(seg.params) - seg.grads) or 0
  return { net = now - seg.start, high = math.max(p, now) - seg.start, w = w,
           flops = tonumber(C.fl_flops() - seg.flops),
           collectives = tp_log and slice(tp_log, seg.log0 + 1, #tp_log) or {} }
end

-- A backward segment as fsdp.plan.sim's one step: up by a + w (w the
-- parameter gradients, kept until the unit is reduced), then down by f.
local function as_step(b)
  return { a = b.high - b.w, w = b.w, f = b.high - b.net, t = 0 }
end

local pack = autograd.pack

-- What a model caches across steps (RoPE tables) is made by its first
-- forward of a kind; a later trace of the same model finds it made and
-- measures nothing, so each model remembers what its first trace of a
-- length and dtype measured (the largest: its own tables, not a family's).
local caches_of = setmetatable({}, { __mode = 'k' })
local function remember_caches(model, o, measured)
  local key = ('%s/%s'):format(o.seq or '-', o.input_dtype)
  local known = caches_of[model] or {}
  caches_of[model] = known
  known[key] = math.max(known[key] or 0, measured)
  return known[key]
end

-- Trace one training step. o: blocks (modules in forward order), batch,
-- seq, example_batch(batch, seq) -> args of loss, tokens; loss(model, ...)
-- -> scalar; param_dtype_of(tensor) -> dtype, buffer_dtype, input_dtype
-- (floating inputs are cast to it, as the root unit's pre-forward does),
-- root_params (parameters of no block), f32_gemm (bool), tp_log (the log
-- of the planning group a tensor-parallel model was parallelized with).
-- Returns { stem=, head=, blocks = {prof per block, forward order},
-- inputs=, caches=, flops = {total=, blocks_forward=}, tokens=,
-- collectives = {forward =, backward =} (the step's TP collectives; a
-- block profile's own in prof.collectives) }.
local function trace(model, o)
  local blocks = o.blocks
  local kinds, first_of = {}, {}
  for i, b in ipairs(blocks) do
    kinds[i] = kind_of(b)
    if not first_of[kinds[i]] then first_of[kinds[i]] = i end
  end
  local measured = {}
  for i = 1, #blocks do measured[i] = first_of[kinds[i]] == i end
  local params_of = {}
  for i, b in ipairs(blocks) do params_of[i] = b:parameters() end

  -- one pass's state
  local pass, grad_pass = {}, false
  local seg, seg_name -- the forward segment open now
  local function start_segment(name, params)
    exact(true, name:match('^block') ~= nil or (grad_pass and name == 'head'))
    seg, seg_name = open(params), name
  end
  local function end_segment()
    pass[seg_name] = close(seg)
    exact(false)
    seg = nil
  end
  local entered = 0 -- the last block whose forward started in this pass

  local handles = {}
  local bwd = {} -- backward measurements by name
  -- [Note: inputs several blocks share] T5's decoder blocks all read the
  -- encoder's output. The engine sums their gradients for it into one
  -- buffer: the first block in backward order (the last in forward) hands
  -- its gradient over, each other one adds its own, which allocates the
  -- sum and frees two (net: one gradient less), right after that block's
  -- backward, where the trace's cut between blocks does not see it. So a
  -- measured block records its shared inputs' gradient bytes (shared_bytes),
  -- every block with a later user of a shared input gets that merge as a
  -- step, and the segment after the measured block, which did see its
  -- merge, gives it back.
  -- (inputs are known by a number: holding the tensors would keep their
  -- bytes alive in the trace)
  local id_of = setmetatable({}, { __mode = 'k' })
  local users, last_user = {}, {} -- input number -> blocks reading it, the last one
  local inputs_of = {} -- block index -> the numbers of its inputs that require grad
  local shared_bytes = {}
  local no_backward = {} -- block index -> true when no gradient flows through it
  local bseg, bseg_name
  local function bwd_boundary(next_name, params)
    if bseg then
      bwd[bseg_name] = close(bseg)
      exact(false)
    end
    bseg, bseg_name = nil, nil
    if next_name then
      exact(true, true)
      bseg, bseg_name = open(params), next_name
    end
  end

  for i, b in ipairs(blocks) do
    handles[#handles + 1] = b:register_forward_pre_hook(function(_, ...)
      local args = pack(...)
      -- The segments follow the blocks' order: each runs once, in order.
      if i ~= entered + 1 then
        core.fail(('fsdp.plan: block %d (%s) ran %s in the traced step: the blocks must run once each, '
          .. 'in the order of the model\'s ModuleLists (or pass blocks= matching what its forward calls)')
          :format(i, b:class_name(), i <= entered and 'again' or ('before block %d'):format(entered + 1)))
      end
      entered = i
      -- the gap before this block (or the stem) ends here
      if seg then end_segment() end
      if measured[i] then start_segment('block' .. i, params_of[i]) end
      if grad_pass then
        local ids = {}
        for j, t in ipairs((autograd.grad_tensors(args))) do
          local id = id_of[t] or (#users + 1)
          id_of[t], ids[j] = id, id
          users[id], last_user[id] = (users[id] or 0) + 1, i
        end
        inputs_of[i] = ids
      end
      if grad_pass and measured[i] then
        local ids = inputs_of[i]
        args = autograd.on_gradient('TraceBlockInputs[' .. i .. ']', args, function(grads)
          local n = 0
          for j, id in ipairs(ids) do
            local g = grads[j]
            if g and users[id] > 1 then n = n + g:numel() * size_of(g.dtype) end
          end
          shared_bytes[i] = n
          -- this block's backward is over: the gap before it (or the stem) starts
          bwd_boundary(i == 1 and 'stem' or 'gap' .. i, o.root_params)
          return grads
        end)
      end
      return unpack(args, 1, args.n)
    end)
    handles[#handles + 1] = b:register_forward_hook(function(_, _, out)
      if seg then end_segment() end
      -- [Note: frozen blocks no gradient reaches] A block whose outputs
      -- do not require grad (LoRA on lm_head alone: every block frozen,
      -- and nothing before it trains) has no backward: the engine stops
      -- above it, and so does the step the sharding hooks run.
      if grad_pass then no_backward[i] = #(autograd.grad_tensors(out)) == 0 end
      local last = i == #blocks
      -- what follows is measured when the next block is (its gap) or is the head
      if last then start_segment('head', nil)
      elseif measured[i + 1] then start_segment('gap' .. (i + 1), nil) end
      if grad_pass and (measured[i] or last or measured[i + 1]) then
        local new, attached = autograd.on_gradient('TraceBlockOutputs[' .. i .. ']', out, function(grads)
          bwd_boundary(measured[i] and 'block' .. i or nil, measured[i] and params_of[i] or nil)
          return grads
        end)
        if attached then return new end
      end
      return nil
    end, { all_outputs = true })
  end

  local inputs_bytes, caches, tokens
  local flops = { total = 0, blocks_forward = 0, bytes = 0, bytes_forward = 0 }
  local result = {}
  -- FLOPs from zero: a count saturated by earlier work (huge meta
  -- models) would read as no FLOPs at all; the outer count gets ours back.
  local outer_flops = C.fl_flops_exchange(0)
  local ok, err = pcall(function()
    -- the batch
    collect()
    local before = in_use()
    local args, n_tokens, seq = o.example_batch(o.batch, o.seq)
    if type(args) ~= 'table' then
      core.fail(('fsdp.plan: example_batch must return the arguments of the loss as a table, got %s'):format(type(args)))
    end
    args.n = args.n or #args
    collect()
    inputs_bytes, tokens = in_use() - before, n_tokens or o.batch * (seq or o.seq or 1)
    result.seq = seq or o.seq or 1
    -- (the root unit's cast of floating inputs; on a copy: args serves both passes)
    local cast_inputs = hooks.cast_inputs
    local function cast(a) return cast_inputs(autograd.pack(unpack(a, 1, a.n)), o.input_dtype) end

    -- 1. without grad: what checkpointed blocks keep (their output) and
    -- their forward's high mark; caches the model makes once (RoPE tables)
    local base = in_use()
    entered = 0
    autograd.no_grad(function()
      start_segment('stem', nil)
      local a = cast(args)
      o.loss(model, unpack(a, 1, a.n))
      a = nil -- luacheck: ignore
      if seg then end_segment() end
    end)
    collect()
    caches = remember_caches(model, o, in_use() - base)
    local nograd = pass

    -- 2. with grad: forward, loss, backward
    pass, grad_pass, entered = {}, true, 0
    collect()
    local f0, m0 = C.fl_flops(), C.fl_bytes_moved()
    local l0 = tp_log and #tp_log or 0
    start_segment('stem', nil)
    local a = cast(args)
    local loss = o.loss(model, unpack(a, 1, a.n))
    a = nil -- luacheck: ignore
    if seg then end_segment() end
    local f1, m1 = C.fl_flops(), C.fl_bytes_moved()
    local l1 = tp_log and #tp_log or 0
    local forward = pass
    local root = o.root_params
    bwd_boundary('head', root)
    loss:backward()
    loss = nil -- luacheck: ignore
    bwd_boundary(nil) -- the stem's segment (or the last one open) ends with backward
    local f2 = C.fl_flops()
    flops.total = tonumber(f2 - f0)
    -- the step's TP collectives (none without a planning group)
    local l2 = tp_log and #tp_log or 0
    result.collectives = { forward = tp_log and slice(tp_log, l0 + 1, l1) or {},
                           backward = tp_log and slice(tp_log, l1 + 1, l2) or {} }
    -- what the memory-bound ops moved ([Note: bytes moved]), for devices
    -- whose profile prices them (fsdp.plan.cost)
    flops.bytes, flops.bytes_forward = tonumber(C.fl_bytes_moved() - m0), tonumber(m1 - m0)

    -- block profiles ([Note: inputs several blocks share])
    local function merges(i) -- whether a later block shares an input of block i
      for _, id in ipairs(inputs_of[i] or {}) do if last_user[id] > i then return true end end
      return false
    end
    for i = 1, #blocks do
      local s_i = shared_bytes[i]
      if s_i and s_i > 0 and merges(i) then
        local after = bwd[i == 1 and 'stem' or 'gap' .. i]
        if after then after.net = after.net + s_i end
      end
    end
    local prof_of_kind = {}
    for i = 1, #blocks do
      local rep = first_of[kinds[i]]
      local p = prof_of_kind[rep]
      if not p then
        local f, g, b = forward['block' .. rep], nograd['block' .. rep], bwd['block' .. rep]
        if f and g and not b and no_backward[rep] then b = { net = 0, high = 0, w = 0, flops = 0 } end
        if not (f and g and b) then
          core.fail(('fsdp.plan: block %d (%s) did not run forward and backward once in the traced step'):format(
            rep, blocks[rep]:class_name()))
        end
        p = { saved = f.net, fwd_extra = f.high - f.net, input = g.net, fwd_ckpt_extra = g.high - g.net,
              steps = { as_step(b) }, flops_forward = f.flops or 0,
              collectives = { forward = f.collectives, backward = b.collectives or {} } }
        prof_of_kind[rep] = p
      end
      local merge = shared_bytes[rep] or 0
      if merge > 0 and merges(i) then
        local q = {}
        for k, v in pairs(p) do q[k] = v end
        q.steps = { p.steps[1], { a = merge, w = 0, f = 2 * merge, t = 0 } }
        p = q
      end
      local gap_f, gap_b = forward['gap' .. i], bwd['gap' .. i]
      if gap_f or gap_b then
        local q = {}
        for k, v in pairs(p) do q[k] = v end
        q.gap = { saved = gap_f and gap_f.net or 0, fwd_extra = gap_f and (gap_f.high - gap_f.net) or 0,
                  steps = gap_b and { as_step(gap_b) } or {} }
        result[i] = q
      else
        result[i] = p
      end
    end
    local hf, hb, sf, sb = forward.head, bwd.head, forward.stem, bwd.stem
    if #blocks == 0 then -- the whole model is the stem: its step is the head's
      hf, hb, sf, sb = forward.stem, bwd.head, nil, nil
    end
    result.head = { saved = hf and hf.net or 0, fwd_extra = hf and (hf.high - hf.net) or 0,
                    steps = hb and { as_step(hb) } or {} }
    result.stem = { saved = sf and sf.net or 0, input = 0, steps = sb and { as_step(sb) } or {} }
    for i = 1, #blocks do flops.blocks_forward = flops.blocks_forward + result[i].flops_forward end
    flops.forward = tonumber(f1 - f0)
  end)
  C.fl_flops_add(C.fl_flops_exchange(outer_flops))
  for _, h in ipairs(handles) do h:remove() end
  if not ok then error(err, 0) end
  return {
    blocks = result, stem = result.stem, head = result.head, inputs = inputs_bytes, caches = caches,
    flops = flops, tokens = tokens, seq = result.seq, collectives = result.collectives,
  }
end

-- Trace with the model's parameters cast (see cast_model) and the meta
-- device imitating o.f32_gemm; everything is put back afterwards.
local function run(model, o)
  local made, restore = cast_model(model, o.param_dtype_of, o.buffer_dtype)
  local root = {}
  for i, p in ipairs(o.root_params) do root[i] = made[p] or p end
  o = setmetatable({ root_params = root }, { __index = o })
  local was = C.fl_meta_set_f32_gemm(o.f32_gemm and true or false)
  local budget = Tensor.set_collect_budget(math.huge)
  local held = Tensor.hold_collector(true)
  C.fl_meta_trace_begin()
  tp_log = o.tp_log
  local ok, r = pcall(trace, model, o)
  tp_log = nil
  C.fl_meta_trace_end()
  Tensor.hold_collector(held)
  Tensor.set_collect_budget(budget)
  C.fl_meta_set_f32_gemm(was)
  restore()
  if not ok then error(r, 0) end
  return r
end

-- Traces of a model, by everything they depend on (its parameters, their
-- dtypes and requires_grad, the blocks, the batch and length, the dtypes,
-- the functions that make the batch and the loss), so that plans that
-- differ only in what the trace does not see (world, strategy, optimizer,
-- prefetch, the device's memory) trace once. A model changed since (LoRA
-- applied, parameters frozen or cast) has another key.
local traces = setmetatable({}, { __mode = 'k' })

local function key_of(model, o)
  -- With f32 GEMMs the staging depends on the CPU's GEMM library too
  -- (fsdp.cpu_gemm_use may switch it between plans).
  local gemm = o.f32_gemm and ffi.string(C.fl_cpu_gemm_library()) or ''
  local parts = { o.batch, tostring(o.seq), tostring(o.buffer_dtype), o.input_dtype, tostring(o.f32_gemm), gemm,
                  tostring(o.example_batch_fn), tostring(o.loss_fn) }
  for _, b in ipairs(o.blocks) do parts[#parts + 1] = tostring(b) end
  for _, p in ipairs(model:parameters()) do
    parts[#parts + 1] = tostring(p) .. (p:is_floating_point() and o.param_dtype_of(p) or p.dtype)
      .. (p.requires_grad and '+' or '-')
  end
  return table.concat(parts, ' ')
end

-- Forget the traces of a model (its next plan traces it again): for
-- benchmarks, or after changing its forward code in place.
function M.forget(model) traces[model] = nil end

-- Trace one training step (see trace above), or give the trace of an
-- earlier call with the same key (o.example_batch_fn, o.loss_fn: the
-- functions behind o.example_batch and o.loss, whose wrappers are new
-- each call). The result is shared: read it, do not change it.
function M.run(model, o)
  local key = key_of(model, o)
  local known = traces[model] or {}
  traces[model] = known
  if not known[key] then known[key] = run(model, o) end
  return known[key]
end

return M

-- fsdp.plan.sim: one training step of one rank, replayed in bytes for the
-- planner (fsdp.plan): when units are gathered and freed, what forward
-- saves, what each backward step allocates and frees, when gradients are
-- packed, reduced and adopted. The result is the peak of the bytes in use
-- and where it happens.
--
-- It follows the code it predicts, so a change there belongs here too:
--   lua/fsdp/sharding/init.lua  pre/post forward and backward hooks: the
--       root stays gathered from its forward to the end of backward;
--       FULL_SHARD/HYBRID_SHARD units are freed after their forward and
--       gathered again for backward, with the next unit prefetched ('pre'
--       when a unit's backward starts, 'post' after its reduction); a
--       unit's packed gradient lives until the next unit's post-backward
--       (one reduction in flight).
--   frozen units (fsdp/sharding/unit.lua [Note: frozen parameters]): gathered
--       and freed with their block like the others, never packed or reduced.
--   core/sharding/unit.c  pack: a flat gradient [padded] in the reduce dtype;
--       the old sharded gradient is released first when zero_grad dropped
--       it (the recipes' loop); reduce-scatter into a [shard] buffer when
--       the group has several ranks, else the packed gradient is the
--       shard; the reduced gradient is adopted, or cast to the gradient
--       dtype.
--   fsdp.checkpoint  a checkpointed block keeps its input; its backward
--       runs its forward again, then the same steps.
--   fsdp.offload_activations (core/autograd/offload.c)  what an offloaded
--       block keeps (its saved tensors, or with checkpointing its input)
--       is copied to pinned CPU memory while forward goes on and comes
--       back just before the backward that reads it. Two approximations:
--       - forward: the block's kept bytes are on the device while its own
--         forward runs and leave when it ends (high within the block: what
--         it saved first may be copied already). The caching pool really
--         holds each device block until its copy has run on the copy
--         stream, so this assumes the CPU link keeps up with compute;
--         when it does not, a few blocks' copies are still in flight and
--         on the device (fsdp.plan.cost prices the excess time and reports
--         the bytes as time.offload.backlog; the peak leaves them out).
--       - backward (errs high): the whole block's kept bytes come back
--         when its backward starts, before its first step. The engine restores them
--         node by node (fl_node_unpack_saved), so the later nodes' tensors
--         are really still in CPU memory while the first steps run; the
--         steps do not say which saved tensors each one reads. With
--         checkpointing this is exact: the checkpoint node restores its
--         input, then the recompute (never offloaded) runs.
--       The stem and head are not offloaded (the planner offloads the
--       blocks, as checkpoint does).
-- The model's part (saved bytes, backward steps) comes from the trace of
-- its step (fsdp.plan.trace).
local M = {}

-- units: the planner's units (root last) with gb (gathered bytes), G
-- (shard group size), padded, shard, rs/gs/ps (reduce, grad, param dtype
-- sizes), reshard (after forward), root; blocks: {{units = {...}, prof =
-- {saved=, input=, fwd_extra=, fwd_ckpt_extra=, steps=, gap=}, name=}...}
-- in forward order (gap: {saved=, fwd_extra=, steps=} of code between the
-- block before and this one);
-- head/stem: profiles; opts: persistent, inputs, checkpoint (bool),
-- offload_activations (bool: the blocks' kept bytes live in CPU memory),
-- forward_prefetch, backward_prefetch ('pre', 'post', false), f32_reduce
-- (the backend stages 16-bit reductions in f32: core/comm/collectives.c,
-- for MPI; NCCL reduces bf16 itself). Units that
-- hold no block's parameters (a policy wrapping the embedding, say) are
-- treated like the root: gathered for the whole step, reduced last.
function M.run(units, blocks, stem, head, opts)
  local live = opts.persistent + opts.inputs
  local peak, peak_at = live, 'rest'
  local gathered_now, gathered_peak = 0, 0
  local saved_now, saved_peak = 0, 0
  local pinned = 0 -- offloaded activations in pinned CPU memory
  local is_gathered, vgrads = {}, {}
  local root = units[#units]
  local function bump(x, where)
    live = live + x
    if live > peak then peak, peak_at = live, where end
  end
  local function check(extra, where)
    if live + extra > peak then peak, peak_at = live + extra, where end
  end
  local function gather(u, where)
    if u and not is_gathered[u] then
      is_gathered[u] = true
      gathered_now = gathered_now + u.gb
      gathered_peak = math.max(gathered_peak, gathered_now)
      bump(u.gb, where)
    end
  end
  local function free(u)
    if is_gathered[u] then
      is_gathered[u] = nil
      gathered_now = gathered_now - u.gb
      live = live - u.gb
    end
  end
  local function keep(bytes)
    saved_now = saved_now + bytes
    saved_peak = math.max(saved_peak, saved_now)
  end
  local function run_steps(steps, u, where)
    for _, st in ipairs(steps) do
      bump(st.a + st.w, where)
      check(st.t or 0, where)
      vgrads[u] = (vgrads[u] or 0) + st.w
      live = live - st.f
    end
  end
  -- Units of a block after (forward order) or before (backward) it.
  local function units_of(i) return blocks[i] and blocks[i].units or {} end

  local in_block = {}
  for _, b in ipairs(blocks) do for _, u in ipairs(b.units) do in_block[u] = true end end
  local others = {}
  for _, u in ipairs(units) do
    if u ~= root and not in_block[u] then others[#others + 1] = u end
  end

  -- forward
  gather(root, 'forward')
  for _, u in ipairs(others) do gather(u, 'forward') end
  bump(stem.saved, 'forward'); keep(stem.saved)
  local last_fwd, first_fwd = {}, {}
  for i, b in ipairs(blocks) do
    for _, u in ipairs(b.units) do
      last_fwd[u] = i
      first_fwd[u] = first_fwd[u] or i
    end
  end
  for i, b in ipairs(blocks) do
    local where = 'forward of ' .. b.name
    local gap = b.prof.gap -- code before the block that is no block's (fsdp.plan.trace)
    if gap then
      bump(gap.saved, 'forward before ' .. b.name); keep(gap.saved)
      check(gap.fwd_extra, 'forward before ' .. b.name)
    end
    for _, u in ipairs(b.units) do gather(u, where) end
    if opts.forward_prefetch then for _, u in ipairs(units_of(i + 1)) do gather(u, where) end end
    local kept = opts.checkpoint and b.prof.input or b.prof.saved
    bump(kept, where); keep(kept)
    check((opts.checkpoint and b.prof.fwd_ckpt_extra or b.prof.fwd_extra) or 0, where)
    if opts.offload_activations then
      -- copied to CPU memory: gone from the device when the block's forward
      -- ends (see the top of this file)
      live, saved_now = live - kept, saved_now - kept
      pinned = pinned + kept
    end
    for _, u in ipairs(b.units) do
      if last_fwd[u] == i and u.reshard and u ~= root then free(u) end
    end
  end
  bump(head.saved, 'forward of the head (loss)'); keep(head.saved)
  check(head.fwd_extra or 0, 'forward of the head (loss)')
  local activations = saved_now

  -- backward
  local pending
  local function finish(p, where)
    -- The reduce-scatter completes (its f32 staging goes), the all-reduce
    -- across replicas runs (staging the shard in f32 meanwhile), then the
    -- reduced shard is adopted or cast.
    if p.G > 1 and opts.f32_reduce and p.rs < 4 then live = live - (p.padded + p.shard) * 4 end
    if p.replicas > 1 and opts.f32_reduce and p.rs < 4 then check(p.shard * 4, where) end
    if p.rs ~= p.gs then
      bump(p.shard * p.gs, where .. ', casting the gradient of ' .. p.label)
      live = live - p.shard * p.rs
      if p.G > 1 then live = live - p.padded * p.rs end
    elseif p.G > 1 then
      live = live - p.padded * p.rs
    end
  end
  local function post_backward(u, where, prefetch)
    if u.frozen then
      -- no gradient: freed with its partner ([Note: frozen parameters])
      if not u.aliased then free(u) end
      live = live - (vgrads[u] or 0)
      vgrads[u] = 0
      return
    end
    -- The previous step's gradient, dropped by zero_grad, goes before the
    -- new one is packed (Unit:sync_zero_grad, lua/fsdp/sharding/unit.lua).
    live = live - u.shard * u.gs
    bump(u.padded * u.rs, where .. ', packing its gradient')
    if u.G > 1 then
      bump(u.shard * u.rs, where .. ', reduce-scatter')
      -- 16-bit reductions staged in f32 (input and output) while in flight
      if opts.f32_reduce and u.rs < 4 then bump((u.padded + u.shard) * 4, where .. ', reduce-scatter') end
    end
    if pending then finish(pending, where) end
    pending = u
    if not u.aliased then free(u) end
    live = live - (vgrads[u] or 0)
    vgrads[u] = 0
    if opts.backward_prefetch == 'post' then for _, v in ipairs(prefetch) do gather(v, where) end end
  end
  run_steps(head.steps, root, 'backward of the head (loss)')
  for i = #blocks, 1, -1 do
    local b = blocks[i]
    local where = 'backward of ' .. b.name
    for _, u in ipairs(b.units) do gather(u, where) end
    if opts.backward_prefetch == 'pre' then for _, u in ipairs(units_of(i - 1)) do gather(u, where) end end
    local owner = b.units[1] or root
    if opts.offload_activations then
      -- all of the block's kept bytes back at once (an upper bound, see
      -- the top of this file); its steps free them as without offload
      bump(opts.checkpoint and b.prof.input or b.prof.saved, where .. ', copying its activations back')
    end
    if opts.checkpoint then
      -- The recompute makes the block's saved tensors again and its output
      -- (the size of its input); the checkpoint node holds the incoming
      -- gradient until its nested backward ends (the steps free it early).
      bump(b.prof.saved - b.prof.input + 2 * b.prof.input, where .. ', recomputing its forward')
    end
    run_steps(b.prof.steps, owner, where)
    if opts.checkpoint then live = live - 2 * b.prof.input end
    for _, u in ipairs(b.units) do
      if first_fwd[u] == i and u ~= root then post_backward(u, where, units_of(i - 1)) end
    end
    if b.prof.gap then run_steps(b.prof.gap.steps, root, 'backward before ' .. b.name) end
  end
  run_steps(stem.steps, root, 'backward of the stem (embeddings)')
  for i = #others, 1, -1 do post_backward(others[i], 'backward of ' .. others[i].label, {}) end
  post_backward(root, 'backward of the root unit', {})
  if pending then finish(pending, 'the end of backward') end
  return {
    peak = peak, peak_at = peak_at, gathered_peak = gathered_peak, activations = activations,
    saved_peak = saved_peak,
    -- Bytes offloaded: in pinned CPU memory at the end of forward, and
    -- copied each way once per step (a tensor several nodes save is one
    -- copy, as the profiles count it once).
    pinned = pinned,
    -- What the steps did not give back (0 when a model's steps balance).
    residual = live - (opts.persistent + opts.inputs),
  }
end

return M

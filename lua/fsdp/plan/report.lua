-- fsdp.plan.report: the printed form of a plan (tostring(plan), and what
-- the REPL shows): the setup, one row per kind of per-rank memory in GiB (MiB, KiB for small models),
-- the communication per collective, FLOPs, the predicted step time, and
-- FITS / DOES NOT FIT with the margin.
local M = {}

local GiB = 2^30

-- Memory rows in the largest unit the peak fills (GiB for real models,
-- MiB or KiB for the small ones tests train).
local function unit_for(bytes)
  if bytes >= 2^30 then return 2^30, 'GiB' end
  if bytes >= 2^20 then return 2^20, 'MiB' end
  return 2^10, 'KiB'
end

local function commas(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^(%-?),', '%1'))
end


-- 1.23e15 -> "1.23 PFLOP"
local function si(x, unit)
  local prefixes = { { 1e18, 'E' }, { 1e15, 'P' }, { 1e12, 'T' }, { 1e9, 'G' }, { 1e6, 'M' }, { 1e3, 'k' } }
  for _, p in ipairs(prefixes) do
    if math.abs(x) >= p[1] then return ('%.3g %s%s'):format(x / p[1], p[2], unit) end
  end
  return ('%.3g %s'):format(x, unit)
end

local function seconds(s)
  if s >= 1 then return ('%.3f s'):format(s) end
  if s >= 1e-3 then return ('%.3f ms'):format(s * 1e3) end
  return ('%.1f us'):format(s * 1e6)
end

local function unit_summary(p)
  return ('%d unit%s (%s)'):format(#p.units, #p.units == 1 and '' or 's', p.options.policy_name)
end

function M.format(p)
  local r, m, dev = p.options, p.memory, p.options.device
  local scale, unit = unit_for(math.max(m.peak, 1))
  local function gib(b) return ('%10.3f'):format(b / scale) end
  local L = {}
  local function line(fmt, ...) L[#L + 1] = fmt:format(...) end
  local mp = r.mp
  line('plan: %s, %s parameters%s, %s', p.model_class, commas(p.n_params),
    (p.n_frozen or 0) > 0 and (' (%s trainable, %s frozen in %s)'):format(commas(p.n_params - p.n_frozen),
      commas(p.n_frozen), p.frozen_dtype) or '', unit_summary(p))
  line('  %d x %s%s, %s, params %s, compute %s, reduce %s, %s', r.world, dev.name or 'device',
    r.nodes > 1 and (' (%d nodes of %d)'):format(r.nodes, r.ranks_per_node) or (' (1 node of %d)'):format(r.world),
    r.strategy,
    r.master, mp.param, mp.reduce, r.optimizer)
  if r.mesh then
    line('  mesh dp_replicate %d x dp_shard %d x tp %d%s%s', r.mesh.dp_replicate, r.mesh.dp_shard, r.mesh.tp,
      r.tp > 1 and ' (the model is TP rank 0\'s shards)' or '',
      r.sequence_parallel and ', sequence parallel' or '')
  end
  line('  batch %d x seq %d per rank (%s tokens)%s%s', r.batch, r.seq, commas(p.tokens),
    (r.checkpoint and ', activation checkpointing' or '') .. (r.offload_activations and ', activation offload' or ''),
    r.offload and ', CPU offload' or '')
  line('per-rank memory                                %s', unit)
  line('  %-38s%s', ('parameters (%s shards)'):format(r.master .. ((p.n_frozen or 0) > 0 and p.frozen_dtype ~= r.master
    and ', frozen ' .. p.frozen_dtype or '')), gib(m.params))
  line('  %-38s%s', ('gradients (%s shards)'):format(mp.grad), gib(m.grads))
  line('  %-38s%s', ('optimizer state (%s)'):format(r.optimizer), gib(m.optimizer))
  line('  buffers and caches                    %s', gib(m.buffers))
  if m.cpu_offloaded > 0 then line('  offloaded to CPU memory              -%s', gib(m.cpu_offloaded)) end
  line('  persistent                            %s', gib(m.persistent))
  line('  %-38s%s', ('gathered units (largest %.3f)'):format(m.largest_unit / scale), gib(m.gathered))
  line('  activations saved                     %s  (checkpointed %.3f, not %.3f)', gib(m.activations),
    m.activations_checkpointed / scale, m.activations_full / scale)
  if m.pinned_activations > 0 then
    line('  activations in pinned CPU memory      %s  (not on the device)', gib(m.pinned_activations))
  end
  if (m.accumulation or 0) > 0 then
    line('  %-38s%s  (unsharded, %d micro-batches per step)', 'gradient accumulation buffers',
      gib(m.accumulation), r.grad_accum)
  end
  line('  inputs                                %s', gib(m.inputs))
  -- with offload, a block's activations copied back are transients too
  line('  backward transients                   %s%s', gib(math.max(0, m.transient)),
    m.pinned_activations > 0 and '  (with a block\'s activations copied back)' or '')
  line('  peak                                  %s  (at %s)', gib(m.peak), m.peak_at)
  line('  device memory usable                  %s  (%s)', gib(p.usable),
    (dev.reserved or 0) > 0 and ('%.1f GiB reserved by the runtime'):format(dev.reserved / GiB) or 'nothing reserved')
  if p.fits then
    line('  FITS: %.3f %s to spare (peak is %.0f%% of the device)', p.headroom / scale, unit, 100 * m.peak / dev.memory)
  else
    line('  DOES NOT FIT: %.3f %s short (peak is %.0f%% of what is usable)', -p.headroom / scale, unit,
      100 * m.peak / p.usable)
  end
  line('communication per step per rank')
  local any = false
  for _, kind in ipairs({ 'all_gather', 'reduce_scatter', 'all_reduce' }) do
    local c = p.comm[kind]
    if c then
      any = true
      line('  %-15s %6d calls  %10.3f GiB  %10.3f GiB on the wire (%s-node)  %s', kind, c.calls,
        c.bytes / GiB, c.wire / GiB, c.link, seconds(c.seconds))
    end
  end
  if not any then line('  none (one rank per shard group and no replicas)') end
  local tc = p.tp_comm
  if tc then
    local kinds = {}
    for _, kind in ipairs({ 'all_reduce', 'all_gather', 'reduce_scatter', 'broadcast' }) do
      local c = tc.per_layer and tc.per_layer.by_kind[kind]
      if c then kinds[#kinds + 1] = ('%s %d x %.3f MiB'):format(kind, c.calls, c.bytes / c.calls / 2^20) end
    end
    line('  %-15s %6d calls  %10.3f GiB  %10.3f GiB on the wire (intra-node)  %s  (on the critical path)', 'tp',
      tc.calls, tc.bytes / GiB, tc.wire / GiB, seconds(tc.seconds))
    if tc.per_layer then
      line('    per layer (forward and backward): %d calls, %.3f MiB (%s)', tc.per_layer.calls,
        tc.per_layer.bytes / 2^20, table.concat(kinds, ', '))
    end
  end
  local t = p.time
  line('compute per step per rank: %s (%s per token)%s', si(p.flops.hardware, 'FLOP'), si(p.flops.per_token, 'FLOP'),
    p.flops.recompute > 0 and (', %s recomputed'):format(si(p.flops.recompute, 'FLOP')) or '')
  if t.memory_bound > 0 then
    line('time per step: compute %s (GEMMs and attention at %.0f%% of %s, memory-bound ops %s: %s at %.0f%% of %s/s),',
      seconds(t.compute), 100 * r.utilization, si(t.peak_flops, 'FLOP/s'), seconds(t.memory_bound),
      si(t.bytes_moved, 'B'), 100 * dev.mem_utilization, si(dev.mem_bw, 'B'))
    line('  communication %s%s, optimizer %s', seconds(t.comm),
      t.overlap and ' (overlapped)' or ' (not overlapped)', seconds(t.optimizer))
  else
    line('time per step: compute %s at %.0f%% of %s, communication %s%s, optimizer %s',
      seconds(t.compute), 100 * r.utilization, si(t.peak_flops, 'FLOP/s'), seconds(t.comm),
      t.overlap and ' (overlapped)' or ' (not overlapped)', seconds(t.optimizer))
  end
  if (t.tp_comm or 0) > 0 then line('  tensor-parallel collectives %s (added to compute)', seconds(t.tp_comm)) end
  local o = t.offload
  if o.bytes > 0 then
    line('  activation offload: %.3f %s each way at %s/s, to CPU memory %s (overlaps forward), back %s; %s exposed',
      o.bytes / scale, unit, si(dev.pinned_bw, 'B'), seconds(o.to_cpu), seconds(o.to_device), seconds(o.exposed))
    if o.backlog > 0 then
      line('  (the copies to CPU memory outlast the forward: ~%.3f %s still on the device when it ends, '
        .. 'not in the peak)', o.backlog / scale, unit)
    end
  end
  line('  -> %s per step, %s tokens/s over %d ranks, MFU %.1f%%', seconds(t.step), commas(math.floor(t.tokens_per_s)),
    r.world, 100 * t.mfu)
  return table.concat(L, '\n')
end

return M

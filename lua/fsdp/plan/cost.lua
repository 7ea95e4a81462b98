-- fsdp.plan.cost: the FLOPs, communication and predicted time of one
-- training step of a plan (fsdp.plan fills plan.flops, plan.comm and
-- plan.time with it).
--
-- Communication, per rank and step, follows the unit code: one all-gather
-- of each unit's padded flat parameter in the param dtype per gathering
-- (FULL_SHARD and HYBRID_SHARD gather a non-root unit twice, for forward
-- and again for backward; SHARD_GRAD_OP and NO_SHARD once; the root once),
-- one reduce-scatter of its packed gradient in the reduce dtype, and an
-- all-reduce of the reduced shard across replicas (NO_SHARD, hybrids).
-- A group of one rank sends nothing. A 16-bit reduction through MPI moves
-- the f32 copy the core stages (the device profile's f32_reduce). "bytes"
-- are the buffers as the backend gets them, which is what
-- fsdp.dist.collective_stats counts (tests/mpi/plan_comm.lua: equal to
-- the byte). "wire" counts what a rank sends with
-- ring algorithms: (G-1)/G of the buffer for all-gather and reduce-scatter,
-- 2(R-1)/R for all-reduce, which is what the MPI plugin's rings move
-- ([Note: ring collectives], core/comm/mpi/ring.c) and NCCL's. A group
-- inside one node runs at the device's intra-node bandwidth. A group
-- across nodes runs at its inter-node one, shared: a ring laid out node by
-- node leaves each node once, so a node carries one flow per group of
-- that kind that has members on it, all in flight at once (every rank
-- reduces its shard at the same point of backward). One group spanning
-- the nodes (FULL_SHARD's world) is one flow; HYBRID_SHARD's replica
-- groups, one rank per node each, are ranks_per_node flows. Each flow gets
-- inter_bw or its share of the node's link (node_inter_bw / flows), the
-- smaller: a NIC per GPU (DGX) is not shared, a CPU node's one link is.
--
-- Time: compute = hardware FLOPs / (peak FLOP/s of the compute dtype x
-- utilization); on a device whose profile has mem_utilization, plus the
-- bytes the memory-bound ops move (the trace counts them: [Note: bytes
-- moved]; a checkpointed block's forward moves its bytes again, in the
-- proportion of its FLOPs) / (mem_bw x mem_utilization), utilization then
-- being the GEMMs' and attention's alone; communication = wire bytes / bandwidth; the optimizer
-- reads and writes the shards, gradients and state once at memory
-- bandwidth. With prefetching, communication overlaps compute (FSDP's
-- point): the step takes the longer of the two plus the optimizer;
-- without, their sum.
--
-- Activation offload moves plan.memory.pinned_activations bytes each way per
-- step at the device's pinned_bw. The copies to CPU memory run on a copy
-- stream beside the forward: only what exceeds the forward's compute time
-- (a third of the model's FLOPs, the 6N rule's 2N; a recompute belongs to
-- backward) is exposed. This treats the forward as one span the copies
-- can spread over, while the last block's copy can really only hide
-- behind the head. The copies back are queued on the compute stream
-- before each node's backward and serialise with its kernels (no prefetch
-- yet, core/autograd/offload.c): all exposed. Exposed copy time lengthens
-- compute, which collectives on their own streams still overlap. When
-- the copies to CPU memory outlast the forward, the replay's memory is
-- optimistic (it drops each block's bytes when its forward ends):
-- `backlog` is about what is then still waiting on the device at the end
-- of forward, pinned_bw x the excess.
local M = {}

local function add(comm, kind, calls, bytes, wire, link, bw)
  local c = comm[kind]
  if not c then
    c = { calls = 0, bytes = 0, wire = 0, seconds = 0, link = link }
    comm[kind] = c
  end
  c.calls, c.bytes, c.wire = c.calls + calls, c.bytes + bytes, c.wire + wire
  c.seconds = c.seconds + wire / bw
  if link == 'inter' then c.link = 'inter' end
end

-- The bandwidth one rank's ring gets: `link` 'intra' or 'inter'; `flows`
-- the rings of a node that cross to other nodes at once (see the top).
local function ring_bw(dev, r, link, flows)
  if link == 'intra' then return dev.intra_bw end
  local node = dev.node_inter_bw or dev.inter_bw * r.ranks_per_node
  return math.min(dev.inter_bw, node / flows)
end

function M.fill(plan, flops)
  local r, dev = plan.options, plan.options.device
  -- FLOPs of this rank's step, as the traced ops count them (frozen
  -- weights get no gradient, so theirs are not counted); a checkpointed
  -- block's forward runs again in backward.
  local model_flops = flops.total
  local hardware = model_flops + (r.checkpoint and flops.blocks_forward or 0)
  plan.flops = { model = model_flops, hardware = hardware, recompute = hardware - model_flops,
                 per_token = model_flops / math.max(plan.tokens, 1) }
  local fwd = flops.forward or 0
  local bytes = (flops.bytes or 0) + ((r.checkpoint and fwd > 0)
    and (flops.bytes_forward or 0) * flops.blocks_forward / fwd or 0)

  -- communication
  local comm = {}
  local spans_nodes = function(G) return G > r.ranks_per_node end
  -- A reduction in bf16/f16 through a backend without 16-bit sums (the
  -- profile's f32_reduce: MPI) moves the f32 copy the core stages.
  local function reduced_size(u) return dev.f32_reduce and u.rs < 4 and 4 or u.rs end
  for _, u in ipairs(plan.units) do
    local link = spans_nodes(u.G) and 'inter' or 'intra'
    if u.G > 1 then
      -- shard groups are runs of consecutive ranks: one spanning nodes
      -- holds all of each node's ranks, so a node carries one of them
      local bw = ring_bw(dev, r, link, 1)
      local gathers = (u.reshard and not u.root) and 2 or 1
      local buf = u.padded * u.ps
      add(comm, 'all_gather', gathers, gathers * buf, gathers * buf * (u.G - 1) / u.G, link, bw)
      if not u.frozen then -- (frozen units have no gradient to reduce)
        local rbuf = u.padded * reduced_size(u)
        add(comm, 'reduce_scatter', 1, rbuf, rbuf * (u.G - 1) / u.G, link, bw)
      end
    end
    if u.replicas > 1 and not u.frozen then
      local R = u.replicas
      local rlink = (r.nodes > 1) and 'inter' or 'intra'
      -- replica groups take every G-th rank: a node holds
      -- ranks_per_node / G members of each (at least one), so
      -- ranks_per_node / that many of them cross its link at once
      local flows = r.ranks_per_node / math.max(1, math.floor(r.ranks_per_node / u.G))
      local buf = u.shard * reduced_size(u)
      add(comm, 'all_reduce', 1, buf, buf * 2 * (R - 1) / R, rlink, ring_bw(dev, r, rlink, flows))
    end
  end
  local comm_s = 0
  for _, c in pairs(comm) do comm_s = comm_s + c.seconds end
  plan.comm = comm

  -- time
  local peak_flops = dev.flops[r.mp.param] or dev.flops.f32
  local mem_util = dev.mem_utilization
  local memory_s = mem_util and bytes / (dev.mem_bw * mem_util) or 0
  local compute_s = hardware / (peak_flops * r.utilization) + memory_s
  local m = plan.memory
  local opt_s = (2 * ((m.params_trainable or m.params) + m.optimizer) + m.grads) / (dev.mem_bw * (mem_util or 1))
  local overlap = r.backward_prefetch ~= false or r.forward_prefetch
  local moved = m.pinned_activations or 0
  local offload = { bytes = moved, to_cpu = 0, to_device = 0, exposed = 0, backlog = 0 }
  if moved > 0 then
    offload.to_cpu, offload.to_device = moved / dev.pinned_bw, moved / dev.pinned_bw
    local forward_s = model_flops / 3 / (peak_flops * r.utilization)
    local late = math.max(0, offload.to_cpu - forward_s)
    offload.exposed = late + offload.to_device
    offload.backlog = late * dev.pinned_bw
  end
  local busy_s = compute_s + offload.exposed
  local step_s = (overlap and math.max(busy_s, comm_s) or busy_s + comm_s) + opt_s
  plan.time = {
    compute = compute_s, comm = comm_s, optimizer = opt_s, step = step_s, overlap = overlap,
    memory_bound = memory_s, bytes_moved = bytes,
    exposed_comm = overlap and math.max(0, comm_s - busy_s) or comm_s,
    offload = offload,
    tokens_per_s = plan.tokens * r.world / step_s,
    mfu = model_flops / step_s / peak_flops,
    peak_flops = peak_flops,
  }
end

return M

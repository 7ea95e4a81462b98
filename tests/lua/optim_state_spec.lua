-- optim_state_spec.lua: per-parameter optimizer scalars (AdamW's step)
-- are exact whatever the shard layout: a checkpoint takes them only from
-- the ranks that hold elements of the parameter and refuses ranks that
-- disagree (fsdp.checkpointing.optim_state), and the optimizer fuses a
-- unit's parameters into one update only when their steps agree. The
-- multi-rank side (empty segments, resumes of resumed runs) is
-- tests/mpi/ckpt_reshard.lua and tests/chaos/chaos.sh.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local optim_state = require 'fsdp.checkpointing.optim_state'

local CFG = { dim = 32, n_layers = 1, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
local tg = fsdp.randint(0, 64, { 2, 16 }, { seed = 2 })

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(err)
end

describe('checkpointed optimizer scalars', function()
  it('come from the ranks that hold elements of the parameter', function()
    local held = fsdp.zeros({ 4 })
    local opt = { state = {
      a = { step = 7, exp_avg = held }, -- held here
      b = { step = 3, exp_avg = fsdp.zeros({ 0 }) }, -- a stale copy: its segment is empty here
    } }
    local part = { params = { { name = 'a', len = 4 }, { name = 'b', len = 0 }, { name = 'c', len = 2 } } }
    local keys, scalars = optim_state.of_part(opt, part)
    assert.same({ exp_avg = 'f32' }, keys)
    assert.same({ step = 7 }, scalars.a)
    assert.is_nil(scalars.b)
    assert.is_false(scalars.c) -- held, no state yet
  end)

  it('merge the holders\' reports, which must agree', function()
    local merged = optim_state.merge({
      [0] = { a = { step = 5 }, c = false },
      [1] = { a = { step = 5 }, b = { step = 5 }, c = false },
    }, 2)
    assert.same({ a = { step = 5 }, b = { step = 5 } }, merged)
    local err = error_of(optim_state.merge, { [0] = { a = { step = 6 } }, [1] = { a = { step = 4 } } }, 2,
      'ckpt/step-000006')
    assert.truthy(err:find('checkpointing.save ckpt/step-000006: the optimizer state of parameter a is {step = 6} '
      .. 'on rank 0 and {step = 4} on rank 1', 1, true), err)
    err = error_of(optim_state.merge, { [0] = { a = false }, [1] = {}, [2] = { a = { step = 1 } } }, 3)
    assert.truthy(err:find('parameter a is no state on rank 0 and {step = 1} on rank 2', 1, true), err)
  end)
end)

describe('fused updates of a sharded unit', function()
  -- A one-unit model (every parameter a segment of one flat shard), or the
  -- same model unsharded (each parameter updated on its own), with AdamW
  -- state of step 2 everywhere except q_proj at step `q_step`.
  local function setup(sharded, q_step)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    if sharded then
      fsdp.shard(m, { policy = fsdp.policy.none, seed = 4 })
    else
      m:init_weights({ seed = 4, device = 'cpu' })
    end
    local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, betas = { 0.9, 0.999 } })
    local state = {}
    for _, np in ipairs(m:named_parameters()) do
      local n = np[2]:numel()
      state[np[1]] = { step = np[1]:find('q_proj') and q_step or 2,
                       exp_avg = fsdp.full({ n }, 1e-3), exp_avg_sq = fsdp.full({ n }, 1e-6) }
      if not sharded then
        state[np[1]].exp_avg = state[np[1]].exp_avg:view(np[2].shape)
        state[np[1]].exp_avg_sq = state[np[1]].exp_avg_sq:view(np[2].shape)
      end
    end
    opt:load_state_dict({ state = state, param_groups = opt:state_dict().param_groups })
    local loss = m:loss(ids, tg)
    loss:backward()
    opt:step()
    return m, opt
  end

  it('keep each parameter\'s own step when the steps differ, bit for bit as unfused updates', function()
    local m, opt = setup(true, 9)
    local plain = setup(false, 9)
    assert.equals(10, opt.state['model.layers.0.self_attn.q_proj.weight'].step)
    assert.equals(3, opt.state['model.layers.0.self_attn.k_proj.weight'].step)
    assert.equals(3, opt.state['lm_head.weight'].step)
    local got = fsdp.full_state_dict(m)
    for _, np in ipairs(plain:named_parameters()) do
      assert.equals(0, (got[np[1]] - np[2]):abs():max():item(), np[1])
    end
  end)

  it('fuse the unit\'s parameters into one update when the steps agree', function()
    local _, opt = setup(true, 2)
    assert.equals(1, #opt.runs[1])
    assert.equals(3, opt.state['model.layers.0.self_attn.q_proj.weight'].step)
    local _, split = setup(true, 9)
    assert.is_nil(split.runs[1][1].state) -- updated name by name
  end)
end)

-- hf_rope_spec.lua: models/hf_rope.lua (the RoPE keys of a config.json in
-- transformers' 4.x and 5.x layouts) and the tables F.rope_tables builds
-- from them, against transformers' own (tests/golden/rope_tables.json,
-- made by tests/golden/make_rope_goldens.py with transformers 5: one
-- config per rope type, dynamic and longrope at a length within and past
-- their limit). Tables in f32, max |ours - theirs| / max |theirs| <= 1e-6.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'
local hf_rope = require 'models.hf_rope'

local golden = json.decode(assert(files.read(host.root .. '/tests/golden/rope_tables.json')))

local function fail(where, fmt, ...) error(('%s: ' .. fmt):format(where, ...), 0) end

local function copy(t)
  if type(t) ~= 'table' then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = copy(v) end
  return c
end

-- A config.json of the case's RoPE keys in one layout.
local function config(keys)
  local h = copy(keys)
  h.max_position_embeddings = golden.max_position_embeddings
  return h
end

-- max |a - b| / max |b| over the first half of each row (and the second
-- half equal to the first: emb = cat(freqs, freqs)).
local function rel_error(t, want, width)
  local rows = t:float():tolist()
  local err, big = 0, 0
  for r, row in ipairs(rows) do
    assert.equals(width, #row / 2 * 2 == #row and #row / 2 or -1)
    for i = 1, width do
      local w = want[(r - 1) * width + i]
      assert.equals(row[i], row[width + i])
      err, big = math.max(err, math.abs(row[i] - w)), math.max(big, math.abs(w))
    end
  end
  return err / big
end

describe('RoPE tables of every rope type against transformers', function()
  for _, case in ipairs(golden.cases) do
    for _, layout in ipairs({ 'v5', 'v4' }) do
      it(case.name .. ' (' .. layout .. ' layout)', function()
        local h = layout == 'v5' and config({ rope_parameters = case.rope_parameters }) or config(case.v4)
        local theta, scaling = hf_rope.from_hf('config.json', h, fail)
        for _, t in ipairs(case.tables) do
          local cos, sin = F.rope_tables(t.seq_len, golden.head_dim, { theta = theta, scaling = scaling,
            max_position_embeddings = golden.max_position_embeddings, dtype = 'f32', device = 'cpu' })
          assert.same({ t.seq_len, 2 * t.width }, cos.shape)
          local ec, es = rel_error(cos, t.cos, t.width), rel_error(sin, t.sin, t.width)
          assert.is_true(ec <= 1e-6 and es <= 1e-6,
            ('%s T=%d: relative error cos %.3g sin %.3g'):format(case.name, t.seq_len, ec, es))
          if os.getenv('FSDP_SHOW_ERRORS') then
            print(('# %s %s T=%d: cos %.3g sin %.3g'):format(case.name, layout, t.seq_len, ec, es))
          end
        end
      end)
    end
  end

  it('reads the same settings from both layouts and writes both back (to_hf, then from_hf)', function()
    for _, case in ipairs(golden.cases) do
      local theta5, s5 = hf_rope.from_hf('a', config({ rope_parameters = case.rope_parameters }), fail)
      local theta4, s4 = hf_rope.from_hf('b', config(case.v4), fail)
      assert.equals(theta5, theta4)
      assert.same(s5, s4)
      local written = json.decode(json.encode(hf_rope.to_hf(theta5, s5)))
      local theta, s = hf_rope.from_hf('c', config(written), fail)
      assert.equals(theta5, theta)
      assert.same(s5, s)
      -- each layout alone reads back the same
      for _, drop in ipairs({ 'rope_parameters', 'rope_scaling' }) do
        local one = copy(written)
        one[drop] = nil
        if drop == 'rope_parameters' and one.rope_scaling == json.null then one.rope_scaling = nil end
        local th, sc = hf_rope.from_hf('d', config(one), fail)
        assert.equals(theta5, th)
        assert.same(s5, sc, case.name .. ' without ' .. drop)
      end
    end
  end)

  it('refuses unknown types and keys, missing keys, bad values and disagreeing duplicates in one line', function()
    local function err(h)
      local ok, e = pcall(hf_rope.from_hf, 'X/config.json', config(h), fail)
      assert.is_false(ok, 'accepted')
      assert.is_nil(tostring(e):find('\n'), e)
      return tostring(e)
    end
    local yarn = { rope_type = 'yarn', rope_theta = 1e4, factor = 4, original_max_position_embeddings = 8 }
    local function with(base, k, v)
      local t = copy(base)
      t[k] = v
      return { rope_parameters = t }
    end
    assert.matches("unknown key 'rope_parameters.low_freq_factor' for rope_type 'yarn'",
      err(with(yarn, 'low_freq_factor', 1)), 1, true)
    assert.matches('rope_parameters.rope_type "ntk" is not supported', err(with(yarn, 'rope_type', 'ntk')), 1, true)
    assert.matches("rope_parameters.factor is missing (rope_type 'yarn' needs it)", err(with(yarn, 'factor', nil)),
      1, true)
    assert.matches("rope_scaling.factor is missing (rope_type 'linear' needs it)",
      err({ rope_scaling = { type = 'linear' } }), 1, true)
    assert.matches('rope_parameters.truncate must be true or false', err(with(yarn, 'truncate', 0)), 1, true)
    assert.matches('rope_parameters.factor must be > 0, got -2', err(with(yarn, 'factor', -2)), 1, true)
    local lr = { rope_type = 'longrope', short_factor = { 1, 1 }, long_factor = { 2, 2, 2 },
                 original_max_position_embeddings = 16 }
    assert.matches('short_factor (2 entries) and long_factor (3) differ', err({ rope_parameters = lr }), 1, true)
    lr.long_factor = { 2, 0 / 0 }
    assert.matches('rope_parameters.long_factor entry 2 must be a finite number, got nan',
      err({ rope_parameters = lr }), 1, true)
    assert.matches('rope_scaling.factor (2) and rope_parameters.factor (4) disagree',
      err({ rope_parameters = yarn,
            rope_scaling = { rope_type = 'yarn', factor = 2, original_max_position_embeddings = 8 } }), 1, true)
    assert.matches('rope_scaling.rope_type ("linear") and rope_parameters.rope_type ("yarn") disagree',
      err({ rope_parameters = yarn, rope_scaling = { type = 'linear', factor = 4 } }), 1, true)
    assert.matches('partial_rotary_factor (0.5) and rope_parameters.partial_rotary_factor (0.25) disagree',
      err({ partial_rotary_factor = 0.5, rope_parameters = { rope_type = 'default', partial_rotary_factor = 0.25 } }),
      1, true)
    assert.matches('rope_scaling.rope_type ("yarn") and rope_scaling.type ("linear") disagree',
      err({ rope_scaling = { type = 'linear', rope_type = 'yarn', factor = 2 } }), 1, true)
  end)

  it('takes original_max_position_embeddings from the top level (Phi-3), else max_position_embeddings', function()
    local lr = { type = 'longrope', short_factor = { 1, 1 }, long_factor = { 2, 2 } }
    local _, s = hf_rope.from_hf('x', config({ rope_scaling = lr, original_max_position_embeddings = 4 }), fail)
    assert.equals(4, s.original_max_position_embeddings)
    _, s = hf_rope.from_hf('x', config({ rope_scaling = lr }), fail)
    assert.equals(golden.max_position_embeddings, s.original_max_position_embeddings)
    -- the default type with the whole head rotated is no scaling at all
    local theta, none = hf_rope.from_hf('x', config({ rope_parameters = { rope_type = 'default', rope_theta = 3 } }),
      fail)
    assert.equals(3, theta)
    assert.is_nil(none)
  end)

  it('builds tables on meta and refuses bad options in C with one line', function()
    local yarn = { rope_type = 'yarn', factor = 4, original_max_position_embeddings = 8 }
    local cos = F.rope_tables(8, 16, { scaling = yarn, device = 'meta' })
    assert.same({ 8, 16 }, cos.shape)
    assert.error_matches(function()
      F.rope_tables(8, 16, { scaling = { rope_type = 'longrope', short_factor = { 1 }, long_factor = { 1 },
                                         original_max_position_embeddings = 8 }, max_position_embeddings = 32 })
    end, 'longrope scaling needs short_factor and long_factor of head_dim / 2 = 8 entries each, got 1')
    assert.error_matches(function()
      F.rope_tables(8, 16, { scaling = { rope_type = 'dynamic', factor = 2 } })
    end, 'dynamic scaling needs factor %(2%) and max_position_embeddings %(0%) > 0')
    assert.error_matches(function() F.rope_tables(8, 16, { scaling = { rope_type = 'ntk' } }) end,
      'scaling type must be one of')
  end)
end)

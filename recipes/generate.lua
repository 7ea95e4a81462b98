-- recipes/generate.lua: text from a trained Llama or GPT-2, tokens printed
-- as they come (fsdp.generate: KV cache, greedy or sampled).
--
--   fsdp-lua recipes/generate.lua --init_from=HF_DIR --prompt='Once upon a time'
--   fsdp-lua recipes/generate.lua --init_from=ckpt --model=tiny --tokenizer=byte --prompt_file=prompts.txt
--   fsdp-lua recipes/generate.lua --init_from=model.safetensors --num_heads=4 --prompt_ids='1,5,9;7,3'
--
-- --init_from is what it is in the training recipes (models/pretrained.lua):
--   * a Hugging Face directory (config.json + safetensors; models/hf.lua);
--   * a sharded training checkpoint of ours (a directory of step-NNNNNN/
--     saves, its newest complete one is read, or one step directory); every
--     parameter is read from the saved ranks' slices straight into the
--     model (fsdp.checkpointing.load), no rank file is loaded whole; the
--     checkpoint records its model's config;
--   * a full state dict file (.safetensors, HF names: --save_full_state_dict).
-- A state dict (or a checkpoint from before checkpoints recorded their
-- config) gives only the shapes (width, layers, vocabulary, MLP width, KV
-- width); what it cannot tell (the number of heads, RoPE settings, norm
-- eps) comes from --model's config and --num_heads/--num_kv_heads.
--
-- Tokenizers (fsdp.data.tokenizer): the HF directory's own (its
-- tokenizer.model: Llama 2's SentencePiece; else its tokenizer.json:
-- GPT-2's and Llama 3's byte-level BPE), or --tokenizer=FILE|DIR, or 'byte'
-- (the recipes' byte-level tokenizer). Prompts get the special tokens
-- transformers' tokenizers add (Llama 2's <s>, Llama 3's <|begin_of_text|>);
-- special tokens are not shown in the output.
-- Without a tokenizer, give token ids with --prompt_ids ('1,5,9' one prompt;
-- ';' between prompts) and the output is ids.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local validate = require 'fsdp.validate'
local generate = require 'fsdp.generate'
local files = require 'fsdp.io.files'
local tokenizer = require 'fsdp.data.tokenizer'
local clock = require 'fsdp.clock'
local decoders = require 'models.decoders'
local pretrained = require 'models.pretrained'

-- A list of integers from '1,5,9' (nil and what is wrong otherwise).
local function int_list(text)
  local out = {}
  for item in (text .. ','):gmatch('([^,]*),') do
    local s = item:match('^%s*(.-)%s*$')
    local n = tonumber(s)
    -- (fsdp.validate: '1e999' reads as infinity, an integer to math.floor)
    if validate.problem(n, validate.INDEX) then return nil, ('%q is not a token id'):format(s) end
    out[#out + 1] = n
  end
  return out
end

-- Whether `path` is a Hugging Face directory (a config.json in it); a
-- config.json that is a FIFO or a device is refused naming it.
local function hf_dir(path)
  if path == '' or files.mode(path) ~= 'directory' then return false end
  local ok, is = pcall(files.is_file, files.join(path, 'config.json'))
  if not ok then error('--init_from: ' .. is, 0) end
  return is
end
-- What the weights are (models/pretrained.lua's source, nil for random
-- weights of --model), their family and config: read from headers and
-- JSON in the option checks, so a bad config.json is a usage error before
-- anything is built.
local src, family, config, config_name

local cfg = options.config({
  init_from = { '', 'the weights: a Hugging Face directory, a sharded checkpoint directory, or a full state dict '
                    .. '.safetensors file (empty: random weights of --model, to try the options)', input = true },
  model = { '', 'model config name for what the weights do not tell (heads, RoPE); empty: the checkpoint\'s, '
                .. 'or the HF config', one_of = function() return { '', unpack(decoders.names()) } end },
  num_heads = { 0, 'attention heads (0: --model\'s)', int = true, min = 0 },
  num_kv_heads = { 0, 'key/value heads of grouped-query attention (0: from the weights)', int = true, min = 0 },
  prompt = { '', 'the prompt text (needs a tokenizer)' },
  prompt_file = { '', 'a file of prompts, one per line, generated as one left-padded batch (-: standard input; '
                      .. 'at most 16 MiB)', input = 'file', stdin = true },
  prompt_ids = { '', "prompts as token ids: '1,5,9', several separated by ';' (no tokenizer needed)" },
  tokenizer = { '', "'byte', a SentencePiece .model, a tokenizer.json, an HF directory holding one, or "
                    .. "empty: the HF directory's (tokenizer.model, else tokenizer.json)" },
  max_new_tokens = { 64, 'tokens to generate per prompt at most', int = true, min = 1 },
  do_sample = { false, 'sample (temperature, top_k, top_p) instead of greedy decoding' },
  temperature = { 1.0, 'sampling temperature', positive = true },
  top_k = { 0, 'sample from the k most likely tokens only (0: all)', int = true, min = 0 },
  top_p = { 1.0, 'sample from the smallest set of tokens holding this probability (1: all)', positive = true,
            max = 1 },
  repetition_penalty = { 1.0, 'divide the logits of tokens already seen by this (HF\'s; 1: off)', positive = true },
  stop_ids = { '', "ids that end a row, '2,13' (empty: the tokenizer's and the HF config's eos; 'none': no stop)" },
  seed = { 0, 'sampling seed (the same seed gives the same text)', int = true, min = 0 },
  dtype = { 'f32', 'weights and cache dtype', one_of = { 'f32', 'bf16' } },
  allow_past_max_positions = decoders.OPTIONS.allow_past_max_positions,
  device = require('fsdp.sharding.device').OPTIONS.device,
  no_cache = { false, 'recompute the whole prefix at every step (no KV cache; for comparison)' },
  print_ids = { false, 'also print the generated ids of each prompt' },
}, arg, 'recipes/generate.lua', function(cfg)
  local given = (cfg.prompt ~= '' and 1 or 0) + (cfg.prompt_file ~= '' and 1 or 0) + (cfg.prompt_ids ~= '' and 1 or 0)
  if given ~= 1 then error('give exactly one of --prompt, --prompt_file, --prompt_ids', 0) end
  if cfg.prompt_ids ~= '' then
    for p in (cfg.prompt_ids .. ';'):gmatch('([^;]*);') do
      local ids, why = int_list(p)
      if not ids then error('--prompt_ids: ' .. why, 0) end
    end
  end
  if cfg.stop_ids ~= '' and cfg.stop_ids ~= 'none' then
    local ids, why = int_list(cfg.stop_ids)
    if not ids then error('--stop_ids: ' .. why, 0) end
  end
  if cfg.tokenizer ~= '' and cfg.tokenizer ~= 'byte' and files.mode(cfg.tokenizer) ~= 'directory' then
    local ok, is = pcall(files.is_file, cfg.tokenizer)
    if not ok then error('--tokenizer: ' .. is, 0) end
    if not is then
      error(('--tokenizer %s: no such file (\'byte\', a SentencePiece .model, a tokenizer.json or an HF '
        .. 'directory)'):format(cfg.tokenizer), 0)
    end
  end
  if cfg.init_from == '' and cfg.model == '' then error('--init_from or --model (random weights) is needed', 0) end
  local hf = hf_dir(cfg.init_from)
  if hf and (cfg.model ~= '' or cfg.num_heads > 0 or cfg.num_kv_heads > 0) then
    error(('--model, --num_heads and --num_kv_heads are for checkpoints and state dicts: %s/config.json '
      .. 'gives the shapes'):format(cfg.init_from), 0)
  end
  if cfg.prompt_ids == '' and cfg.tokenizer == '' and not (hf and tokenizer.find_in(cfg.init_from)) then
    error(('--prompt and --prompt_file need a tokenizer: --tokenizer=byte, a SentencePiece .model or a '
      .. 'tokenizer.json%s; or give token ids with --prompt_ids'):format(hf
        and (' (%s has neither tokenizer.model nor tokenizer.json)'):format(cfg.init_from) or ''), 0)
  end
  if cfg.init_from == '' then
    family, config_name = decoders.resolve(cfg.model)
    local o = {}
    if cfg.num_heads > 0 then o.n_heads = cfg.num_heads end
    if cfg.num_kv_heads > 0 then o.n_kv_heads = cfg.num_kv_heads end
    local ok, c = pcall(decoders.families[family].module.config, config_name, o)
    if not ok then error(options.explain(c, { n_heads = 'num_heads', n_kv_heads = 'num_kv_heads' }), 0) end
    config = c
  else
    local ok, s = pcall(pretrained.open, cfg.init_from, { families = decoders.ORDER, who = 'generation',
      model = cfg.model, num_heads = cfg.num_heads, num_kv_heads = cfg.num_kv_heads })
    if not ok then error('--init_from ' .. options.bare(s), 0) end
    src, family, config = s, s.family, s.config
  end
end)

-- The most a --prompt_file may hold: a batch of prompts, not a corpus.
local PROMPT_FILE_LIMIT = 16 * 2^20

local function die(msg)
  io.stderr:write('fsdp-lua: ', msg, '\n')
  os.exit(1, true) -- (the state closed: what Lua holds is freed, as a sanitizer checks)
end

-- The tokenizer first: a file it cannot read is refused before the model
-- loads (--init_from means what it means in the training recipes:
-- models/pretrained.lua, opened in the option checks above).
-- With --prompt_ids the HF directory's tokenizer only turns the output into
-- text: one this build cannot read leaves the output as ids.
local tok
do
  local spec = cfg.tokenizer
  if spec == '' and hf_dir(cfg.init_from)
    and tokenizer.find_in(cfg.init_from) then
    spec = cfg.init_from
  end
  if spec ~= '' then
    local ok, t = pcall(tokenizer.load, spec)
    if ok then
      tok = t
    elseif cfg.prompt_ids ~= '' and cfg.tokenizer == '' then
      io.stderr:write(('fsdp-lua: warning: %s (the output stays ids)\n'):format(options.bare(t)))
    else
      die(options.bare(t))
    end
  end
end

-- tokenizer and prompts ----------------------------------------------------------------------

local prompts, texts = {}, {}
if cfg.prompt_ids ~= '' then
  for p in (cfg.prompt_ids .. ';'):gmatch('([^;]*);') do prompts[#prompts + 1] = int_list(p) end
else
  if cfg.prompt ~= '' then
    texts = { cfg.prompt }
  else
    -- Read whole and bounded: a regular file (checked with the options),
    -- or standard input when asked for with '-'.
    local text, why
    if cfg.prompt_file == '-' then
      text = io.stdin:read(PROMPT_FILE_LIMIT + 1) or ''
      if #text > PROMPT_FILE_LIMIT then
        why = ('standard input holds more than %d MiB, the limit for a prompt file'):format(PROMPT_FILE_LIMIT / 2^20)
      end
    else
      text, why = files.read(cfg.prompt_file, PROMPT_FILE_LIMIT, 'a prompt file')
    end
    if why then die('--prompt_file: ' .. why) end
    for line in text:gmatch('[^\n]+') do if line:find('%S') then texts[#texts + 1] = line end end
    if #texts == 0 then die(('--prompt_file %s holds no prompt (one per non-empty line)'):format(cfg.prompt_file)) end
  end
  for i, t in ipairs(tok:encode(texts, { add_special = true })) do
    if t:numel() == 0 then die(('prompt %d encodes to no tokens'):format(i)) end
    prompts[i] = t:tolist()
  end
end
local vocab = config.vocab_size
local longest = 0
for i, p in ipairs(prompts) do
  longest = math.max(longest, #p)
  for _, id in ipairs(p) do
    if id >= vocab then die(('prompt %d: token id %d is outside the model\'s vocabulary (%d)'):format(i, id, vocab)) end
  end
end

-- Before anything is built: the weights and the KV cache within this
-- machine ([Note: sizes are bounded before building] in fsdp.sharding.fit),
-- the prompt and the new tokens within the model's positions ([Note:
-- positions past the model's limit] in models/decoders.lua).
local dev = require('fsdp.sharding.device').resolve(cfg)
local place = { device = dev, dtype = cfg.dtype }
do
  local source = cfg.prompt_ids ~= '' and '--prompt_ids' or cfg.prompt ~= '' and '--prompt' or '--prompt_file'
  local extra = {}
  if not cfg.no_cache then
    -- (a sliding layer's cache holds its window only: [Note: the KV cache];
    -- the windows are listed per layer, so an absurd layer count, which
    -- the bound refuses anyway, is planned as all global)
    local mod = decoders.families[family].module
    local spec = { n_layers = config.n_layers, n_kv_heads = config.n_kv_heads or config.n_heads,
                   head_dim = config.head_dim }
    if mod.kv_cache_spec and config.n_layers <= 1e5 then spec = mod.kv_cache_spec(config) end
    local positions = longest + cfg.max_new_tokens
    local bytes = generate.cache_bytes(spec, #prompts, positions, cfg.dtype)
    local fewer = 0
    if spec.windows then
      for _, p in ipairs(generate.cache_positions(spec, positions)) do
        if p < positions then fewer = fewer + 1 end
      end
    end
    extra[1] = { bytes, ('KV cache (%d prompt%s x %d positions%s)'):format(#prompts, #prompts == 1 and '' or 's',
      positions, fewer > 0 and (', %d sliding layer%s bounded by the window'):format(fewer, fewer == 1 and '' or 's')
      or '') }
  end
  local ok, err = pcall(pretrained.bound, cfg, family, config, src, {
    model = cfg.model ~= '' and cfg.model or nil, options = { n_heads = 'num_heads', n_kv_heads = 'num_kv_heads' },
    dtype = cfg.dtype, extra = extra,
    fix = 'a smaller --max_new_tokens, fewer prompts' .. (cfg.dtype == 'f32' and ' or --dtype=bf16' or '') })
  if not ok then options.usage_error(err) end
  local too_long = decoders.positions_problem(family, config, longest + cfg.max_new_tokens,
    ('the longest prompt (%d tokens, %s) plus --max_new_tokens (%d)'):format(longest, source, cfg.max_new_tokens),
    src, cfg.model, cfg.allow_past_max_positions)
  if too_long then options.usage_error(too_long) end
end

-- loading ----------------------------------------------------------------------------------

local model
local t0 = clock.now()
if cfg.init_from == '' then
  local ok, m = pcall(decoders.families[family].module.build, config, place)
  if not ok then die(options.bare(m)) end
  model = m
  model:init_weights({ seed = cfg.seed })
  print(('model: %s %s with random weights (seed %d)'):format(family, cfg.model, cfg.seed))
else
  model = pretrained.build(src, place)
  -- (the values are checked finite as they load: pretrained.load)
  local ok2, err = pcall(pretrained.load, model, src)
  if not ok2 then die(options.bare(err)) end
  -- A LoRA run's checkpoint: its adapters folded into the base once, so
  -- decoding runs plain Linears.
  if require('fsdp.lora').config_of(model) then require('fsdp.lora').merge(model) end
end
model:eval()
if cfg.init_from ~= '' then
  print(('model: %s from %s (%s, %d parameters) in %.2f s'):format(family, src.step_dir or cfg.init_from, cfg.dtype,
    model:num_parameters(), clock.now() - t0))
end

local stop = {}
if cfg.stop_ids ~= 'none' then
  if cfg.stop_ids ~= '' then
    stop = int_list(cfg.stop_ids)
  else
    if tok and tok.eos_id and tok.eos_id < vocab then stop[#stop + 1] = tok.eos_id end
    -- the HF directory's (generation_config.json, config.json), or what a
    -- checkpoint recorded of the directory its run started from
    local eos = src and src.token_ids and src.token_ids.eos_token_id
    if type(eos) == 'number' then stop[#stop + 1] = eos end
    if type(eos) == 'table' then for _, e in ipairs(eos) do stop[#stop + 1] = e end end
  end
end

-- generation ---------------------------------------------------------------------------------

local function decode(ids)
  if not tok then return table.concat(ids, ' ') end
  if #ids == 0 then return '' end
  return tok:decode(fsdp.tensor(ids, { dtype = 'i64' }), { skip_special = true })
end

-- The text a continuation adds to its prompt: decode(prompt .. new) past
-- decode(prompt). Never the new ids decoded alone: SentencePiece drops the
-- space of a piece that starts a text ("Once upon" + "a time"). A last id
-- that is the tokenizer's eos is not shown.
local prompt_text = {}
local function continuation(b, new)
  local all = {}
  for _, id in ipairs(prompts[b]) do all[#all + 1] = id end
  for i, id in ipairs(new) do
    if not (i == #new and id == tok.eos_id) then all[#all + 1] = id end
  end
  prompt_text[b] = prompt_text[b] or decode(prompts[b])
  local base, text = prompt_text[b], decode(all)
  if text:sub(1, #base) == base then return text:sub(#base + 1) end
  return ' ' .. decode(new)
end

-- One prompt streams its text as it comes: each step the continuation is
-- decoded whole and what is new written, so a character of several bytes
-- or pieces appears once complete. A batch prints each row at the end.
local streamed, shown = {}, ''
local function on_token(_, tokens, done)
  if #prompts ~= 1 or streamed.stopped then return end
  streamed[#streamed + 1] = tokens[1]
  if done[1] then streamed.stopped = true end
  if not tok then
    io.stdout:write(' ', tokens[1])
    io.stdout:flush()
    return
  end
  -- A character cut by the last token decodes to U+FFFD for now: wait for
  -- the rest of it.
  local text = continuation(1, streamed)
  while text:sub(-3) == '\239\191\189' do text = text:sub(1, -4) end
  if text:sub(1, #shown) == shown then
    io.stdout:write(text:sub(#shown + 1))
    io.stdout:flush()
    shown = text
  end
end

if #prompts == 1 then
  io.stdout:write(tok and texts[1] or table.concat(prompts[1], ' ') .. ' |')
  io.stdout:flush()
end
local t1 = clock.now()
local ok, rows, info = pcall(generate.generate, model, prompts, {
  max_new_tokens = cfg.max_new_tokens, do_sample = cfg.do_sample, temperature = cfg.temperature,
  top_k = cfg.top_k, top_p = cfg.top_p, repetition_penalty = cfg.repetition_penalty, stop_ids = stop,
  seed = cfg.seed, use_cache = not cfg.no_cache, on_token = on_token,
  allow_past_max_positions = cfg.allow_past_max_positions,
})
if not ok then die(options.bare(rows)) end
local dt = clock.now() - t1
if #prompts == 1 then io.stdout:write('\n') end
local n = 0
for i, row in ipairs(rows) do
  n = n + #row
  if #prompts > 1 then
    if tok then
      print(('[%d] %s%s'):format(i, texts[i], continuation(i, row)))
    else
      print(('[%d] %s | %s'):format(i, table.concat(prompts[i], ' '), decode(row)))
    end
  end
  if cfg.print_ids then print(('ids[%d]: %s'):format(i, table.concat(row, ','))) end
end
print(('generated %d tokens for %d prompt%s in %.2f s (%.1f tokens/s, %s)'):format(n, #prompts,
  #prompts == 1 and '' or 's', dt, n / dt, cfg.no_cache and 'no cache' or 'KV cache'))
options.expose({ model = model, cfg = cfg, rows = rows, info = info })

-- recipes/chat.lua: talk to a model in the terminal, through its chat
-- template, its answers streamed as they are generated.
--
--   fsdp-lua recipes/chat.lua --init_from=HF_DIR [--system='You are terse.'] [--do_sample --temperature=0.7]
--   printf 'What is 2 + 3?\nAdd 4.\n' | fsdp-lua recipes/chat.lua --init_from=out    one answer per line
--
-- --init_from is what it is everywhere (models/pretrained.lua): a Hugging
-- Face directory, an export of ours, a sharded checkpoint (a LoRA run's
-- adapters merged on load), or a state dict with --model and --tokenizer/
-- --chat_template. The tokenizer and template are the model directory's
-- (or the one its checkpoint started from), or --tokenizer / --chat_template.
-- The history is kept: each turn renders the whole conversation
-- (fsdp.chat.assistant), and an answer ends at the template's end-of-turn
-- token (the tokenizer's and template's eos, generation_config.json's
-- eos_token_id) or --max_new_tokens.
-- Lines starting with / are commands: /reset (forget the history, keep the
-- system prompt), /system TEXT (a new system prompt, history forgotten;
-- /system alone removes it), /history, /exit (or /quit, or end of input).
-- On a terminal it prompts "you> " and streams "assistant> ..."; with
-- standard input not a terminal (a pipe, a file) it prints only each
-- answer, one per line, so scripts and tests can drive it.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local decoders = require 'models.decoders'
local pretrained = require 'models.pretrained'
local assistant = require 'fsdp.chat.assistant'
local lora = require 'fsdp.lora'
pcall(ffi.cdef, 'int isatty(int fd);')

local src, chat_model
local cfg = options.config({
  init_from = { '', 'the model: a Hugging Face directory, an export, a sharded checkpoint or a state dict',
                input = true },
  model = { '', 'model config name for what a state dict does not tell (heads, RoPE)',
            one_of = function() return { '', unpack(decoders.names()) } end },
  num_heads = { 0, 'attention heads of a state dict (0: --model\'s)', int = true, min = 0 },
  num_kv_heads = { 0, 'key/value heads of a state dict (0: from the weights)', int = true, min = 0 },
  tokenizer = { '', 'the tokenizer (default: the model directory\'s)' },
  chat_template = { '', 'the chat template: a model directory or a .jinja file (default: the model directory\'s)' },
  system = { '', 'the system prompt (empty: none; the template may add its default)' },
  max_new_tokens = { 256, 'tokens per answer at most', int = true, min = 1 },
  do_sample = { false, 'sample (temperature, top_k, top_p) instead of greedy decoding' },
  temperature = { 0.7, 'sampling temperature', positive = true },
  top_k = { 0, 'sample from the k most likely tokens only (0: all)', int = true, min = 0 },
  top_p = { 1.0, 'sample from the smallest set of tokens holding this probability (1: all)', positive = true, max = 1 },
  repetition_penalty = { 1.0, 'divide the logits of tokens already seen by this (1: off)', positive = true },
  seed = { 0, 'sampling seed', int = true, min = 0 },
  dtype = { 'f32', 'weights and cache dtype', one_of = { 'f32', 'bf16' } },
  device = require('fsdp.sharding.device').OPTIONS.device,
  allow_past_max_positions = decoders.OPTIONS.allow_past_max_positions,
}, arg, 'recipes/chat.lua', function(cfg)
  if cfg.init_from == '' then error('--init_from is needed: the model to talk to', 0) end
  local ok, s = pcall(pretrained.open, cfg.init_from, { families = decoders.ORDER, who = 'chat', model = cfg.model,
    num_heads = cfg.num_heads, num_kv_heads = cfg.num_kv_heads })
  if not ok then error('--init_from ' .. options.bare(s), 0) end
  src = s
  local ok2, a = pcall(assistant.open, src, { tokenizer = cfg.tokenizer, chat_template = cfg.chat_template })
  if not ok2 then error(options.bare(a), 0) end
  chat_model = a
end)

local interactive = ffi.C.isatty(0) == 1
local function die(msg)
  io.stderr:write('fsdp-lua: ', msg, '\n')
  os.exit(1, true)
end

local dev = require('fsdp.sharding.device').resolve(cfg)
local model = pretrained.build(src, { device = dev, dtype = cfg.dtype })
local ok, err = pcall(pretrained.load, model, src)
if not ok then die(options.bare(err)) end
if lora.config_of(model) then lora.merge(model) end
model:eval()
local limit = model:kv_cache_spec().max_positions
if interactive then
  io.stderr:write(('chat: %s (%s) from %s; template %s; /help for commands\n'):format(src.family,
    cfg.dtype, cfg.init_from, chat_model.tpl.name))
end

local history = {}
local function reset()
  history = {}
  if cfg.system ~= '' then history[1] = { role = 'system', content = cfg.system } end
end
reset()

local HELP = '/reset  forget the conversation\n/system TEXT  a new system prompt (and a new conversation)\n'
  .. '/history  show the conversation\n/exit  leave'

local turn = 0
while true do
  if interactive then
    io.stdout:write('you> ')
    io.stdout:flush()
  end
  local line = io.stdin:read('*l')
  if not line then break end
  line = line:gsub('\r$', '')
  local cmd, rest = line:match('^/(%a+)%s*(.-)%s*$')
  if cmd == 'exit' or cmd == 'quit' then
    break
  elseif cmd == 'reset' then
    reset()
    if interactive then print('(conversation forgotten)') end
  elseif cmd == 'system' then
    cfg.system = rest
    reset()
    if interactive then print(rest ~= '' and '(new system prompt, new conversation)' or '(no system prompt)') end
  elseif cmd == 'history' then
    for _, m in ipairs(history) do print(('%s: %s'):format(m.role, m.content)) end
  elseif cmd == 'help' then
    print(HELP)
  elseif cmd then
    print(('unknown command /%s\n%s'):format(cmd, HELP))
  elseif line:find('%S') then
    history[#history + 1] = { role = 'user', content = line }
    turn = turn + 1
    -- (the whole history within the model's positions: else the oldest
    -- turns would have to go; say so rather than fail inside generation)
    local n = #chat_model:prompt_ids(history)
    local room = limit and not cfg.allow_past_max_positions and math.min(cfg.max_new_tokens, limit - n)
      or cfg.max_new_tokens
    if room < 1 then
      history[#history] = nil
      print(('(the conversation holds %d tokens, the model %d positions: /reset to start again)'):format(n, limit))
    else
      if interactive then io.stdout:write('assistant> ') end
      local ok2, text = pcall(chat_model.reply, chat_model, model, history, {
        max_new_tokens = room, do_sample = cfg.do_sample, temperature = cfg.temperature, top_k = cfg.top_k,
        top_p = cfg.top_p, repetition_penalty = cfg.repetition_penalty, seed = cfg.seed + turn,
        allow_past_max_positions = cfg.allow_past_max_positions,
        on_text = interactive and function(piece) io.stdout:write(piece); io.stdout:flush() end or nil })
      if not ok2 then die(options.bare(text)) end
      if interactive then io.stdout:write('\n') else print((text:gsub('\n', ' '))) end
      io.stdout:flush()
      history[#history + 1] = { role = 'assistant', content = text }
    end
  end
end

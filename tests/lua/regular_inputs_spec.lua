-- regular_inputs_spec.lua: inputs are regular files, and whole-file reads
-- are bounded (issue 38; [Note: inputs are regular files] in
-- core/io/input_file.c). A FIFO (mkfifo, no writer: a reader that opened it
-- would wait for good), /dev/zero and /dev/urandom (a reader would never
-- end) and a directory are put where each reader expects a file: every
-- command, run under `timeout`, ends within seconds with one line naming
-- the file and what it is, and a non-zero status. Outputs are checked the
-- same way (a FIFO would block the writer). Files past a read's bound are
-- refused naming the limit; files in /proc (size 0, not empty) read whole.
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'
local clock = require 'fsdp.clock'
local T = require 'fsdp.testing'

local gnuplot = select(2, T.sh('command -v gnuplot')) == 0

local function mkfifo(path)
  local out, rc = T.sh('mkfifo ' .. T.quote(path))
  assert(rc == 0, out)
  return path
end

-- A command of the executable, bounded: output, status, seconds taken.
-- 124 (timeout's status) is what a reader waiting on a FIFO gives.
local function run(args, stdin)
  local t0 = clock.now()
  local out, rc = T.sh(('%stimeout -k 2 30 %s %s'):format(stdin and stdin .. ' | ' or '', T.quote(host.exe), args))
  return out, rc, clock.now() - t0
end

-- The command ends quickly, non-zero, on one line holding `want`.
local function refused(args, want, status, stdin)
  local out, rc, dt = run(args, stdin)
  assert(rc ~= 124 and rc ~= 137, ('timed out (a reader blocked): %s\n%s'):format(args, out))
  assert(dt < 15, ('took %.1f s: %s'):format(dt, args))
  if status then assert.equals(status, rc, out) else assert(rc ~= 0, out) end
  assert(out:find(want, 1, true), ('expected %q in:\n%s'):format(want, out))
  local line = out:match('[^\n]*' .. want:gsub('[%p]', '%%%0') .. '[^\n]*')
  assert.matches('^fsdp%-lua: ', line)
  return out, dt
end

-- A Lua snippet in a fresh process (a blocked read cannot hang this one):
-- each case prints "name: <its error>".
local function snippet(code)
  local path = os.tmpname()
  local f = assert(io.open(path, 'w'))
  f:write(code)
  f:close()
  local out, rc, dt = run(T.quote(path))
  os.remove(path)
  assert(rc ~= 124 and rc ~= 137, 'timed out (a reader blocked):\n' .. out)
  assert(dt < 15, ('took %.1f s'):format(dt))
  assert.equals(0, rc, out)
  local got = {}
  for name, msg in out:gmatch('([%w_]+): ([^\n]*)') do got[name] = msg end
  return got, out
end

describe('inputs are regular files', function()
  local dir = T.tmpdir()
  local fifo = mkfifo(dir .. '/pipe')
  local hf = dir .. '/hf'
  local tiny = ('--model=tiny --vocab_size=257 --seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=1 ')
  do
    local llama, hfio = require 'models.llama', require 'models.hf'
    local model = llama.build('tiny', { vocab_size = 257 })
    model:init_weights({ seed = 1 })
    hfio.save_pretrained(model, hf)
  end
  -- an HF directory like hf with one of its files replaced by a FIFO
  local function hf_with_fifo(name)
    local d = dir .. '/hf-' .. name:gsub('[^%w]', '_')
    assert(require('lfs').mkdir(d))
    for _, n in ipairs(files.list(hf)) do
      if n ~= name then files.write_atomic(d .. '/' .. n, assert(files.read(hf .. '/' .. n, 2 ^ 30))) end
    end
    mkfifo(d .. '/' .. name)
    return d
  end

  it('the core refuses a FIFO, devices and a directory by name, and bounds whole reads', function()
    local big = dir .. '/big.txt'
    T.sh(('head -c 1025 /dev/zero > %s'):format(T.quote(big)))
    local got, out = snippet(([[
local files = require 'fsdp.io.files'
local C = require('fsdp.core').C
local function try(name, fn, ...)
  local ok, err = pcall(fn, ...)
  print(name .. ': ' .. (ok and 'ok' or tostring(err):gsub('\n', ' ')))
end
local function read(path, limit, what)
  local text, err = files.read(path, limit, what)
  if not text then error(err, 0) end
  return #text
end
local fifo, big, dir = %q, %q, %q
try('check_fifo', function() assert(files.check_input(fifo)) end)
try('check_zero', function() assert(files.check_input('/dev/zero')) end)
try('check_dir', function() assert(files.check_input(dir)) end)
try('read_fifo', read, fifo)
try('read_urandom', read, '/dev/urandom')
try('read_big', read, big, 1024, 'a test file')
print('read_exact: ' .. read(big, 1025, 'a test file'))
print('read_proc: ' .. (read('/proc/self/status') > 0 and 'whole' or 'empty'))
try('open_input', function() assert(files.open_input(fifo)) end)
try('open_output', function() assert(files.open_output(fifo, 'a')) end)
try('is_file', files.is_file, fifo)
print('is_file_absent: ' .. tostring(files.is_file(dir .. '/none')))
try('safetensors', require('fsdp.io.safetensors').open, fifo)
try('safetensors_zero', require('fsdp.io.safetensors').open, '/dev/zero')
try('bpe_c', function() if C.fl_bpe_load(fifo) == nil then error(require('fsdp.core').last_error(), 0) end end)
try('spm_c', function() if C.fl_spm_load(fifo) == nil then error(require('fsdp.core').last_error(), 0) end end)
try('spm', require('fsdp.data.sentencepiece').load, fifo)
try('bpe', require('fsdp.data.bpe').load, fifo)
try('tokenizer', require('fsdp.data.tokenizer').load, fifo)
try('tensorboard', require('fsdp.observe.tensorboard').read, fifo)
try('devices', require('fsdp.devices').load, fifo)
try('plot', require('fsdp.observe.plot').read, fifo)
try('csv', require('fsdp.sweep').write_csv, fifo, {}, {})
]]):format(fifo, big, dir))
    local want = {
      check_fifo = fifo .. ' is a FIFO, not a regular file',
      check_zero = '/dev/zero is a character device, not a regular file',
      check_dir = dir .. ' is a directory, not a regular file',
      read_fifo = fifo .. ' is a FIFO, not a regular file',
      read_urandom = '/dev/urandom is a character device, not a regular file',
      read_big = big .. ' is larger than 1 KiB, the limit for a test file',
      read_exact = '1025', read_proc = 'whole',
      open_input = fifo .. ' is a FIFO', open_output = fifo .. ' is a FIFO', is_file = fifo .. ' is a FIFO',
      is_file_absent = 'false',
      safetensors = fifo .. ' is a FIFO', safetensors_zero = '/dev/zero is a character device',
      bpe_c = 'tokenizer: ' .. fifo .. ' is a FIFO', spm_c = 'sentencepiece: ' .. fifo .. ' is a FIFO',
      spm = fifo .. ' is a FIFO', bpe = fifo .. ' is a FIFO', tokenizer = fifo .. ' is a FIFO',
      tensorboard = fifo .. ' is a FIFO', devices = fifo .. ' is a FIFO', plot = fifo .. ' is a FIFO',
      csv = 'fsdp.sweep: cannot write ' .. fifo .. ': ' .. fifo .. ' is a FIFO',
    }
    for name, text in pairs(want) do
      assert(got[name] and got[name]:find(text, 1, true), ('%s: expected %q, got %s\n%s'):format(name, text,
        tostring(got[name]), out))
    end
  end)

  it('the data readers: a FIFO in a corpus directory, as a corpus file, as MNIST or pairs data', function()
    local corpus = dir .. '/corpus'
    assert(require('lfs').mkdir(corpus))
    local f = assert(io.open(corpus .. '/a.txt', 'w'))
    f:write('one document\n\nanother one\n')
    f:close()
    mkfifo(corpus .. '/b.txt')
    local mnist = dir .. '/mnist'
    assert(require('lfs').mkdir(mnist))
    mkfifo(mnist .. '/train-images-idx3-ubyte')
    local got, out = snippet(([[
local function try(name, fn, ...)
  local ok, err = pcall(fn, ...)
  print(name .. ': ' .. (ok and 'ok' or tostring(err):gsub('\n', ' ')))
end
local corpus, mnist, fifo = %q, %q, %q
try('files', require('fsdp.data.corpus').files, corpus)
try('glob', require('fsdp.data.corpus').files, corpus .. '/*.txt')
try('reader', function() for _ in require('fsdp.data.corpus').documents(corpus .. '/b.txt') do end end)
try('reader_c', function()
  local core = require 'fsdp.core'
  if core.C.fl_reader_open(corpus .. '/b.txt', nil) == nil then error(core.last_error(), 0) end
end)
try('mnist', require('fsdp.data.mnist').load, mnist, 'train')
try('pairs', require('fsdp.data.pairs').open, fifo, { tokenizer = 'byte' })
]]):format(corpus, mnist, fifo))
    for name, text in pairs({ files = corpus .. '/b.txt is a FIFO', glob = corpus .. '/b.txt is a FIFO',
                              reader = corpus .. '/b.txt is a FIFO', reader_c = corpus .. '/b.txt is a FIFO', mnist = 'train-images-idx3-ubyte is a FIFO',
                              pairs = fifo .. ' is a FIFO' }) do
      assert(got[name] and got[name]:find(text, 1, true), ('%s: expected %q, got %s\n%s'):format(name, text,
        tostring(got[name]), out))
    end
    -- the recipe refuses it when it starts, not when training reaches it
    refused(('recipes/llama2_7b.lua %s --tokenizer=byte --data=%s'):format(tiny, T.quote(corpus)),
      '--data: ' .. corpus .. '/b.txt is a FIFO, not a regular file', 2)
    refused(('recipes/t5_3b.lua --model=tiny --data=%s'):format(T.quote(fifo)), '--data: ' .. fifo
      .. ' is a FIFO, not a regular file', 2)
    refused(('tools/tokenize.lua --input=%s --output=%s'):format(T.quote(fifo), T.quote(dir .. '/shards')),
      'input ' .. fifo .. ' is a FIFO, not a regular file')
  end)

  it('models and checkpoints: model.safetensors, config.json, its index, tokenizer files, adapters', function()
    for name, want in pairs({
      ['model.safetensors'] = 'model.safetensors is a FIFO, not a regular file',
      ['config.json'] = '--init_from: %s/config.json is a FIFO, not a regular file',
      ['tokenizer.json'] = 'tokenizer.json is a FIFO, not a regular file',
    }) do
      local d = hf_with_fifo(name)
      if name == 'tokenizer.json' then
        -- a tokenizer the directory would offer: refused rather than skipped
        refused(('recipes/generate.lua --init_from=%s --prompt=hi --max_new_tokens=2'):format(T.quote(d)),
          d .. '/' .. want)
      else
        refused(('recipes/generate.lua --init_from=%s --prompt_ids=1,2 --max_new_tokens=2'):format(T.quote(d)),
          want:find('%s', 1, true) and want:format(d) or d .. '/' .. want)
      end
    end
    -- an index of shards whose index file is a FIFO
    local sharded = dir .. '/sharded'
    assert(require('lfs').mkdir(sharded))
    mkfifo(sharded .. '/model.safetensors.index.json')
    local adapters = dir .. '/adapters'
    assert(require('lfs').mkdir(adapters))
    mkfifo(adapters .. '/adapter_config.json')
    local step = dir .. '/ckpt/step-000001'
    T.sh('mkdir -p ' .. T.quote(step))
    mkfifo(step .. '/index.json')
    local got, out = snippet(([[
local function try(name, fn, ...)
  local ok, err = pcall(fn, ...)
  print(name .. ': ' .. (ok and 'ok' or tostring(err):gsub('\n', ' ')))
end
local sharded, adapters, step = %q, %q, %q
try('index', require('fsdp.io.safetensors_sharded').open_checkpoint, sharded)
try('peft', require('fsdp.lora').load_peft, {}, adapters)
try('ckpt_index', require('fsdp.checkpointing.directory').read_index, step)
]]):format(sharded, adapters, step))
    for name, text in pairs({ index = sharded .. '/model.safetensors.index.json is a FIFO',
                              peft = adapters .. '/adapter_config.json is a FIFO',
                              ckpt_index = step .. '/index.json is a FIFO' }) do
      assert(got[name] and got[name]:find(text, 1, true), ('%s: expected %q, got %s\n%s'):format(name, text,
        tostring(got[name]), out))
    end
  end)

  it('--prompt_file: FIFO and devices refused, the size bounded, standard input when asked with -', function()
    local gen = ('recipes/generate.lua --init_from=%s --tokenizer=byte --max_new_tokens=2 '):format(T.quote(hf))
    local hint = ' (for standard input give --prompt_file=-)'
    refused(gen .. '--prompt_file=/dev/zero', '--prompt_file: /dev/zero is a character device, not a regular file'
      .. hint, 2)
    refused(gen .. '--prompt_file=/dev/urandom', '--prompt_file: /dev/urandom is a character device', 2)
    refused(gen .. '--prompt_file=' .. T.quote(fifo), '--prompt_file: ' .. fifo .. ' is a FIFO, not a regular file'
      .. hint, 2)
    local huge = dir .. '/huge.txt'
    T.sh(('truncate -s 17M %s'):format(T.quote(huge))) -- sparse: nothing written
    refused(gen .. '--prompt_file=' .. T.quote(huge), '--prompt_file: ' .. huge
      .. ' is larger than 16 MiB, the limit for a prompt file', 1)
    refused(gen .. '--prompt_file=-', '--prompt_file: standard input holds more than 16 MiB, the limit for a '
      .. 'prompt file', 1, 'head -c 17000000 /dev/zero')
    -- asked for: prompts from a pipe
    local out, rc = run(gen .. '--prompt_file=- --print_ids', "printf 'hi\\nthere\\n'")
    assert.equals(0, rc, out)
    assert.matches('for 2 prompts', out, 1, true)
  end)

  it('the recipes\' files: --metrics_file, --config, tools/plot.lua\'s JSONL and its outputs', function()
    refused(('recipes/llama2_7b.lua %s --metrics_file=%s'):format(tiny, T.quote(fifo)),
      '--metrics_file: ' .. fifo .. ' is a FIFO, not a regular file', 2)
    refused(('recipes/mnist.lua --config=%s'):format(T.quote(fifo)), '--config: ' .. fifo
      .. ' is a FIFO, not a regular file', 2)
    refused(('recipes/generate.lua --init_from=%s --tokenizer=%s --prompt=hi'):format(T.quote(hf), T.quote(fifo)),
      '--tokenizer: ' .. fifo .. ' is a FIFO, not a regular file', 2)
    refused(('tools/plot.lua %s'):format(T.quote(fifo)), 'tools/plot.lua: ' .. fifo .. ' is a FIFO', 2)
    refused(('tools/trace_summary.lua %s'):format(T.quote(fifo)), fifo .. ' is a FIFO, not a regular file')
    refused(('recipes/sweep.lua --recipe=%s --out=%s'):format(T.quote(fifo), T.quote(dir .. '/sweep')),
      '--recipe: ' .. fifo .. ' is a FIFO, not a regular file', 2)
    if gnuplot then
      -- gnuplot would wait on an image that is a FIFO
      local runs = dir .. '/runs'
      assert(require('lfs').mkdir(runs))
      local f = assert(io.open(runs .. '/r.jsonl', 'w'))
      f:write('{"type":"train","step":1,"loss":2,"lr":0.1}\n')
      f:close()
      mkfifo(runs .. '/r.svg')
      refused(('tools/plot.lua %s'):format(T.quote(runs .. '/r.jsonl')), runs .. '/r.svg is a FIFO', 1)
    end
  end)

  it('cleans up', function() files.remove_tree(dir) end)
end)

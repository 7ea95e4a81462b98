-- metrics_spec.lua: the training log: the seed's step format with
-- throughput, TFLOPS, MFU, memory and grad norm; validation lines;
-- log_every; the progress bar only when asked; a JSONL file whose every
-- line parses; the distributed summary FSDP_DEBUG=INFO prints.
local fsdp = require 'fsdp'
local host = require 'fsdp.host'
local metrics = require 'fsdp.observe.metrics'
local cjson = require 'cjson'

local function capture(opts, fn)
  local path = os.tmpname()
  local out = assert(io.open(path, 'w'))
  opts.out = out
  local log = metrics.Logger(opts)
  fn(log)
  log:close()
  out:close()
  local f = assert(io.open(path, 'rb'))
  local text = f:read('*a')
  f:close()
  os.remove(path)
  return text
end

describe('fsdp.metrics.Logger', function()
  it('prints steps in the seed format with tokens/s, TFLOPS, MFU, peak memory and grad norm', function()
    local text = capture({ total_steps = 2, batch_size = 4, tokens_per_sample = 128, flops_per_sample = 1e12,
                           peak_tflops = 10, progress = false }, function(log)
      log:step(1, { loss = 2.5, lr = 3e-4, dt = 0.5, grad_norm = 1.25 })
      log:step(2, { loss = 2.25, lr = 1e-4, dt = 2 })
    end)
    -- 4 samples in 0.5 s: 8 samples/s, 1024 tokens/s; 4e12 FLOPs in 0.5 s = 8 TFLOPS = 80% of 10
    local lines = {}
    for l in text:gmatch('[^\n]+') do lines[#lines + 1] = l end
    assert.equals(2, #lines, text)
    assert.matches('^Batch 1 Loss: 2%.5000, Speed: 8%.00 samples/sec, lr: 3%.000e%-04, tokens/s: 1024, '
      .. 'TFLOPS: 8, MFU: 80%.00%%, peak memory: [%d.]+ MiB, grad norm: 1%.250$', lines[1])
    assert.matches('^Batch 2 Loss: 2%.2500, Speed: 2%.00 samples/sec, lr: 1%.000e%-04, tokens/s: 256, '
      .. 'TFLOPS: 2, MFU: 20%.00%%, peak memory: [%d.]+ MiB$', lines[2])
  end)

  it('leaves out what was not declared and logs every log_every steps and the last', function()
    local text = capture({ total_steps = 7, batch_size = 2, log_every = 3, progress = false }, function(log)
      for s = 1, 7 do log:step(s, { loss = 1, lr = 0.1, dt = 1 }) end
    end)
    local steps = {}
    for n in text:gmatch('Batch (%d+) ') do steps[#steps + 1] = tonumber(n) end
    assert.same({ 3, 6, 7 }, steps)
    assert.not_matches('TFLOPS', text)
    assert.not_matches('MFU', text)
    assert.not_matches('tokens/s', text)
  end)

  it('reports validation loss and perplexity', function()
    local text = capture({ progress = false }, function(log) log:validation(50, math.log(20)) end)
    assert.equals('Validation at batch 50: loss 2.9957, perplexity 20.000\n', text)
  end)

  it('draws a progress bar only when asked, keeping log lines whole', function()
    local text = capture({ total_steps = 4, batch_size = 1, log_every = 2, progress = true }, function(log)
      for s = 1, 4 do log:step(s, { loss = 0.5, lr = 0.1, dt = 1 }) end
    end)
    assert.matches('\r%[#######+%.+%] 1/4  25%% loss 0%.5000', text)
    assert.matches('\r\27%[KBatch 2 Loss: 0%.5000', text)
    local plain = capture({ total_steps = 4, batch_size = 1, progress = false }, function(log)
      for s = 1, 4 do log:step(s, { loss = 0.5, lr = 0.1, dt = 1 }) end
    end)
    assert.not_matches('[\r\27]', plain)
  end)

  it('writes a JSONL file whose every line is valid JSON, NaN as null', function()
    local path = os.tmpname()
    capture({ total_steps = 3, batch_size = 2, tokens_per_sample = 8, peak_tflops = 1, flops_per_sample = 1e9,
              metrics_file = path, progress = false }, function(log)
      log:step(1, { loss = 3, lr = 0.01, dt = 0.1, grad_norm = 2 })
      log:step(2, { loss = 0 / 0, lr = 0.01, dt = 0.1 })
      log:validation(2, 2.5)
    end)
    local records = {}
    for line in io.lines(path) do records[#records + 1] = cjson.decode(line) end
    os.remove(path)
    assert.equals(3, #records)
    local r = records[1]
    assert.equals('train', r.type)
    assert.equals(1, r.step)
    assert.equals(3, r.loss)
    assert.equals(20, r.samples_per_sec)
    assert.equals(160, r.tokens_per_sec)
    assert.near(0.02, r.tflops_per_rank, 1e-12) -- 2 x 1e9 FLOPs in 0.1 s
    assert.near(0.02, r.mfu, 1e-12)
    assert.equals(2, r.grad_norm)
    assert.is_number(r.peak_memory_bytes)
    assert.is_number(r.time)
    assert.equals(cjson.null, records[2].loss)
    assert.same({ 'val', 2, 2.5 }, { records[3].type, records[3].step, records[3].loss })
    assert.near(math.exp(2.5), records[3].perplexity, 1e-9)
  end)

  it('writes numbers that read back bit for bit (lua-cjson alone keeps 14 digits)', function()
    local path = os.tmpname()
    local lr, norm = 0.1 + 0.2, 1 / 3 -- need 17 significant digits
    capture({ total_steps = 1, batch_size = 1, metrics_file = path, progress = false }, function(log)
      log:step(1, { loss = 2.7182818284590451, lr = lr, dt = 0.1, grad_norm = norm })
    end)
    local r
    for line in io.lines(path) do r = cjson.decode(line) end
    os.remove(path)
    assert.equals(2.7182818284590451, r.loss)
    assert.equals(lr, r.lr)
    assert.equals(norm, r.grad_norm)
  end)

  it('prints the interval\'s means: loss over its steps, speed over its time', function()
    local text = capture({ total_steps = 4, batch_size = 2, tokens_per_sample = 10, log_every = 2, progress = false },
      function(log)
        log:step(1, { loss = 1, lr = 0.1, dt = 1, grad_norm = 1 })
        log:step(2, { loss = 3, lr = 0.2, dt = 3, grad_norm = 2 })
        log:step(3, { loss = 5, lr = 0.3, dt = 1 })
        log:step(4, { loss = 0 / 0, lr = 0.4, dt = 1, skipped = true })
      end)
    -- steps 1-2: 4 samples in 4 s; step 3 and the skipped 4 (its NaN out of the mean): 4 samples in 2 s
    assert.matches('Batch 2 Loss: 2%.0000, Speed: 1%.00 samples/sec, lr: 2%.000e%-01, tokens/s: 10, .*grad norm: 1%.500\n',
      text)
    assert.matches('Batch 4 Loss: nan, Speed: 2%.00 samples/sec', text)
  end)

  it('--log_every=0: every step to a file, every 10 under a progress bar', function()
    local function lines(progress)
      local text = capture({ total_steps = 25, batch_size = 1, log_every = 0, progress = progress }, function(log)
        for s = 1, 25 do log:step(s, { loss = 1, lr = 0.1, dt = 1 }) end
      end)
      local steps = {}
      for n in text:gmatch('Batch (%d+) ') do steps[#steps + 1] = tonumber(n) end
      return steps
    end
    assert.equals(25, #lines(false))
    assert.same({ 10, 20, 25 }, lines(true))
  end)

  it('resume(step) drops the records past step (and a torn line), the time going on', function()
    local path = os.tmpname()
    local f = assert(io.open(path, 'w'))
    for s = 1, 5 do f:write(('{"type":"train","step":%d,"loss":1,"time":%d}\n'):format(s, s * 10)) end
    f:write('{"type":"val","step":3,"loss":1,"time":31}\n{"type":"val","step":5,"loss":1,"time":51}\n{"type":"tra')
    f:close()
    local text = capture({ total_steps = 5, batch_size = 1, metrics_file = path, progress = false }, function(log)
      log:resume(3)
      log:step(4, { loss = 2, lr = 0.1, dt = 1 })
    end)
    assert.matches('metrics: ' .. path .. ': dropped 4 records past step 3', text, 1, true)
    local got = {}
    for line in io.lines(path) do
      local r = cjson.decode(line)
      got[#got + 1] = r.type .. r.step
      if r.step == 4 then assert.is_true(r.time >= 31 and r.time < 41, tostring(r.time)) end
    end
    os.remove(path)
    assert.same({ 'train1', 'train2', 'train3', 'val3', 'train4' }, got)
  end)

  it('--tensorboard_dir: the scalars of every step and validation, the configuration as text', function()
    local tb = require 'fsdp.observe.tensorboard'
    local T = require 'fsdp.testing'
    local dir = T.tmpdir()
    capture({ total_steps = 2, batch_size = 2, tokens_per_sample = 8, tensorboard_dir = dir, progress = false,
              config = { lr = 0.5, model = 'tiny' } }, function(log)
      log:step(1, { loss = 3, lr = 0.5, dt = 0.5, grad_norm = 2 })
      log:step(2, { loss = 2, lr = 0.25, dt = 0.5 })
      log:validation(2, 1.5)
    end)
    local paths = tb.files(dir)
    assert.equals(1, #paths)
    local seen = {}
    for _, e in ipairs(tb.read(paths[1])) do
      for _, v in ipairs(e.values) do seen[('%s@%d'):format(v.tag, e.step)] = v.value or v.text end
    end
    assert.equals('| option | value |\n|---|---|\n| lr | 0.5 |\n| model | tiny |', seen['config@0'])
    assert.equals(3, seen['train/loss@1'])
    assert.equals(0.25, seen['train/lr@2'])
    assert.equals(2, seen['train/grad_norm@1'])
    assert.is_nil(seen['train/grad_norm@2'])
    assert.equals(32, seen['perf/tokens_per_sec@1']) -- 2 samples of 8 tokens in 0.5 s
    assert.equals(1.5, seen['val/loss@2'])
    assert.near(math.exp(1.5), seen['val/perplexity@2'], 1e-5)
    assert.is_number(seen['memory/peak_mib@2'])
    require('fsdp.io.files').remove_tree(dir)
  end)

  it('names a metrics file it cannot open and a bad option', function()
    assert.error_matches(function() metrics.Logger({ metrics_file = '/nonexistent/dir/m.jsonl' }) end,
      'fsdp.metrics: cannot open metrics file /nonexistent/dir/m.jsonl')
    assert.error_matches(function() metrics.Logger({ peak_tflops = 'fast' }) end,
      'option peak_tflops must be a number >= 0, got fast')
  end)

  it('averages an evaluation over its batches', function()
    local losses = { 1, 2, 6 }
    local k = 0
    local mean = metrics.evaluate(function(x) return fsdp.tensor({ x }) end, function()
      k = k + 1
      return losses[k]
    end)
    assert.equals(3, mean)
  end)
end)

describe('FSDP_DEBUG=INFO', function()
  it('prints the distributed setup at start', function()
    local p = io.popen(('cd %s && FSDP_DEBUG=INFO NCCL_DEBUG=WARN timeout 60 %s recipes/llama2_7b.lua --num_layers=1 '
      .. '--hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=8 --batch_size=2 --max_steps=2 --warmup_steps=1 2>&1'):format(
      host.root, host.exe))
    local out = p:read('*a')
    p:close()
    assert.matches('[rank 0] fsdp: rank 0 of 1, local rank 0 of 1, node 0 of 1, transport self, world group '
      .. 'Group(world, rank 0 of 1, world ranks {0}), NCCL_DEBUG=WARN', out, 1, true)
    assert.matches('Batch 2 Loss:', out, 1, true)
  end)
end)

-- sft_recipe_spec.lua: recipes/sft.lua and recipes/chat.lua on a tiny
-- Qwen2 with the Qwen2.5-Instruct template (tools/make_chat_task.lua):
-- option mistakes are one line before anything is built; a short run
-- trains on the answers, validates and shows sample answers; --eval
-- prints the exact-match count; chat.lua through a pipe answers each line
-- with what fsdp.chat.assistant generates greedily on the same weights,
-- keeping the history, and obeys /reset and /exit.
local T = require 'fsdp.testing'
local pretrained = require 'models.pretrained'
local decoders = require 'models.decoders'
local assistant = require 'fsdp.chat.assistant'

describe('recipes/sft.lua and recipes/chat.lua', function()
  local dir = T.tmpdir()
  local out0, rc0 = T.run_script('tools/make_chat_task.lua', ('--out=%s --train=48 --test=6 --width=32 --layers=1')
    :format(T.quote(dir)))
  assert(rc0 == 0, out0)
  local model_dir, train, test = dir .. '/qwen2', dir .. '/train.jsonl', dir .. '/test.jsonl'
  local function sft(args) return T.run_script('recipes/sft.lua', args) end

  it('refuses option mistakes in one line, exit status 2', function()
    local cases = {
      { '--data=' .. T.quote(train), '--init_from is needed' },
      { '--init_from=' .. T.quote(model_dir), '--data is needed' },
      { ('--init_from=tests/golden/hf/qwen2_tiny --data=%s'):format(T.quote(train)), 'has no tokenizer' },
      { ('--init_from=%s --data=%s --train_on=answers'):format(T.quote(model_dir), T.quote(train)), '--train_on' },
      { ('--init_from=%s --data=%s --seq_len=600'):format(T.quote(model_dir), T.quote(train)), 'positions' },
      { ('--init_from=%s --data=%s --chat_template=%s/nothing.jinja'):format(T.quote(model_dir), T.quote(train),
        T.quote(dir)), 'nothing.jinja' },
    }
    for _, c in ipairs(cases) do
      local out, rc = sft(c[1]:find('seq_len') and c[1] or (c[1] .. ' --seq_len=160'))
      assert(rc == 2, ('%s: exit %s\n%s'):format(c[1], tostring(rc), out))
      assert(out:find(c[2], 1, true), ('%s: expected %q in\n%s'):format(c[1], c[2], out))
      assert(not out:find('traceback', 1, true), out)
    end
  end)

  it('names the file and line of a bad record', function()
    local bad = dir .. '/bad.jsonl'
    local f = assert(io.open(bad, 'w'))
    f:write('{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"1"}]}\n')
    f:write('{"messages":[{"role":"robot","content":"hi"}]}\n')
    f:close()
    local out, rc = sft(('--init_from=%s --data=%s --seq_len=160'):format(T.quote(model_dir), T.quote(bad)))
    assert(rc == 2, out)
    assert(out:find('--data: ', 1, true) and out:find('bad.jsonl', 1, true) and out:find('line 2', 1, true), out)
  end)

  it('trains on the answers, validates, shows sample answers and exports; --eval counts exact matches', function()
    local export = dir .. '/out'
    local out, rc = sft(('--init_from=%s --data=%s --val_data=%s --seq_len=160 --max_steps=6 --batch_size=4 '
      .. '--lr=3e-3 --validation_freq=3 --num_samples=2 --sample_max_new_tokens=4 --log_every=1 --export_hf=%s')
      :format(T.quote(model_dir), T.quote(train), T.quote(test), T.quote(export)))
    assert(rc == 0, out)
    assert(out:find('48 conversations (48 records)', 1, true), out)
    assert(out:find('Validation at batch 6: loss', 1, true), out)
    assert(out:find('samples at step 3 %(%d/2 exact%)') and out:find('reference: ', 1, true), out)
    local first = tonumber(out:match('Batch 1 Loss: ([%d.]+)'))
    local last = tonumber(out:match('Batch 6 Loss: ([%d.]+)'))
    assert(first and last and last < first, out)
    local ev, erc = sft(('--init_from=%s --val_data=%s --eval --seq_len=160 --sample_max_new_tokens=4'):format(
      T.quote(export), T.quote(test)))
    assert(erc == 0, ev)
    assert(ev:find('eval: answer loss [%d.]+ over %d+ tokens; exact match %d/6 = '), ev)
  end)

  it('chat.lua through a pipe: greedy answers with the history, /reset and /exit', function()
    local src = pretrained.open(model_dir, { families = decoders.ORDER })
    local model = pretrained.build(src, { device = 'cpu' })
    pretrained.load(model, src)
    model:eval()
    local a = assistant.open(src)
    local h = { { role = 'system', content = 'Answer with a number.' }, { role = 'user', content = 'What is 2 + 3?' } }
    local r1 = a:reply(model, h, { max_new_tokens = 5 })
    h[#h + 1] = { role = 'assistant', content = r1 }
    h[#h + 1] = { role = 'user', content = 'Add 4.' }
    local r2 = a:reply(model, h, { max_new_tokens = 5 })
    local r3 = a:reply(model, { h[1], { role = 'user', content = 'Add 4.' } }, { max_new_tokens = 5 })
    local input = dir .. '/input.txt'
    local f = assert(io.open(input, 'w'))
    f:write('What is 2 + 3?\nAdd 4.\n/reset\nAdd 4.\n/exit\nnever read\n')
    f:close()
    local out, rc = T.run_script('recipes/chat.lua', ('--init_from=%s --system=%s --max_new_tokens=5 < %s'):format(
      T.quote(model_dir), T.quote('Answer with a number.'), T.quote(input)))
    assert(rc == 0, out)
    local lines = {}
    for l in (out .. '\n'):gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
    local want = { r1:gsub('\n', ' '), r2:gsub('\n', ' '), r3:gsub('\n', ' ') }
    for i = 1, 3 do assert.equals(want[i], lines[i]) end
    assert(#out:gsub('\n$', '') == #(want[1] .. '\n' .. want[2] .. '\n' .. want[3]), out)
  end)
end)

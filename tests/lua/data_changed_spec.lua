-- data_changed_spec.lua: resuming on data files that changed since the
-- position was saved ([Note: the fingerprint of a data position] in
-- lua/fsdp/data/corpus.lua). A corpus stream saves its position, a file
-- is then cut below it, edited in place where it was read (same size),
-- removed before it was read, added, or appended to; load_state refuses
-- each (but the append) in one line naming the file, or with
-- data_changed = 'continue' says it and goes on. The reader's own check
-- is driven directly for .jsonl, .gz and .zst (a compressed file edited
-- keeps no size, so the listing would see it first); token shards and
-- text pairs record their files too; and the recipe stops with a non-zero
-- exit, or goes on with --data_changed=continue.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local corpus = require 'fsdp.data.corpus'
local gen = require 'tests.data.corpus'
local testing = require 'fsdp.testing'
local byte = require('fsdp.data.byte_tokenizer').new()
local C = require('fsdp.core').C

local tmp = testing.tmpdir()
local raises = testing.raises

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local function write(path, s, mode)
  local f = assert(io.open(path, mode or 'wb'))
  f:write(s)
  f:close()
end

local function sh(cmd) assert(os.execute(cmd) == 0, cmd) end

-- The original corpus: three JSON lines files of 30 documents.
local orig = tmp .. '/orig'
sh('mkdir -p ' .. orig)
for k = 1, 3 do gen.write(('%s/part-%d.jsonl'):format(orig, k), { documents = 30, jsonl = true, seed = k }) end

-- A fresh copy of it for one case.
local n = 0
local function fresh()
  n = n + 1
  local dir = ('%s/case%d'):format(tmp, n)
  sh(('cp -r %s %s'):format(orig, dir))
  return dir
end

local function stream(dir, opts)
  local o = { tokenizer = byte, seq_len = 16, batch_size = 2, rank = 0, world_size = 1, threads = 1,
              shuffle = false }
  for k, v in pairs(opts or {}) do o[k] = v end
  return corpus.open(dir, o)
end

-- k batches as one string of their ids.
local function take(s, k)
  local out = {}
  for i = 1, k do out[i] = table.concat(s:next():view({ -1 }):totable(), ',') end
  return table.concat(out, ';')
end

-- A stream 25 batches into part-1 (the saved position), and the 5 batches
-- that come next.
local function saved(dir, opts)
  local s = stream(dir, opts)
  take(s, 25)
  local st = s:state()
  assert(st.file == 0 and st.offset > 100 and st.file_name == dir .. '/part-1.jsonl', st.file_name)
  return st, take(s, 5)
end

-- Resume st with data_changed = 'continue': what it printed, and the stream.
local function going_on(dir, st, opts)
  local o = { data_changed = 'continue' }
  for k, v in pairs(opts or {}) do o[k] = v end
  local r = stream(dir, o)
  local out = testing.capture_stdout(function() r:load_state(st) end)
  return out, r
end

describe('a corpus position', function()
  it('resumes exactly on unchanged data and carries the fingerprint', function()
    local dir = fresh()
    local st, want = saved(dir)
    assert.truthy(st.before:match('^xxh3%-64:%x+$') and st.through:match('^xxh3%-64:%x+$'))
    assert.equal(3, #st.files)
    assert.same({ dir .. '/part-3.jsonl', #read(dir .. '/part-3.jsonl') }, st.files[3])
    local r = stream(dir)
    assert.equal('', testing.capture_stdout(function() r:load_state(st) end))
    assert.equal(want, take(r, 5))
    -- paragraphs of a .txt file (CRLF lines, runs of blank lines), also compressed
    local txt = tmp .. '/para.txt'
    write(txt, table.concat(gen.documents({ documents = 40, seed = 7 }), '\r\n\r\n\n'))
    sh(('gzip -c %q > %q.gz'):format(txt, txt))
    for _, file in ipairs({ txt, txt .. '.gz' }) do
      local s = stream(file)
      take(s, 30)
      local at = s:state()
      assert.truthy(at.index > 3 and at.consumed > 0, file)
      local later = take(s, 5)
      local again = stream(file)
      again:load_state(at)
      assert.equal(later, take(again, 5), file)
    end
  end)

  it('refuses a file cut below the saved offset, naming it; continue goes on to the next file', function()
    local dir = fresh()
    local st = saved(dir)
    local file = dir .. '/part-1.jsonl'
    local size = #read(file)
    write(file, read(file):sub(1, st.offset - 10))
    raises(function() stream(dir):load_state(st) end, ('%s: now %d bytes, %d when the data position was saved '
      .. '(truncated or rewritten); resume refused (--data_changed=continue goes on with the data as it is)')
      :format(file, st.offset - 10, size))
    local out, r = going_on(dir, st)
    assert.truthy(out:find(file .. ': now ' .. (st.offset - 10) .. ' bytes', 1, true), out)
    assert.truthy(out:find(file .. ': the file now holds ' .. (st.offset - 10) .. ' bytes, the saved position is at '
      .. 'byte ' .. st.offset, 1, true), out)
    assert.truthy(out:find('going on with it as it is (--data_changed=continue)', 1, true), out)
    take(r, 1)
    assert.equal(dir .. '/part-2.jsonl', r:state().file_name)
  end)

  it('refuses an in-place edit of what was read, keeping the size, and of the document being read', function()
    local dir = fresh()
    local st, want = saved(dir)
    local file = dir .. '/part-1.jsonl'
    local text = read(file)
    -- a byte of the first document, long read
    local at = text:find('"text": "', 1, true) + 9
    write(file, text:sub(1, at - 1) .. (text:sub(at, at) == 'X' and 'Y' or 'X') .. text:sub(at + 1))
    raises(function() stream(dir):load_state(st) end, ('%s: the %d bytes before the saved position (line %d) are '
      .. 'not the ones read then: the file changed in place since the position was saved; resume refused')
      :format(file, st.offset, st.line))
    local out, r = going_on(dir, st)
    assert.truthy(out:find('are not the ones read then', 1, true), out)
    assert.equal(want, take(r, 5)) -- the edit was before the position: the rest is as it was
    -- the document the position is in, after its first byte: read again
    -- from its start on resume, its tokens would not be the ones consumed
    write(file, text)
    local line_end = text:find('\n', st.offset + 1, true)
    local mid = st.offset + math.floor((line_end - st.offset) / 2)
    local c = text:sub(mid, mid)
    write(file, text:sub(1, mid - 1) .. (c == 'e' and 'a' or 'e') .. text:sub(mid + 1))
    raises(function() stream(dir):load_state(st) end, ('%s: the document at the saved position (line %d, byte %d) '
      .. 'is not the one read then: the file changed in place since the position was saved'):format(file, st.line,
      st.offset))
    -- a broken document there is said as a change, not blamed as bad JSON
    write(file, text:sub(1, st.offset) .. '[' .. text:sub(st.offset + 2))
    raises(function() stream(dir):load_state(st) end, ('%s: the document at the saved position (line %d) is not the '
      .. 'one read then: the file changed since the position was saved (reading it now: %s: line %d (byte %d) is '
      .. 'not valid JSON'):format(file, st.line, file, st.line, st.offset))
  end)

  it('refuses a file removed before it was read, and one added; continue goes on exactly', function()
    local dir = fresh()
    local st, want = saved(dir)
    os.remove(dir .. '/part-3.jsonl')
    raises(function() stream(dir):load_state(st) end, dir .. '/part-3.jsonl: removed since the data position was '
      .. 'saved (3 files then, 2 now); resume refused (--data_changed=continue goes on with the data as it is)')
    local out, r = going_on(dir, st)
    assert.truthy(out:find('data: ' .. dir .. '/part-3.jsonl: removed since', 1, true), out)
    assert.equal(want, take(r, 5))
    gen.write(dir .. '/part-3.jsonl', { documents = 30, jsonl = true, seed = 3 })
    gen.write(dir .. '/part-0.jsonl', { documents = 5, jsonl = true, seed = 9 })
    -- part-0 sorts first: part-1 is no longer where the position is
    raises(function() stream(dir):load_state(st) end, dir .. '/part-0.jsonl: added since the data position was '
      .. 'saved (3 files then, 4 now); resume refused')
    out, r = going_on(dir, st)
    assert.truthy(out:find('part-0.jsonl: added since', 1, true), out)
    take(r, 1)
    -- going on from place 0 of the order, now part-0, from its start
    assert.equal(dir .. '/part-0.jsonl', r:state().file_name)
    assert.equal(0, r:state().index)
  end)

  it('takes a file appended to as a growing log: says it, and reads what was appended', function()
    local dir = fresh()
    local once = { once = true }
    local s = stream(dir, once)
    take(s, 25)
    local st = s:state()
    -- the text of the rest of a stream (rows overlap by a token: the first
    -- of each row after the first is dropped; eos shows as '|')
    local function text_of(x)
      local out, first = {}, true
      while true do
        local rows = x:rows(4)
        if not rows then break end
        for _, row in ipairs(rows:totable()) do
          for j = first and 1 or 2, #row do out[#out + 1] = row[j] < 256 and string.char(row[j]) or '|' end
          first = false
        end
      end
      return table.concat(out)
    end
    local want = text_of(s)
    local later = '{"text": "appended later, to the last file: a log that grows, read when the stream gets '
      .. 'there"}\n'
    write(dir .. '/part-3.jsonl', later, 'ab')
    write(dir .. '/part-1.jsonl', '{"text": "appended to the file being read"}\n', 'ab')
    local r = stream(dir, once)
    local out = testing.capture_stdout(function() r:load_state(st) end)
    local size3 = #read(dir .. '/part-3.jsonl')
    assert.truthy(out:find(('data: %s/part-3.jsonl: grew from %d to %d bytes since the data position was saved (taken '
      .. 'as appended'):format(dir, size3 - #later, size3), 1, true), out)
    assert.truthy(out:find('part-1.jsonl: grew from', 1, true), out)
    assert.falsy(out:find('going on', 1, true), out)
    local got = text_of(r)
    local a1 = got:find('|appended to the file being read|', 1, true)
    local p2 = got:find('|' .. gen.documents({ documents = 30, seed = 2 })[1] .. '|', 1, true)
    local a3 = got:find('|appended later, to the last file', 1, true) -- (a once stream drops a last part row)
    assert.truthy(a1 and p2 and a3, got)
    assert.truthy(a1 < p2 and p2 < a3, got) -- each where its file is read
    assert.equal(want:sub(1, a1), got:sub(1, a1)) -- exactly the unchanged run's up to there
    local L = #'appended to the file being read|'
    assert.equal(want:sub(a1 + 1, a1 + 200), got:sub(a1 + 1 + L, a1 + 200 + L)) -- and after it
  end)

  it('on rank 1 of 2 (whose position holds no list) sees a changed list, without naming', function()
    local dir = fresh()
    local s = stream(dir, { rank = 1, world_size = 2 })
    take(s, 3)
    local st = s:state()
    assert.is_nil(st.files)
    assert.equal(3, st.num_files)
    os.remove(dir .. '/part-3.jsonl')
    raises(function() stream(dir, { rank = 1, world_size = 2 }):load_state(st) end, dir .. ': its files changed '
      .. 'since the data position was saved (3 then, 2 now: added, removed or renamed; rank 0\'s position names them)')
  end)

  it('resumes a position saved before fingerprints unchecked, saying so; refuses a damaged one', function()
    local dir = fresh()
    local st, want = saved(dir)
    local old = {}
    for k, v in pairs(st) do old[k] = v end
    old.before, old.through, old.files, old.num_files, old.names_digest = nil, nil, nil, nil, nil
    local r = stream(dir)
    local out = testing.capture_stdout(function() r:load_state(old) end)
    assert.truthy(out:find('the saved position has no fingerprint (saved by an older fsdp-lua): resuming without '
      .. 'checking the files', 1, true), out)
    assert.equal(want, take(r, 5))
    local function damaged(k, v, text)
      local bad = {}
      for key, val in pairs(st) do bad[key] = val end
      bad[k] = v
      raises(function() stream(dir):load_state(bad) end, text)
    end
    damaged('before', 'xxh3-64:nothex', "the saved position's fingerprint is damaged")
    damaged('files', { { 1, 2 } }, "the saved position's fingerprint is damaged")
    damaged('offset', -1, 'the saved position has offset = -1, not an integer from 0 (a damaged position)')
    damaged('line', 0.5, 'the saved position has line = 0.5, not an integer from 1')
    damaged('consumed', 2 ^ 60, 'the saved position has consumed = ')
    damaged('file_name', nil, 'the saved position names no file (file_name = nil: a damaged position)')
    -- saved values reach a message on one line
    damaged('split', 'tr\nain', 'the saved position is for split = "tr\\nain", this stream has all')
    raises(function() stream(dir):load_state('{"kind":\n') end, 'load_state expects a state from a corpus stream, got '
      .. '"{\\"kind\\":\\n"')
  end)
end)

describe('the corpus reader', function()
  it('checks a position in .jsonl, .jsonl.gz and .jsonl.zst: the bytes before it and its document', function()
    local text = read(orig .. '/part-1.jsonl')
    local ro = ffi.new('fl_reader_opts')
    local t, len = ffi.new('const char *[1]'), ffi.new('size_t[1]')
    local function open(path)
      local r = ffi.gc(C.fl_reader_open(path, ro), C.fl_reader_free)
      assert(r ~= nil, path)
      return r
    end
    local function place(path, body, ext)
      write(path, body)
      if ext == '.gz' then sh(('gzip -f %q'):format(path)) end
      if ext == '.zst' then sh(('zstd -q --rm -f %q'):format(path)) end
      return path .. ext
    end
    for _, ext in ipairs({ '', '.gz', '.zst' }) do
      local path = place(('%s/r%s.jsonl'):format(tmp, ext:gsub('%.', '_')), text, ext)
      local r = open(path)
      for _ = 1, 7 do assert(C.fl_reader_next(r, t, len) == 1) end
      local pos = ffi.new('fl_doc_position')
      C.fl_reader_position(r, pos)
      local doc7 = ffi.string(t[0], len[0])
      r = open(path)
      assert.equal(0, C.fl_reader_seek(r, pos, true))
      assert.equal(1, C.fl_reader_next(r, t, len))
      assert.equal(doc7, ffi.string(t[0], len[0]))
      -- a byte of the third document changed: compressed again, only the check can tell
      local at = text:find('"text": "', text:find('\n', text:find('\n', 1, true) + 1, true), true) + 9
      path = place(('%s/r%s.jsonl'):format(tmp, ext:gsub('%.', '_')), text:sub(1, at - 1) .. '#'
        .. text:sub(at + 1), ext)
      r = open(path)
      assert.not_equal(0, C.fl_reader_seek(r, pos, true))
      assert.truthy(ffi.string(C.fl_last_error()):find(path .. ': the ' .. tonumber(pos.offset)
        .. ' bytes before the saved position (line 7) are not the ones read then', 1, true))
      -- unchecked, it goes on where it was
      r = open(path)
      assert.equal(0, C.fl_reader_seek(r, pos, false))
      assert.equal(1, C.fl_reader_next(r, t, len))
      assert.equal(doc7, ffi.string(t[0], len[0]))
      -- cut below the position
      path = place(('%s/r%s.jsonl'):format(tmp, ext:gsub('%.', '_')), text:sub(1, tonumber(pos.offset) - 3), ext)
      r = open(path)
      assert.not_equal(0, C.fl_reader_seek(r, pos, true))
      assert.truthy(ffi.string(C.fl_last_error()):find(path .. ': the file now holds ' .. (tonumber(pos.offset) - 3)
        .. ' bytes', 1, true), ffi.string(C.fl_last_error()))
      r = open(path)
      assert.equal(0, C.fl_reader_seek(r, pos, false))
      assert.equal(0, C.fl_reader_next(r, t, len)) -- at its end
    end
    -- unchecked, an offset inside a line goes on at the next line, never half a line
    local path = place(tmp .. '/shifted.jsonl', '{"text": "a longer first line now"}\n' .. text:sub(1), '')
    local r = open(path)
    local pos = ffi.new('fl_doc_position', { offset = 10, index = 0, line = 1 })
    assert.equal(0, C.fl_reader_seek(r, pos, false))
    assert.equal(1, C.fl_reader_next(r, t, len))
    local first = text:match('"text": "([^"]*)"')
    assert.equal(first, ffi.string(t[0], len[0]))
  end)
end)

describe('token shards and text pairs', function()
  local tokens = require 'fsdp.data.tokens'
  local pairs_data = require 'fsdp.data.pairs'

  it('record their files: a shard removed or rewritten (same size) is refused, continue goes on', function()
    local dir = tmp .. '/shards'
    sh('mkdir -p ' .. dir)
    local function shard(k, first)
      local ids = {}
      for i = 1, 400 do ids[i] = i % 50 end
      ids[1] = first or k
      local t = fsdp.tensor(ids, { dtype = 'i64' })
      tokens.write_shard(('%s/train-%05d.safetensors'):format(dir, k), t, { vocab_size = 64, eos_id = 63 })
    end
    for k = 0, 2 do shard(k) end
    local function open(opts)
      local o = { seq_len = 8, batch_size = 2, rank = 0, world_size = 1 }
      for k, v in pairs(opts or {}) do o[k] = v end
      return tokens.open(dir, o)
    end
    local ds = open()
    for _ = 1, 3 do ds:next() end
    local st = ds:state()
    assert.equal(3, #st.shards)
    local want = table.concat(ds:next():view({ -1 }):totable(), ',')
    local r = open()
    r:load_state(st)
    assert.equal(want, table.concat(r:next():view({ -1 }):totable(), ','))
    shard(1, 9) -- same size, another first token
    raises(function() open():load_state(st) end, dir .. '/train-00001.safetensors: its content changed since the '
      .. 'data position was saved (fingerprint xxh3-64:')
    r = open({ data_changed = 'continue' })
    local out = testing.capture_stdout(function() r:load_state(st) end)
    assert.truthy(out:find('train-00001.safetensors: its content changed', 1, true), out)
    assert.truthy(out:find('going on with it as it is', 1, true), out)
    shard(1) -- as it was
    open():load_state(st)
    os.remove(dir .. '/train-00002.safetensors')
    raises(function() open():load_state(st) end, dir .. '/train-00002.safetensors: removed since the data position '
      .. 'was saved (3 files then, 2 now); resume refused')
    r = open({ data_changed = 'continue' }) -- fewer sequences: the position is kept within the epoch
    out = testing.capture_stdout(function() r:load_state(st) end)
    assert.truthy(out:find('train-00002.safetensors: removed since', 1, true), out)
    r:next()
    -- rank 1's position holds the digest only
    local st1 = open({ rank = 1, world_size = 2 }):state()
    assert.is_nil(st1.shards)
    shard(2)
    raises(function() open({ rank = 1, world_size = 2 }):load_state(st1) end, dir .. ': its shards changed since '
      .. 'the data position was saved (2 then, 3 now')
  end)

  it('record the pairs file: another file under the name is refused, continue goes on', function()
    local file = tmp .. '/pairs.jsonl'
    local lines = {}
    for i = 1, 40 do lines[i] = ('{"source": "question %02d", "target": "answer %02d"}'):format(i, i) end
    write(file, table.concat(lines, '\n') .. '\n')
    local function open(opts)
      local o = { tokenizer = 'byte', source_len = 16, target_len = 8, batch_size = 4, rank = 0, world_size = 1 }
      for k, v in pairs(opts or {}) do o[k] = v end
      return pairs_data.open(file, o)
    end
    local ds = open()
    ds:next()
    local st = ds:state()
    local r = open()
    r:load_state(st)
    write(file, ((table.concat(lines, '\n') .. '\n'):gsub('answer 07', 'answer 70')))
    raises(function() open():load_state(st) end, file .. ': its content changed since the data position was saved')
    write(file, table.concat(lines, '\n', 1, 30) .. '\n')
    raises(function() open():load_state(st) end, file .. ': now ')
    r = open({ data_changed = 'continue' })
    local out = testing.capture_stdout(function() r:load_state(st) end)
    assert.truthy(out:find('(truncated or rewritten); going on with it as it is', 1, true), out)
    r:next()
  end)
end)

describe('the llama recipe on a raw corpus', function()
  it('stops a resume on changed data in one line with exit 1; --data_changed=continue goes on', function()
    local dir = fresh()
    local ck = tmp .. '/ck'
    local args = ('recipes/llama2_7b.lua --data=%s --num_layers=1 --hidden_width=16 --num_heads=2 --seq_len=32 '
      .. '--batch_size=4 --warmup_steps=1 --validation_freq=0 --checkpoint_dir=%s --checkpoint_freq=2 --log_every=1')
      :format(dir, ck)
    local rc, out, err = testing.run_exe(args .. ' --max_steps=2', 60)
    assert.equal(0, rc, out .. err)
    local at = require('fsdp.checkpointing.directory').read_index(ck .. '/step-000002').ranks[1].data
    assert.truthy(at.offset > 50, at.offset)
    -- a byte of the file being read, before the position
    local file = at.file_name
    local text = read(file)
    write(file, text:sub(1, 20) .. (text:sub(21, 21) == 'x' and 'y' or 'x') .. text:sub(22))
    rc, out, err = testing.run_exe(args .. ' --max_steps=4 --resume_from_checkpoint', 60)
    assert.equal(1, rc, out .. err)
    assert.equal(('fsdp-lua: %s: the %d bytes before the saved position (line %d) are not the ones read then: the '
      .. 'file changed in place since the position was saved; resume refused (--data_changed=continue goes on with '
      .. 'the data as it is)\n'):format(file, at.offset, at.line), err)
    assert.falsy(out:find('checkpoint: resumed', 1, true), out)
    rc, out, err = testing.run_exe(args .. ' --max_steps=4 --resume_from_checkpoint --data_changed=continue', 60)
    assert.equal(0, rc, out .. err)
    assert.truthy(out:find(('data: %s: the %d bytes before the saved position'):format(file, at.offset), 1, true), out)
    assert.truthy(out:find('going on with it as it is (--data_changed=continue)', 1, true), out)
    assert.truthy(out:find('Batch 4 ', 1, true), out)
    -- a file the run has not read yet, removed
    local other
    for k = 1, 3 do
      local f = ('%s/part-%d.jsonl'):format(dir, k)
      if f ~= file then other = f end
    end
    os.remove(other)
    rc, out, err = testing.run_exe(args .. ' --max_steps=6 --resume_from_checkpoint', 60)
    assert.equal(1, rc, out .. err)
    assert.equal(('fsdp-lua: %s: removed since the data position was saved (3 files then, 2 now); resume refused '
      .. '(--data_changed=continue goes on with the data as it is)\n'):format(other), err)
  end)
end)

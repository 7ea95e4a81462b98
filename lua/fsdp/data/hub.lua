-- fsdp.data.hub: the Hugging Face names the seed's sbatch passes
-- (--dataset=c4 --dataset_config_name=en, --tokenizer=OWNER/NAME) resolved
-- to files on this machine. Nothing is fetched: a name that is not there
-- is an error saying where it was looked for and the command that gets it.
--
--   Datasets: $FSDP_DATA/<dataset>/<config>/ (FSDP_DATA defaults to
--   ~/.cache/fsdp-lua/data), holding the shards as the hub names them:
--     $FSDP_DATA/c4/en/c4-train.00000-of-01024.json.gz ...      (training)
--     $FSDP_DATA/c4/en/c4-validation.00000-of-00008.json.gz ... (validation)
--   Tokenizers: a Hugging Face hub cache snapshot,
--     $HF_HUB_CACHE/models--OWNER--NAME/snapshots/<revision>/
--   (HF_HUB_CACHE defaults to $HF_HOME/hub, HF_HOME to
--   ~/.cache/huggingface), as `huggingface-cli download OWNER/NAME` leaves
--   it; refs/main names the revision, else any snapshot holding a
--   tokenizer file.
--
--   local hub = require 'fsdp.data.hub'
--   local d = hub.dataset('c4', 'en')     -- {train = glob, val = glob or nil, dir =}; error when absent
--   local dir = hub.tokenizer_dir('hf-internal-testing/llama-tokenizer')   -- or error
--   local dir = hub.model_dir('HuggingFaceTB/SmolLM2-135M@main')   -- --init_from's, or error
local files = require 'fsdp.io.files'
local quote = require 'fsdp.quote'
local corpus = require 'fsdp.data.corpus'
local tables = require 'fsdp.tables'

local M = {}

local function home() return os.getenv('HOME') or '.' end

-- Where datasets live: $FSDP_DATA, else ~/.cache/fsdp-lua/data.
function M.data_root()
  local v = os.getenv('FSDP_DATA')
  if v and v ~= '' then return v end
  return home() .. '/.cache/fsdp-lua/data'
end

-- The datasets this build knows by hub name: their directory under
-- data_root, default config, the shard names of each split, and how to
-- download them (text for the error message; never run here, but
-- copied into a shell: every word from a path or a name is quoted by
-- fsdp.quote).
M.DATASETS = {
  c4 = {
    hub = 'allenai/c4', default_config = 'en',
    train = 'c4-train.*.json.gz', val = 'c4-validation.*.json.gz',
    -- training and validation shards per config (allenai/c4's README)
    shards = { en = { 1024, 8 }, ['en.noblocklist'] = { 1024, 8 }, ['en.noclean'] = { 7168, 64 },
               realnewslike = { 512, 1 } },
    -- The command: the first 8 training shards (en: ~2.6 GB) and the first
    -- validation shard; more shards: widen the --include patterns.
    download = function(self, dir, config)
      local lines = {
        ('  huggingface-cli download allenai/c4 --repo-type dataset --local-dir %s \\'):format(
          quote.shell(files.dirname(dir))),
        ('      --include %s %s'):format(quote.shell(config .. '/c4-train.0000[0-7]-of-*.json.gz'),
          quote.shell(config .. '/c4-validation.00000-of-*.json.gz')),
      }
      local n = self.shards[config]
      if n then
        local name = ('c4-train.00000-of-%05d.json.gz'):format(n[1])
        lines[#lines + 1] = ('  or one shard at a time (%s: %d training shards, %d validation shards):'):format(config,
          n[1], n[2])
        lines[#lines + 1] = ('    curl -L --create-dirs -o %s \\'):format(quote.shell(dir .. '/' .. name))
        lines[#lines + 1] = ('        %s'):format(quote.shell(
          ('https://huggingface.co/datasets/allenai/c4/resolve/main/%s/%s'):format(config, name)))
      end
      return table.concat(lines, '\n')
    end,
  },
}
M.DATASETS['allenai/c4'] = M.DATASETS.c4

-- The dataset entry of a hub name, or nil.
function M.known(name) return M.DATASETS[name] end

-- The dataset names this build knows, sorted.
function M.names() return tables.sorted_keys(M.DATASETS) end
local function names_known() return table.concat(M.names(), ', ') end

local function dataset_dir(name, config)
  return files.join(files.join(M.data_root(), name:match('[^/]*$')), config)
end

-- The training glob of a known dataset in `config` (default: its own).
function M.train_glob(name, config)
  local d = M.DATASETS[name]
  if config == nil or config == '' then config = d.default_config end
  return files.join(dataset_dir(name, config), d.train)
end

-- The files of a glob (fsdp.data.corpus's listing), or an empty list.
local function matches(glob)
  local ok, list = pcall(corpus.files, glob)
  return ok and list or {}
end

-- The local files of dataset `name` (a hub name) in `config` (the entry's
-- default when nil or ''): {train = glob, val = glob (nil when there are
-- no validation shards), dir, config, ntrain, nval}. An unknown name or
-- missing training shards is an error naming the directory looked in and
-- how to get the files.
function M.dataset(name, config)
  local d = M.DATASETS[name]
  if not d then
    error(('%s is not a file, directory or glob, nor a Hugging Face dataset this build knows (%s: read from %s)')
      :format(name, names_known(), M.data_root()), 0)
  end
  if config == nil or config == '' then config = d.default_config end
  if config:find('[/%*%?%[]') or config == '..' then
    error(('dataset config %q: expected a name like %s'):format(config, d.default_config), 0)
  end
  local dir = dataset_dir(name, config)
  local train, val = files.join(dir, d.train), files.join(dir, d.val)
  local ntrain = #matches(train)
  if ntrain == 0 then
    error(('%s (config %s) is not on this machine: no %s in %s (the layout is $FSDP_DATA/%s/%s/, FSDP_DATA=%s). '
      .. 'Get the shards with:\n%s'):format(d.hub, config, d.train, dir, name:match('[^/]*$'), config, M.data_root(),
      d:download(dir, config)), 0)
  end
  local nval = #matches(val)
  return { train = train, val = nval > 0 and val or nil, dir = dir, config = config, ntrain = ntrain, nval = nval }
end

-- The Hugging Face hub cache: $HF_HUB_CACHE, $HF_HOME/hub, or
-- ~/.cache/huggingface/hub.
function M.hub_cache()
  local v = os.getenv('HF_HUB_CACHE')
  if v and v ~= '' then return v end
  v = os.getenv('HF_HOME')
  if v and v ~= '' then return v .. '/hub' end
  v = os.getenv('XDG_CACHE_HOME')
  return ((v and v ~= '') and v or home() .. '/.cache') .. '/huggingface/hub'
end

-- Does `spec` look like a hub model name (OWNER/NAME or
-- OWNER/NAME@REVISION, not a local path)? A name ending like a tokenizer
-- file (DIR/tokenizer.model, x/vocab.json) is a path that is missing, not
-- a model.
function M.is_model_name(spec)
  if type(spec) ~= 'string' or files.mode(spec) ~= nil then return false end
  local repo = spec:match('^([^@]*)@[%w._/-]+$') or spec
  return repo:match('^[%w][%w._-]*/[%w][%w._-]*$') ~= nil and not repo:match('%.model$')
    and not repo:match('%.json$')
end

-- [Note: the hub cache] huggingface_hub's layout, which transformers,
-- `hf download` and `huggingface-cli download` share:
--   <cache>/models--OWNER--NAME/refs/<branch or tag>   (a file: the commit hash)
--   <cache>/models--OWNER--NAME/snapshots/<hash>/...   (the files, symlinks into ../../blobs/)
-- <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else
-- ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub. A revision (name@REV) is a
-- branch or tag (refs/REV) or a commit hash (snapshots/REV); without one,
-- refs/main. Nothing here downloads: a missing snapshot is an error with
-- the command that fetches it.

-- The snapshot directory of hub repo `spec` (OWNER/NAME[@REVISION]) for
-- which holds(dir) is true, or nil; and the repo's cache directory, the
-- repo name and the revision asked for (nil: the default). Without a
-- revision and without refs/main, any snapshot that holds() (a cache
-- filled by a download of a commit).
function M.snapshot(spec, holds)
  local name, rev = spec:match('^([^@]*)@(.+)$')
  name = name or spec
  local owner, repo = name:match('^([^/]+)/([^/]+)$')
  local base = ('%s/models--%s--%s'):format(M.hub_cache(), owner or name, repo or '')
  if rev and (rev:find('%.%.') or rev:find('^/')) then return nil, base, name, rev end
  local function at(hash)
    local dir = hash and base .. '/snapshots/' .. hash
    if dir and not hash:find('/') and holds(dir) then return dir end
  end
  local ref = base .. '/refs/' .. (rev or 'main')
  if files.is_file(ref) then
    local dir = at((files.read(ref, 4096, 'a hub ref') or ''):match('%S+'))
    if dir then return dir, base, name, rev end
  end
  if rev then return at(rev), base, name, rev end
  if files.mode(base .. '/snapshots') == 'directory' then
    for _, hash in ipairs(files.list(base .. '/snapshots')) do
      if at(hash) then return at(hash), base, name end
    end
  end
  return nil, base, name
end

-- The snapshot directory of hub model `spec` (OWNER/NAME[@REVISION]):
-- one that holds a config.json; else an error of one line naming where
-- it looked and the download command.
function M.model_dir(spec)
  local dir, base, name, rev = M.snapshot(spec, function(d) return files.is_file(d .. '/config.json') end)
  if dir then return dir end
  local how = quote.shell(name) .. (rev and ' --revision ' .. quote.shell(rev) or '')
  error(('%s is not a local directory, and the Hugging Face cache holds no snapshot of it with a config.json '
    .. '(looked in %s/%s; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub): get it '
    .. 'with `hf download %s` (or `huggingface-cli download %s`)'):format(spec, base,
    rev and ('refs/%s and snapshots/%s'):format(rev, rev) or 'refs/main and snapshots/', how, how), 0)
end

-- The snapshot directory of hub model `name` that holds a tokenizer file,
-- or an error naming where it looked and the download command.
function M.tokenizer_dir(name)
  local dir, base, repo = M.snapshot(name, function(d)
    return files.is_file(d .. '/tokenizer.model') or files.is_file(d .. '/tokenizer.json')
  end)
  if dir then return dir end
  error(('%s is not a local file or directory, and the Hugging Face cache holds no tokenizer of it (looked in '
    .. '%s/snapshots/; the cache is $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub). Get it with:\n'
    .. '  huggingface-cli download %s tokenizer.model tokenizer.json tokenizer_config.json\n'
    .. '  (or pass the model directory or its tokenizer file)'):format(name, base, quote.shell(repo)), 0)
end

return M

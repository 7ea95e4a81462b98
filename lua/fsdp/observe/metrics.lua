-- fsdp.observe.metrics: the training log. One line per logged step in the seed's
-- format, extended with throughput, utilisation and memory; validation
-- loss and perplexity; a JSONL file of the same numbers; a progress bar on
-- a terminal.
--
--   local metrics = require 'fsdp.observe.metrics'
--   local log = metrics.Logger({ total_steps = 100, batch_size = 4, tokens_per_sample = 2048,
--                                flops_per_sample = 6 * N * 2048, peak_tflops = 989,
--                                metrics_file = 'logs/run.jsonl' })
--   log:step(step, { loss = loss:item(), lr = lr, dt = seconds, grad_norm = norm })
--   log:validation(step, metrics.evaluate(function(ids, t) return model:loss(ids, t) end, val:batches(8)))
--   log:close()
--
-- A step line reads
--   Batch 10 Loss: 2.3026, Speed: 41.20 samples/sec, lr: 3.000e-04, tokens/s: 5274, TFLOPS: 0.0123,
--   MFU: 1.23%, peak memory: 812.4 MiB, grad norm: 0.912
-- (one line; on a cuda device the memory part reads "cuda:0 memory:
-- allocated 512.0 MiB, reserved 640.0 MiB, peak 700.1 MiB", the caching
-- allocator's, and the JSONL record has memory_allocated_bytes and
-- memory_reserved_bytes beside peak_memory_bytes; MFU only with a
-- declared peak, grad norm only when given;
-- a step the non-finite guard skipped ends with "skipped (non-finite: no
-- update)" and its JSONL record has skipped = true).
-- A line reports the log interval: loss, speed, tokens/s, TFLOPS, MFU and
-- grad norm are averages over the steps since the previous line (time-
-- weighted for the rates), so they do not jump from step to step; the
-- JSONL file keeps every step's own values. --log_every=0 (the default
-- of the recipes that share metrics.options) is every 10 steps on a
-- terminal, where the progress bar stays readable between the lines, and
-- every step to a file, a pipe or under a launcher.
-- --tensorboard_dir=DIR also writes the numbers as TensorBoard scalars
-- (fsdp.tensorboard), and the run's configuration as a text summary.
-- A resumed run (Logger:resume) drops what the killed run wrote past the
-- resume step, from the JSONL file and the event files, so each step is
-- there once, and the JSONL time goes on from the last kept record.
-- Speed and tokens/s count the whole job (every rank's samples); TFLOPS
-- and MFU are per rank: the rank's training FLOPs per second against the
-- peak of one device (--peak_tflops, e.g. 989 for an H100 in bf16 dense).
-- Loss is the mean over ranks. Only rank 0 prints and writes the file;
-- with several ranks its lines start with "[rank 0] ". Output goes to a
-- terminal as a progress bar (redrawn in place, log lines scrolling above
-- it); to a file or pipe, or under a launcher, as plain lines.
-- FSDP_PROGRESS=0/1 overrides the detection. FSDP_DEBUG=INFO prints every rank's distributed setup at start.
-- With collectives (several ranks), a JSONL record also has what rank 0's
-- step moved: comm (by kind: calls, bytes, wait_s, busy_s), comm_bytes,
-- comm_wait_s, the seconds it blocked waiting for them (exposed
-- communication), and comm_busy_s, the seconds some collective was in
-- flight (the link's time, hidden or not); TensorBoard gets comm/mib,
-- comm/wait_s and comm/busy_s. With --comm_joined also comm_joined_s
-- (and joined_s by kind; comm/joined_s): the busy time counted from each
-- collective's last member's start, without waiting for late peers
-- (fsdp.observe.joined), and comm_skew_s, the waits for them summed.
-- Every write to the metrics file, the event files, a trace or a plot is
-- checked; a failure is one line at once, ends that output, and makes the
-- run exit with status 5 at the end, or stop after the step with
-- --on_output_error=stop ([Note: failed output writes] in
-- fsdp.observe.outputs).
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local clock = require 'fsdp.clock'
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local console = require 'fsdp.observe.console'
local outputs = require 'fsdp.observe.outputs'
local quote = require 'fsdp.quote'
local tensorboard = require 'fsdp.observe.tensorboard'
local profiler = require 'fsdp.observe.profiler'
local options = require 'fsdp.options'
local joined = require 'fsdp.observe.joined'
local plotter = require 'fsdp.observe.plot'
local mesh = require 'fsdp.mesh'
local tables = require 'fsdp.tables'
pcall(ffi.cdef, 'int isatty(int fd);')

local M = {}

local function stdout_is_terminal()
  local v = os.getenv('FSDP_PROGRESS')
  if v == '0' or v == '1' then return v == '1' end
  -- Under mpirun a rank's stdout is a pseudo-terminal that the launcher
  -- forwards line by line: a bar redrawn in place would only add noise.
  if fsdp.dist.launcher_rank() ~= nil then return false end
  return ffi.C.isatty(1) == 1
end

-- This machine's name, '?' when it has none (fsdp.io.files.hostname).
M.hostname = files.hostname
local hostname = M.hostname

-- The distributed setup of this rank, one line (FSDP_DEBUG=INFO prints it).
function M.dist_info()
  local dist = fsdp.dist
  local w = dist.world()
  return ('rank %d of %d, local rank %d of %d, node %d of %d, transport %s, world group %s, NCCL_DEBUG=%s, '
    .. 'machine %s'):format(dist.rank(), dist.world_size(), dist.local_rank(), dist.local_size(), dist.node(),
    dist.nodes(), dist.transport(), tostring(w), os.getenv('NCCL_DEBUG') or '(unset)',
    os.getenv('HOSTNAME') or hostname())
end

-- Whether FSDP_DEBUG asks for verbose distributed information.
function M.debug_enabled()
  local v = (os.getenv('FSDP_DEBUG') or ''):upper()
  return v == 'INFO' or v == 'DETAIL'
end

-- Mean over batches (and over ranks) of loss_fn(batch...), without
-- gradients. `batches` is an iterator such as dataset:batches(n).
function M.evaluate(loss_fn, batches)
  local sum, n = 0, 0
  fsdp.no_grad(function()
    for a, b, c in batches do
      sum, n = sum + loss_fn(a, b, c):item(), n + 1
    end
  end)
  local t = fsdp.tensor({ sum, n }, { dtype = 'f64' })
  if fsdp.dist.world_size() > 1 then fsdp.dist.all_reduce(t) end
  local total, count = t:get(0), t:get(1)
  if count == 0 then core.fail('fsdp.metrics: evaluate: the validation data yielded no batches') end
  return total / count
end

-- The options every training recipe shares (fsdp.options specs):
-- metrics.options(own) adds them to a recipe's own (its own win on a
-- clash, e.g. another --log_every default).
M.OPTIONS = {
  metrics_file = { '', 'write every step\'s numbers to this JSONL file (a resumed run drops the lines past its '
                       .. 'resume step; an existing file of another run: see --metrics_file_mode)', output = 'file',
                   check = function(v, cfg) return M.existing_file_problem(v, cfg) end },
  metrics_file_mode = { 'new', 'with an existing non-empty --metrics_file: new (refuse it, unless '
                               .. '--resume_from_checkpoint continues its run), append (this run\'s records after its '
                               .. 'lines) or overwrite (empty it first)', one_of = { 'new', 'append', 'overwrite' } },
  tensorboard_dir = { '', 'write TensorBoard event files (scalars and the configuration) into this directory',
                      output = 'dir' },
  plot = { false, 'at the end, draw the --metrics_file curves (loss, validation loss, lr, tokens/s, memory) '
                  .. 'into a PNG and an SVG beside it (tools/plot.lua; gnuplot)', needs = 'metrics_file',
            check = function(v)
              -- found missing at start, not after the whole run
              if v and select(2, quote.capture({ 'gnuplot', '--version' })) ~= 0 then
                return 'needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)'
              end
            end },
  profile_steps = { '', 'A:B: record a trace of steps A to B (Chrome/Perfetto JSON, one file per rank in '
                       .. '--profile_dir; tools/trace_summary.lua reads them)', check = function(v, cfg)
    if v == '' then return nil end
    local a, b = v:match('^(%d+):(%d+)$')
    if not a or tonumber(a) < 1 or tonumber(b) < tonumber(a) then
      return ('must be A:B with 1 <= A <= B (steps), got %s'):format(v)
    end
    if type(cfg.max_steps) == 'number' and tonumber(a) > cfg.max_steps then
      return ('(%s) starts after the last step (--max_steps=%d): nothing would be traced'):format(v, cfg.max_steps)
    end
  end },
  profile_dir = { 'profile', 'where --profile_steps writes trace-rank<r>.json',
                  check = function(v, cfg)
                    -- created and probed at start when there will be traces
                    if (cfg.profile_steps or '') == '' then return nil end
                    local why = options.output_problem('profile_dir', 'dir', v)
                    return why and (': ' .. why)
                  end },
  comm_joined = { false, 'also measure each step\'s communication from the moment each collective\'s last member '
                         .. 'joined it (comm_joined_s, comm_skew_s in the metrics; two small all-gathers a step)' },
  log_every = { 0, 'print a log line (averages since the previous one) every N steps; 0: every 10 on a terminal, '
                   .. 'under the progress bar, else every step', int = true, min = 0 },
  on_output_error = outputs.OPTION,
}

function M.options(own) return options.merge(M.OPTIONS, own) end

-- [Note: a metrics file of another run]
-- A new run's records appended to an old run's file read as one run whose
-- steps start over (tools/plot.lua, TensorBoard exports and sweeps read
-- the stale lines), so an existing non-empty --metrics_file is refused at
-- the option checks unless --resume_from_checkpoint continues the run that
-- wrote it (Logger:resume then drops its lines past the resumed step) or
-- --metrics_file_mode says append or overwrite (the Logger empties it).
function M.existing_file_problem(path, cfg)
  if path == '' or (cfg.metrics_file_mode or 'new') ~= 'new' or cfg.resume_from_checkpoint then return nil end
  local lfs = require 'lfs'
  if lfs.attributes(path, 'mode') ~= 'file' or (lfs.attributes(path, 'size') or 0) == 0 then return nil end
  return ('(%s) holds the records of an earlier run: give --metrics_file_mode=append or --metrics_file_mode=overwrite, '
    .. '--resume_from_checkpoint to continue that run, or another file'):format(path)
end

-- The steps between two printed lines of a terminal's log by default.
M.TERMINAL_LOG_EVERY = 10

local Logger = {}
Logger.__index = Logger

local function number_opt(opts, key, default)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= 'number' or v < 0 then
    core.fail(('fsdp.metrics: option %s must be a number >= 0, got %s'):format(key, tostring(v)))
  end
  return v
end

-- opts: total_steps, batch_size (per rank), tokens_per_sample (0: no
-- tokens/s), flops_per_sample (training FLOPs; 0: no TFLOPS), peak_tflops
-- (0: no MFU), metrics_file ('' or nil: none), metrics_file_mode ('overwrite' empties
-- it first; default: config's), tensorboard_dir ('' or
-- nil: none), config (a recipe's cfg: the TensorBoard text summary),
-- plot (true: close() draws the metrics file's curves, fsdp.plot),
-- profile_steps ('A:B': begin_step(A) starts a trace, fsdp.profiler, and
-- the step after B or close() writes it to profile_dir/trace-rank<r>.json;
-- model names the module spans),
-- comm_joined (true: every rank's step also gathers the ranks'
-- collective logs, fsdp.observe.joined, for comm_joined_s),
-- log_every (1; 0: M.TERMINAL_LOG_EVERY with a progress bar, else 1),
-- device ('cpu', for peak memory), progress (nil: auto), out
-- (io.stdout), rank/world_size (default fsdp.dist's), on_output_error
-- ('continue' or 'stop'; default: config's, else 'continue') and
-- checkpoint_dir (default: config's), for failed writes
-- (fsdp.observe.outputs), err (io.stderr, where their lines go).
-- The data-parallel ranks a logger's samples come from: its world_size
-- option when given, else fsdp.mesh's.
local function data_parallel_ranks(self)
  return self.data_parallel or mesh.data_parallel_size()
end

function M.Logger(opts)
  opts = opts or {}
  local self = setmetatable({}, Logger)
  local dist = fsdp.dist
  self.rank = opts.rank or dist.rank()
  self.world_size = opts.world_size or dist.world_size()
  self.data_parallel = opts.world_size
  self.total_steps = number_opt(opts, 'total_steps', 0)
  self.batch_size = number_opt(opts, 'batch_size', 1)
  self.tokens_per_sample = number_opt(opts, 'tokens_per_sample', 0)
  self.flops_per_sample = number_opt(opts, 'flops_per_sample', 0)
  self.peak_tflops = number_opt(opts, 'peak_tflops', 0)
  self.device = opts.device or 'cpu'
  -- Each record of a CPU run names the ISA level its kernels ran at.
  self.cpu_isa = self.device == 'cpu' and fsdp.cpu_isa().level or nil
  self.out = opts.out or io.stdout
  self.prefix = self.world_size > 1 and ('[rank %d] '):format(self.rank) or ''
  self.leader = self.rank == 0
  if opts.progress == nil then self.progress = self.leader and stdout_is_terminal() and self.out == io.stdout
  else self.progress = opts.progress and self.leader end
  local every = number_opt(opts, 'log_every', 1)
  if every == 0 then every = self.progress and M.TERMINAL_LOG_EVERY or 1 end
  self.log_every = math.max(1, every)
  self.start, self.time_offset = clock.now(), 0
  local config = opts.config or {}
  self.outputs = outputs.Outputs({ policy = opts.on_output_error or config.on_output_error,
    checkpoint_dir = opts.checkpoint_dir or config.checkpoint_dir, rank = self.rank, world_size = self.world_size,
    err = opts.err })
  self.comm_prev = dist.collective_stats()
  if opts.comm_joined and self.world_size > 1 then
    dist.collective_log() -- what came before the first step is no step's
    self.joined_pending = {}
  end
  self:_reset_interval()
  if self.leader and opts.metrics_file and opts.metrics_file ~= '' then
    local usable, why = files.check_output(opts.metrics_file) -- (a FIFO would block: refused)
    if not usable then core.fail(('fsdp.metrics: cannot open metrics file %s: %s'):format(opts.metrics_file, why)) end
    -- --metrics_file_mode=overwrite ([Note: a metrics file of another run])
    local mode = opts.metrics_file_mode or (type(opts.config) == 'table' and opts.config.metrics_file_mode)
    if mode == 'overwrite' then
      local f = io.open(opts.metrics_file, 'w')
      if f then f:close() end
    end
    local ok, f = pcall(files.appender, opts.metrics_file)
    if not ok then core.fail(('fsdp.metrics: cannot open metrics file %s'):format(tostring(f):gsub('^[^%s:]+:%d+: ', ''))) end
    self.file, self.file_path = f, opts.metrics_file
  end
  self.plot = opts.plot and self.file_path
  if opts.profile_steps and opts.profile_steps ~= '' then
    local a, b = opts.profile_steps:match('^(%d+):(%d+)$')
    if not a then core.fail(('fsdp.metrics: profile_steps must be A:B, got %s'):format(opts.profile_steps)) end
    self.profile = { first = tonumber(a), last = tonumber(b), model = opts.model,
                     path = files.join(opts.profile_dir or 'profile', ('trace-rank%d.json'):format(self.rank)) }
    -- found unwritable now, not after the steps before A
    files.mkdir_p(opts.profile_dir or 'profile', '--profile_dir')
  end
  if self.leader and opts.tensorboard_dir and opts.tensorboard_dir ~= '' then
    self.tb_dir = opts.tensorboard_dir
    self:_tb(0, function()
      self.tb = tensorboard.Writer(opts.tensorboard_dir)
      if opts.config then self.tb:text('config', M.config_markdown(opts.config), 0) end
    end)
  end
  if M.debug_enabled() then
    -- every rank speaks, in rank order
    for r = 0, self.world_size - 1 do
      if r == self.rank then
        self.out:write(('[rank %d] fsdp: %s\n'):format(self.rank, M.dist_info()))
        self.out:flush()
      end
      if self.world_size > 1 then dist.barrier() end
    end
  end
  return self
end

-- Call at the start of every step: starts and ends the trace of
-- --profile_steps, and marks the step in it (its span runs to the next
-- step's start: validation and checkpoints included).
function Logger:begin_step(step)
  local p = self.profile
  if not p then return end
  if profiler.on then
    profiler.span(('step %d'):format(p.step), 'step', p.step_t0)
    if step > p.last then self:_end_profile() end
  end
  -- (a run resumed inside A:B traces the rest of it)
  if step >= p.first and step <= p.last and not p.started then
    p.started = true
    profiler.start({ model = p.model, device = self.device, rank = self.rank })
  end
  if profiler.on then p.step_t0, p.step = profiler.now(), step end
end

function Logger:_end_profile()
  if not profiler.on then return end
  local n
  if not self.outputs:write('profile_dir', self.profile.path, nil, function() n = profiler.stop(self.profile.path) end) then
    return
  end
  local where = self.world_size > 1 and files.join(files.dirname(self.profile.path), 'trace-rank*.json')
    or self.profile.path
  self:print('profile: wrote %s (steps %d-%d, %d events%s)', where, self.profile.first, self.profile.last, n,
    self.world_size > 1 and ' on rank 0' or '')
end

-- The configuration as a markdown table (TensorBoard's text tab).
function M.config_markdown(cfg)
  local keys = tables.sorted_keys(cfg)
  local rows = { '| option | value |', '|---|---|' }
  for _, k in ipairs(keys) do
    rows[#rows + 1] = ('| %s | %s |'):format(k, (tostring(cfg[k]):gsub('|', '\\|')))
  end
  return table.concat(rows, '\n')
end

function Logger:_reset_interval()
  self.acc = { steps = 0, loss = 0, losses = 0, dt = 0, grad_norm = 0, norms = 0 }
end

-- A resumed run continues at step `step` (the loop's next step is step +
-- 1): records past it that a killed run wrote are dropped from the metrics
-- file (the file replaced atomically; a torn last line goes too) and from
-- the TensorBoard directory's earlier event files, and the time of the
-- JSONL records goes on from the last one kept. Rank 0 does the work;
-- every rank may call it.
function Logger:resume(step)
  if self.profile and self.profile.last <= step then
    self:print('profile: steps %d-%d were run before the resume at step %d: no trace this time', self.profile.first,
      self.profile.last, step)
  end
  if not self.leader then return end
  if self.file then
    self.outputs:write('metrics_file', self.file_path, step, function() self:_resume_metrics(step) end)
    if not self.outputs:ok('metrics_file') then self:_drop_file() end
  end
  if self.tb_dir and self.tb then
    local n = 0
    self:_tb(step, function() n = tensorboard.truncate_after(self.tb_dir, step) end)
    if n > 0 then
      self:print('metrics: %s: dropped %d TensorBoard event%s past step %d', self.tb_dir, n, n == 1 and '' or 's', step)
    end
  end
end

-- Logger:resume's part for the metrics file (raises on a failed write).
function Logger:_resume_metrics(step)
  self.file:close()
  self.file = nil
  local text = files.read(self.file_path, files.LIMITS.log[1], 'a metrics file') or ''
  local kept, dropped, last_time = {}, 0, 0
  for line in text:gmatch('[^\n]+') do
    local ok, r = pcall(json.decode, line)
    if ok and type(r) == 'table' and type(r.step) == 'number' and r.step <= step then
      kept[#kept + 1] = line
      if type(r.time) == 'number' then last_time = math.max(last_time, r.time) end
    else
      dropped = dropped + 1
    end
  end
  if dropped > 0 then
    files.write_atomic(self.file_path, #kept > 0 and table.concat(kept, '\n') .. '\n' or '')
  end
  self.file = files.appender(self.file_path)
  self.time_offset, self.start = last_time, clock.now()
  if dropped > 0 then
    self:print('metrics: %s: dropped %d record%s past step %d (the resumed run writes them again)',
      self.file_path, dropped, dropped == 1 and '' or 's', step)
  end
end

-- No more writes to the metrics file (one failed): closed, its own close
-- error (the same disk) left unsaid.
function Logger:_drop_file()
  if self.file then pcall(self.file.close, self.file) end
  self.file = nil
end

-- fn() writes the TensorBoard files (at `step`); after a failure no more
-- events are written (the file ends with its last whole record).
function Logger:_tb(step, fn)
  if not self.outputs:write('tensorboard_dir', self.tb_dir, step, fn) then
    if self.tb then pcall(self.tb.close, self.tb) end
    self.tb = nil
  end
end

-- Print a line (rank 0 only, prefixed when there are several ranks),
-- keeping the progress bar below it.
function Logger:print(fmt, ...)
  if not self.leader then return end
  local line = select('#', ...) > 0 and fmt:format(...) or fmt
  if self.bar_drawn then self.out:write('\r\27[K') end
  self.out:write(self.prefix, line, '\n')
  if self.bar_drawn then self:_draw_bar() end
  self.out:flush()
end

-- Print from every rank (prefixed by its rank when there are several).
function Logger:print_all(fmt, ...)
  local line = select('#', ...) > 0 and fmt:format(...) or fmt
  self.out:write(self.prefix, line, '\n')
  self.out:flush()
end

function Logger:_write(record)
  if not self.file then return end
  record.time = self.time_offset + clock.now() - self.start
  -- exact numbers (a resumed run's losses are compared bit for bit); NaN or
  -- infinite ones as null, keeping every line valid JSON; one record, one
  -- checked write, so the file never ends inside a record
  local line = json.encode_line(record) .. '\n'
  if not self.outputs:write('metrics_file', self.file_path, record.step, self.file.write, self.file, line) then
    self:_drop_file()
  end
end

local function clock_text(s)
  s = math.max(0, math.floor(s + 0.5))
  return ('%d:%02d:%02d'):format(math.floor(s / 3600), math.floor(s / 60) % 60, s % 60)
end

function Logger:_draw_bar()
  local step, total = self.last_step or 0, self.total_steps
  local width = 30
  local frac = total > 0 and math.min(1, step / total) or 0
  local fill = math.floor(frac * width + 0.5)
  local elapsed = clock.now() - self.start
  local eta = step > 0 and total > step and elapsed / step * (total - step) or 0
  self.out:write(('\r[%s%s] %d/%d %3.0f%% loss %.4f elapsed %s eta %s'):format(('#'):rep(fill),
    ('.'):rep(width - fill), step, total, frac * 100, self.last_loss or 0, clock_text(elapsed), clock_text(eta)))
  if not self.bar_drawn then
    -- lines printed by others (fsdp.console) go above the bar too
    console.set_bar({ clear = function() self.out:write('\r\27[K') end, draw = function() self:_draw_bar() end })
  end
  self.bar_drawn = true
end

-- Record step `step` (1-based): s = {loss =, lr =, dt = seconds of the
-- step, grad_norm = (optional), epoch = (optional), skipped = true when
-- the non-finite guard dropped the step (fsdp.nonfinite), reduced = true
-- when the loss is already the mean over ranks}. Every rank calls it (the
-- loss is averaged over ranks unless reduced); rank 0 prints every
-- log_every steps, on the last and on a skipped one, and writes the
-- metrics file.
-- This rank's collectives since the previous step (fsdp.dist.collective_stats):
-- by kind, and the bytes, exposed wait and busy time of all of them (busy:
-- some collective in flight, overlapping ones counted once); nil when none
-- moved data. (Logging's own mean-loss all_reduce falls in the next step.)
function Logger:_comm_since_last()
  local now, prev = fsdp.dist.collective_stats(), self.comm_prev
  self.comm_prev = now
  local per, bytes, wait = nil, 0, 0
  for kind, c in pairs(now) do
    local calls = c.calls - prev[kind].calls
    if calls > 0 and kind ~= 'any' then
      per = per or {}
      per[kind] = { calls = calls, bytes = c.bytes - prev[kind].bytes, wait_s = c.wait_s - prev[kind].wait_s,
                    busy_s = c.busy_s - prev[kind].busy_s }
      bytes, wait = bytes + per[kind].bytes, wait + per[kind].wait_s
    end
  end
  if per then return per, bytes, wait, now.any.busy_s - prev.any.busy_s end
end

-- With comm_joined: the step's time from each collective's last member
-- on (fsdp.observe.joined; collective over the world), into comm.
function Logger:_comm_joined(comm)
  local log = self.joined_pending
  for _, rec in ipairs(fsdp.dist.collective_log()) do log[#log + 1] = rec end
  local t
  t, self.joined_pending = joined.seconds(log)
  for kind, c in pairs(comm or {}) do c.joined_s = t[kind] end
  return t.any, t.skew
end

function Logger:step(step, s)
  local comm, comm_bytes, comm_wait, comm_busy = self:_comm_since_last()
  local comm_joined, comm_skew
  if self.joined_pending then
    comm_joined, comm_skew = self:_comm_joined(comm)
    self.comm_prev = fsdp.dist.collective_stats() -- its gathers are no step's
  end
  local loss = s.loss
  if self.world_size > 1 and not s.reduced then
    loss = fsdp.dist.all_reduce(fsdp.tensor({ loss }, { dtype = 'f64' }), { op = 'avg' }):item()
  end
  if not self.leader then
    self.outputs:check_stop(step)
    return
  end
  local dt = s.dt or 0
  -- (the data-parallel ranks: a TP group trains on one batch, [Note:
  -- data-parallel rank and size] in fsdp/mesh.lua)
  local samples = self.batch_size * data_parallel_ranks(self)
  -- rates over `seconds` for `steps` steps
  local function rates(steps, seconds)
    local sps = seconds > 0 and samples * steps / seconds or 0
    local tflops = seconds > 0 and self.flops_per_sample * self.batch_size * steps / seconds / 1e12 or 0
    return sps, sps * self.tokens_per_sample, tflops, self.peak_tflops > 0 and tflops / self.peak_tflops or nil
  end
  local sps, tps, tflops, mfu = rates(1, dt)
  local mem = fsdp.memory_stats(self.device)
  local peak = mem.peak
  self.last_step, self.last_loss = step, loss
  self:_write({ type = 'train', step = step, loss = loss, lr = s.lr, samples_per_sec = sps,
    tokens_per_sec = self.tokens_per_sample > 0 and tps or nil, tflops_per_rank = tflops, mfu = mfu,
    peak_memory_bytes = peak, memory_allocated_bytes = mem.in_use, memory_reserved_bytes = mem.reserved,
    device = self.device, cpu_isa = self.cpu_isa, grad_norm = s.grad_norm, epoch = s.epoch, step_time = dt,
    skipped = s.skipped or nil, comm = comm, comm_bytes = comm_bytes, comm_wait_s = comm_wait,
    comm_busy_s = comm_busy, comm_joined_s = comm_joined, comm_skew_s = comm_skew })
  if self.tb then
    local MiB = 2 ^ 20
    self:_tb(step, function() self.tb:scalars(step, {
      { 'train/loss', loss }, { 'train/lr', s.lr }, { 'train/grad_norm', s.grad_norm },
      { 'perf/samples_per_sec', sps }, { 'perf/tokens_per_sec', self.tokens_per_sample > 0 and tps or nil },
      { 'perf/tflops_per_rank', self.flops_per_sample > 0 and tflops or nil }, { 'perf/mfu', mfu },
      { 'perf/step_time', dt }, { 'memory/peak_mib', peak / MiB },
      { 'memory/allocated_mib', mem.in_use / MiB },
      { 'memory/reserved_mib', self.device:match('^cuda') and mem.reserved / MiB or nil },
      { 'comm/mib', comm_bytes and comm_bytes / MiB }, { 'comm/wait_s', comm_wait }, { 'comm/busy_s', comm_busy },
      { 'comm/joined_s', comm_joined },
    }) end)
  end
  -- the interval since the last line; a skipped step's loss (non-finite)
  -- stays out of the mean
  local acc = self.acc
  acc.steps, acc.dt = acc.steps + 1, acc.dt + dt
  if not s.skipped and loss == loss then acc.loss, acc.losses = acc.loss + loss, acc.losses + 1 end
  if s.grad_norm then acc.grad_norm, acc.norms = acc.grad_norm + s.grad_norm, acc.norms + 1 end
  if step % self.log_every == 0 or step == self.total_steps or s.skipped then
    if not s.skipped and acc.losses > 0 then loss = acc.loss / acc.losses end
    sps, tps, tflops, mfu = rates(acc.steps, acc.dt)
    local norm = s.grad_norm and acc.norms > 0 and acc.grad_norm / acc.norms or s.grad_norm
    self:_reset_interval()
    local parts = { ('Batch %d Loss: %.4f, Speed: %.2f samples/sec, lr: %.3e'):format(step, loss, sps, s.lr or 0) }
    if self.tokens_per_sample > 0 then parts[#parts + 1] = ('tokens/s: %.0f'):format(tps) end
    if self.flops_per_sample > 0 then parts[#parts + 1] = ('TFLOPS: %.4g'):format(tflops) end
    if mfu then parts[#parts + 1] = ('MFU: %.2f%%'):format(mfu * 100) end
    if self.device:match('^cuda') then
      -- The caching allocator's view: tensors alive now, what it holds
      -- from the device (cached blocks too), the high-water mark.
      parts[#parts + 1] = ('%s memory: allocated %.1f MiB, reserved %.1f MiB, peak %.1f MiB'):format(self.device,
        mem.in_use / 2 ^ 20, mem.reserved / 2 ^ 20, peak / 2 ^ 20)
    else
      parts[#parts + 1] = ('peak memory: %.1f MiB'):format(peak / 2 ^ 20)
    end
    if norm then parts[#parts + 1] = ('grad norm: %.3f'):format(norm) end
    if s.skipped then parts[#parts + 1] = 'skipped (non-finite: no update)' end
    self:print(table.concat(parts, ', '))
  elseif self.progress then
    self:_draw_bar()
    self.out:flush()
  end
  self.outputs:check_stop(step)
end

-- Record a validation loss (already averaged over ranks, e.g. by
-- metrics.evaluate) at training step `step`.
function Logger:validation(step, loss)
  if not self.leader then return loss end
  local ppl = math.exp(loss)
  self:_write({ type = 'val', step = step, loss = loss, perplexity = ppl })
  if self.tb then self:_tb(step, function() self.tb:scalars(step, { { 'val/loss', loss }, { 'val/perplexity', ppl } }) end) end
  self:print('Validation at batch %d: loss %.4f, perplexity %.3f', step, loss, ppl)
  return loss
end

-- End the bar's line and close the metrics and event files (and a trace
-- still being recorded: --profile_steps past the last step), then, on
-- every rank together, report the outputs any rank lost (one line on rank
-- 0; the process will exit with status 5: fsdp.observe.outputs). Returns
-- that list (empty when nothing was lost).
function Logger:close()
  if self.profile and profiler.on then
    profiler.span(('step %d'):format(self.profile.step), 'step', self.profile.step_t0)
    self:_end_profile()
  end
  if self.bar_drawn then
    console.set_bar(nil)
    self.out:write('\r\27[K')
    self.out:flush()
    self.bar_drawn = false
  end
  if self.tb then
    local tb = self.tb
    self.tb = nil
    self.outputs:write('tensorboard_dir', self.tb_dir, nil, tb.close, tb)
  end
  if self.file then
    local f = self.file
    self.file = nil
    self.outputs:write('metrics_file', self.file_path, nil, f.close, f)
  end
  -- The curves of a metrics file that lost records would mislead: none.
  if self.plot and self.outputs:ok('metrics_file') then
    -- the run's results are saved already: a failed plot is said at once
    -- and in the exit status, but does not stop what follows (checkpoints,
    -- export)
    local base = self.plot:gsub('%.jsonl$', '')
    local out
    if self.outputs:write('plot', base .. '.png', nil, function()
      out = plotter.draw({ self.plot }, base)
    end) then
      self:print('plot: wrote %s and %s', out.png, out.svg)
    end
  end
  return self.outputs:close()
end

return M

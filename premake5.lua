-- premake5.lua: the build of fsdp-lua.
--
-- Generates Makefiles under build/ with premake5 where installed, or with
-- Debian's premake4 (`premake4 --file=premake5.lua gmake`) through the small
-- shim below. Produces:
--   build/lib/libfsdp.so   the core (every public symbol prefixed fl_)
--   build/lib/libfsdp_mpi.so  the Open MPI backend, dlopen()ed by the core
--                          only under a launcher (built when MPI is found)
--   build/lib/libfsdp_cuda.so the CUDA backend (core/cuda, with cudart,
--                          cuBLASLt, cuDNN; NCCL opened by it), dlopen()ed
--                          by the core on the first use of a cuda device
--                          (built when nvcc is found; not in asan)
--   build/bin/fsdp-lua     the LuaJIT host (static LuaJIT, -rdynamic)
--   build/bin/fsdp-ctest   the C test suite (cmocka)
--   build/bin/fsdp-embed   the embedding example (tests/embed)
-- Configurations: release (default), debug, asan (AddressSanitizer and
-- UndefinedBehaviorSanitizer; outputs under build/asan/), cudasim (the CUDA
-- backend with its kernels run on the CPU by tests/cudasim, for testing
-- the GPU code on machines without a GPU; outputs under build/cudasim/;
-- needs the CUDA headers; built through mk/cuda.mk, so under premake4
-- only: the premake5 rules below cover release/debug).
--
-- Two things premake4 cannot express are done by make fragments appended to
-- the generated makefiles: the FFI declarations generated from
-- core/include/fsdp.h (mk/cdef.mk, the core's), and the CUDA sources
-- compiled by nvcc, or for cudasim by the C++ compiler (mk/cuda.mk, the
-- CUDA plugin's).

local IS_PREMAKE4 = _PREMAKE_VERSION:sub(1, 1) == "4"

---------------------------------------------------------------------------
-- premake4 shim: premake5 spellings mapped onto premake4 calls.
---------------------------------------------------------------------------
if IS_PREMAKE4 then
  workspace = solution
  function filter(spec)
    if type(spec) == "table" then spec = spec[1] end
    if spec == nil or spec == "" then return configuration {} end
    local cfgname = spec:match("^configurations:(.+)$")
    assert(cfgname, "premake4 shim: unsupported filter '" .. spec .. "'")
    return configuration(cfgname)
  end
  function symbols(v) if v == "On" then flags { "Symbols" } end end
  function optimize(v)
    if v == "On" or v == "Speed" then buildoptions { "-O2" }
    elseif v == "Debug" then buildoptions { "-Og" } end
  end
  function cdialect(v) buildoptions { "-std=" .. v:lower() } end
end

---------------------------------------------------------------------------
-- Options and detection
---------------------------------------------------------------------------
newoption { trigger = "no-cuda", description = "Build without the CUDA backend even if nvcc is found" }

local function shell(cmd)
  local f = io.popen(cmd .. " 2>/dev/null")
  local out = f:read("*a") or ""
  f:close()
  return (out:gsub("%s+$", ""))
end

-- The directories pkg-config gives for a package, without their -I/-L.
function pkg_config_dirs(flag, package)
  local dirs = {}
  for word in shell("pkg-config " .. flag .. " " .. package):gmatch("%S+") do
    dirs[#dirs + 1] = word:gsub("^%-[IL]", "")
  end
  return dirs
end

local function find_nvcc()
  if _OPTIONS["no-cuda"] then return nil end
  local env = os.getenv("NVCC")
  if env and env ~= "" then return env end
  local onpath = shell("command -v nvcc")
  if onpath ~= "" then return onpath end
  if os.isfile("/usr/local/cuda/bin/nvcc") then return "/usr/local/cuda/bin/nvcc" end
  return nil
end

-- Open MPI's include and library directories (pkg-config, else mpicc's
-- --showme), or nil when MPI's development files are missing: the core then
-- builds without the mpi backend and runs as one rank.
local function find_mpi()
  local inc = pkg_config_dirs("--cflags-only-I", "ompi")
  local lib = pkg_config_dirs("--libs-only-L", "ompi")
  if #inc == 0 then
    for dir in shell("mpicc --showme:incdirs"):gmatch("%S+") do inc[#inc + 1] = dir end
    for dir in shell("mpicc --showme:libdirs"):gmatch("%S+") do lib[#lib + 1] = dir end
  end
  for _, dir in ipairs(inc) do
    if os.isfile(dir .. "/mpi.h") then return { includedirs = inc, libdirs = lib } end
  end
  return nil
end

local MPI = find_mpi()

-- OpenBLAS: Debian's OpenMP build (libopenblas0-openmp) where installed.
-- The default pthread build keeps its threads spinning on sched_yield
-- after each product, taking the cores from the OpenMP kernels between
-- products (9% of a GPT-2 step in perf); the OpenMP build shares
-- libgomp's threads with them and runs serially inside their parallel
-- regions: GPT-2 and the small Llama steps 4-5% faster, AdamW between
-- products 1.5x (benchmarks/train_step.lua). Linked by its directory and
-- soname with an rpath there, since the plain libopenblas.so.0 is
-- whichever build update-alternatives chose.
local function find_openblas()
  local multiarch = shell("gcc -print-multiarch"):gsub("%s+", "")
  local dir = "/usr/lib/" .. multiarch .. "/openblas-openmp"
  if multiarch ~= "" and os.isfile(dir .. "/libopenblas.so.0") then
    return { libdirs = { dir }, link = ":libopenblas.so.0", rpath = { "-Wl,-rpath," .. dir } }
  end
  return { libdirs = pkg_config_dirs("--libs-only-L", "openblas"), link = "openblas", rpath = {} }
end
local OPENBLAS = find_openblas()
local NVCC = find_nvcc()
local CUDA_HOME = NVCC and path.getdirectory(path.getdirectory(NVCC)) or nil
local ROOT = os.getcwd()

-- premake4's gmake names objects after the source's basename only, so two
-- sources with the same basename would silently overwrite each other.
local function check_unique_basenames(patterns)
  local seen = {}
  for _, pat in ipairs(patterns) do
    for _, f in ipairs(os.matchfiles(pat)) do
      local base = path.getbasename(f)
      if seen[base] then
        error(("sources %s and %s share the basename '%s': rename one"):format(seen[base], f, base))
      end
      seen[base] = f
    end
  end
end
check_unique_basenames { "core/**.c", "core/**.cu" }

---------------------------------------------------------------------------
-- Hook premake4's makefile generator to append mk/cdef.mk to the core's
-- makefile and mk/cuda.mk to the CUDA plugin's (the mechanism TOOLCHAIN.md
-- describes: make -j safe, with nvcc header dependencies tracked through
-- -MMD -MP).
---------------------------------------------------------------------------
if IS_PREMAKE4 then
  local make_cpp = premake.make_cpp
  premake.make_cpp = function(prj)
    if prj.name == "fsdp_cuda" then
      -- The sanitizer build has no CUDA backend (the CUDA runtime is not
      -- built for the sanitizers, and the GPU code is not what they check
      -- here): its plugin is not built, and the core says so when a cuda
      -- device is asked for.
      _p('ifeq ($(config),asan)')
      _p('all:')
      _p('\t@:')
      _p('clean:')
      _p('\t@:')
      _p('.PHONY: all clean')
      _p('else')
    end
    make_cpp(prj)
    -- premake's makefiles run from build/ (all their paths are ../core/...),
    -- so the root is the parent of the current directory; a moved
    -- checkout still builds.
    if prj.name == "fsdp" then
      _p('')
      _p('FL_ROOT := $(abspath ..)')
      _p('include %s/mk/cdef.mk', ROOT)
    elseif prj.name == "fsdp_cuda" then
      _p('')
      _p('FL_ROOT := $(abspath ..)')
      _p('FL_NVCC := %s', NVCC or "")
      _p('FL_CUDA_HOME := %s', CUDA_HOME or "")
      _p('include %s/mk/cuda.mk', ROOT)
      _p('endif')
    end
  end
end

---------------------------------------------------------------------------
-- The solution
---------------------------------------------------------------------------
workspace "fsdp-lua"
  configurations { "release", "debug", "asan", "cudasim" }
  location "build"
  language "C"

  cdialect "C11"
  defines { "_GNU_SOURCE" }
  includedirs { "core/include" }
  buildoptions { "-Wall", "-Wextra", "-Wshadow", "-Wno-unused-parameter",
                 "-Wstrict-prototypes", "-fno-strict-aliasing" }

  filter "configurations:release"
    optimize "On"
    symbols "On"
    defines { "NDEBUG" }
  filter "configurations:debug"
    optimize "Debug"
    symbols "On"
  filter "configurations:asan"
    symbols "On"
    buildoptions { "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                   "-fno-omit-frame-pointer" }
    linkoptions { "-fsanitize=address,undefined" }
  filter "configurations:cudasim"
    optimize "On"
    symbols "On"
    defines { "NDEBUG" }
  filter {}

-- Objects go to build/obj/<configuration>/<project> (premake4 appends both).
local function outdirs(kind)
  objdir "build/obj"
  filter "configurations:release"
    targetdir("build/" .. kind)
  filter "configurations:debug"
    targetdir("build/debug/" .. kind)
  filter "configurations:asan"
    targetdir("build/asan/" .. kind)
  filter "configurations:cudasim"
    targetdir("build/cudasim/" .. kind)
  filter {}
end

-- Every library exports the fl_ API and nothing else (mk/exports.map).
local EXPORTS_MAP = "-Wl,--version-script=" .. ROOT .. "/mk/exports.map"

-- The core: one shared library; only FL_API symbols (and the FL_PLUGIN_API
-- ones backend plugins call) are exported.
project "fsdp"
  kind "SharedLib"
  outdirs "lib"
  files { "core/**.c" }
  -- The MPI and CUDA backends are their own libraries (below): the core
  -- links neither MPI nor any CUDA library.
  excludes { "core/host/**.c", "core/comm/mpi/**.c", "core/cuda/**.c" }
  includedirs { "core/base", "core/backend", "core/ops" }
  -- -fno-math-errno: no code reads errno after a math call, and without
  -- it GCC keeps every loop with a sqrtf scalar (the optimizers' updates).
  buildoptions { "-fPIC", "-fvisibility=hidden", "-fopenmp", "-fno-math-errno" }
  linkoptions { "-fopenmp", EXPORTS_MAP }
  -- OpenBLAS for every matrix product: Debian's OpenMP build where it is
  -- installed (see OPENBLAS above), else whichever pkg-config names.
  includedirs { pkg_config_dirs("--cflags-only-I", "openblas") }
  libdirs { OPENBLAS.libdirs }
  links { OPENBLAS.link, "jansson", "yajl", "xxhash", "m", "pthread", "dl" }
  -- ISA-L: CRC-32C of TensorBoard records (core/io/crc32c.c).
  links { "isal" }
  linkoptions { OPENBLAS.rpath }
  -- Corpus readers (core/data): gzip and zstd shards.
  links { "z", "zstd" }
  -- Tokenizers (core/text): PCRE2 for the pre-tokenizers' Unicode regexes,
  -- utf8proc for the Unicode normalizers,
  -- libsentencepiece (C++, through core/text/spm.cc) for SentencePiece.
  links { "pcre2-8", "utf8proc", "sentencepiece", "sentencepiece_train", "stdc++" }
  if not IS_PREMAKE4 then files { "core/**.cc" } end
  if not IS_PREMAKE4 then
    files { "core/include/fsdp.h" }
    filter "files:core/include/fsdp.h"
      buildmessage "generating FFI declarations"
      buildcommands { 'sh "' .. ROOT .. '/mk/gen_cdef.sh" "%{file.abspath}" "%{cfg.objdir}/fsdp_cdef.c"' }
      buildoutputs { "%{cfg.objdir}/fsdp_cdef.c" }
      compilebuildoutputs "On"
    filter {}
  end

-- The cuda backend (core/cuda): a plugin the core dlopen()s on the first use
-- of a cuda device, so a CPU run never loads the CUDA libraries and the
-- binary starts where they are missing (core/tensor/backend.c).
if NVCC then
project "fsdp_cuda"
  kind "SharedLib"
  outdirs "lib"
  files { "core/cuda/**.c" }
  includedirs { "core/base", "core/backend", "core/comm", CUDA_HOME .. "/include" }
  buildoptions { "-fPIC", "-fvisibility=hidden" }
  -- Refuse to link with a symbol left unresolved: the loader's dlopen
  -- would otherwise be the first to notice.
  linkoptions { "-Wl,--no-undefined", "-Wl,-rpath,'$$ORIGIN'", EXPORTS_MAP }
  filter "configurations:release or debug"
    libdirs { CUDA_HOME .. "/lib64" }
    -- cuBLASLt for GEMMs, cuDNN for convolutions and fused attention;
    -- both come with the toolkit, and none needs a driver to load.
    -- No libstdc++: the .cu files are built without exceptions and
    -- thread-safe statics (mk/nvcc_flags.sh), all the C++ runtime their
    -- launch stubs would otherwise need.
    links { "fsdp", "cudart", "cublasLt", "cublas", "cudnn", "m", "pthread", "dl" }
    linkoptions { "-Wl,-rpath," .. CUDA_HOME .. "/lib64" }
  -- The simulation: the same backend against the CUDA headers, with the
  -- runtime, cuBLASLt and cuDNN replaced by tests/cudasim (C++, so the
  -- C++ runtime is linked here; OpenBLAS for the simulated cuBLAS).
  filter "configurations:cudasim"
    defines { "FL_CUDASIM" }
    libdirs { OPENBLAS.libdirs }
    links { "fsdp", "stdc++", OPENBLAS.link, "m", "pthread", "dl", "rt" }
    linkoptions { OPENBLAS.rpath }
  filter {}
  if not IS_PREMAKE4 then
    -- premake5 compiles .cu files with native custom build rules instead
    -- of mk/cuda.mk (release and debug; cudasim needs premake4).
    files { "core/**.cu" }
    filter "files:**.cu"
      buildmessage "nvcc %{file.name}"
      buildcommands { NVCC .. ' ' .. shell("sh mk/nvcc_flags.sh") ..
        ' -c "%{file.abspath}" -o "%{cfg.objdir}/%{file.basename}.cu.o"' }
      buildoutputs { "%{cfg.objdir}/%{file.basename}.cu.o" }
    filter {}
  end
end

-- The mpi backend of core/comm: a plugin the core dlopen()s only in a
-- process a launcher started, so libfsdp.so never depends on libmpi.
if MPI then
project "fsdp_mpi"
  kind "SharedLib"
  outdirs "lib"
  files { "core/comm/mpi/**.c" }
  includedirs { "core/comm", MPI.includedirs }
  libdirs { MPI.libdirs }
  buildoptions { "-fPIC", "-fvisibility=hidden" }
  links { "fsdp", "mpi", "pthread" }
  linkoptions { "-Wl,-rpath,'$$ORIGIN'", EXPORTS_MAP }
  for _, dir in ipairs(MPI.libdirs) do linkoptions { "-Wl,-rpath," .. dir } end
end

-- The executable: LuaJIT linked statically and every symbol exported so
-- ffi.C sees the core and C Lua modules (cjson.so) see the Lua API.
project "fsdp-lua"
  kind "ConsoleApp"
  outdirs "bin"
  files { "core/host/**.c" }
  includedirs { "/usr/include/luajit-2.1" }
  links { "fsdp", ":libluajit-5.1.a", "edit", "m", "dl" }
  linkoptions { "-rdynamic", "-Wl,-rpath,'$$ORIGIN/../lib'" }

-- The embedding example (tests/embed): a C program with its own LuaJIT
-- state (Debian's shared libluajit) that trains through the Lua library
-- and reads the loss back through the C API.
project "fsdp-embed"
  kind "ConsoleApp"
  outdirs "bin"
  files { "tests/embed/**.c" }
  includedirs { "/usr/include/luajit-2.1" }
  links { "fsdp", "luajit-5.1", "m", "dl" }
  linkoptions { "-Wl,-rpath,'$$ORIGIN/../lib'" }

-- The C test suite.
project "fsdp-ctest"
  kind "ConsoleApp"
  outdirs "bin"
  files { "tests/c/**.c" }
  includedirs { "core/base" }
  -- gomp: test_dtype.c runs the bulk conversions on 1, 2 and 3 threads;
  -- test_threads.c opens a nested region to prove its thread counter
  buildoptions { "-fopenmp" }
  links { "fsdp", "cmocka", "gomp", "m" }
  linkoptions { "-Wl,-rpath,'$$ORIGIN/../lib'" }

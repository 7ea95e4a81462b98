# cuda.mk: appended by premake5.lua to the CUDA plugin's generated makefile
# (build/fsdp_cuda.make, libfsdp_cuda.so) under premake4, which has no
# custom build rules.
#   1. *.cu.o: the CUDA sources, compiled by nvcc in the release and debug
#      configurations, each with ptxas's resource report in *.cu.o.ptxas.
#   2. In the cudasim configuration, the same sources rewritten by
#      tests/cudasim/rewrite.lua and compiled by the C++ compiler with
#      tests/cudasim/cudasim.h, plus the simulated runtime and libraries.
#   4. core/text/spm.cc: the SentencePiece shim, compiled as C++ (the
#      library has no C interface), sanitized in the asan configuration.
# All are added to OBJECTS and made prerequisites of the library, so
# `make -j` links only after they exist; -MMD -MP tracks the headers the
# CUDA sources include.

ifneq ($(FL_NVCC),)
ifneq ($(filter release debug,$(config)),)
FL_CU_SOURCES := $(shell find $(FL_ROOT)/core -name '*.cu' | sort)
FL_CU_OBJECTS := $(patsubst %.cu,$(OBJDIR)/%.cu.o,$(notdir $(FL_CU_SOURCES)))
FL_NVCC_FLAGS := $(shell sh $(FL_ROOT)/mk/nvcc_flags.sh)

vpath %.cu $(sort $(dir $(FL_CU_SOURCES)))

# ptxas's report of each kernel's registers, shared memory and spills
# (--resource-usage) is kept beside the object as OBJECT.ptxas for
# tools/kernel_resources.lua (the `kernels` suite); everything else nvcc
# says still reaches the terminal.
$(OBJDIR)/%.cu.o: %.cu $(FL_ROOT)/mk/nvcc_flags.sh $(FL_ROOT)/mk/cuda.mk | $(OBJDIR)
	@echo "$(notdir $<) (nvcc)"
	$(SILENT) $(FL_NVCC) $(FL_NVCC_FLAGS) --resource-usage -MMD -MP -c "$<" -o "$@" 2>"$@.ptxas"; \
	  status=$$?; grep -v -e '^ptxas info' -e 'bytes stack frame' "$@.ptxas" >&2; exit $$status

OBJECTS += $(FL_CU_OBJECTS)
$(TARGET): $(FL_CU_OBJECTS)
-include $(FL_CU_OBJECTS:.o=.d)
endif
endif

ifneq ($(FL_CUDA_HOME),)
ifeq ($(config),cudasim)
FL_SIM_DIR := $(FL_ROOT)/tests/cudasim
FL_SIM_SRC := $(OBJDIR)/cudasim
FL_CU_SOURCES := $(shell find $(FL_ROOT)/core -name '*.cu' -o -name '*.cuh' | sort)
FL_SIM_REWRITTEN := $(addprefix $(FL_SIM_SRC)/,$(notdir $(FL_CU_SOURCES)))
FL_CU_OBJECTS := $(patsubst %.cu,$(OBJDIR)/%.sim.o,$(filter %.cu,$(notdir $(FL_CU_SOURCES))))
FL_SIM_LIB_SOURCES := $(wildcard $(FL_SIM_DIR)/sim_*.cc $(FL_SIM_DIR)/sim_*.c)
FL_SIM_LIB_OBJECTS := $(addprefix $(OBJDIR)/,$(addsuffix .o,$(notdir $(FL_SIM_LIB_SOURCES))))
# No FMA contraction: the kernels' __fmul_rn and friends must stay separate
# IEEE operations, as on the GPU.
FL_SIM_FLAGS := -O2 -g -fPIC -fvisibility=hidden -ffp-contract=off -Wall -Wno-unused-function \
  -Wno-unknown-pragmas -Wno-sign-compare \
  -I$(FL_ROOT)/core/include -I$(FL_ROOT)/core/base -I$(FL_ROOT)/core/ops -I$(FL_ROOT)/core/cuda \
  -I$(FL_ROOT)/core/comm \
  -I$(FL_SIM_DIR) \
  -I$(FL_CUDA_HOME)/include -DFL_CUDASIM -D_GNU_SOURCE
FL_SIM_CXXFLAGS := -std=c++17 -fno-exceptions $(FL_SIM_FLAGS)

vpath %.cu $(sort $(dir $(FL_CU_SOURCES)))
vpath %.cuh $(sort $(dir $(FL_CU_SOURCES)))

$(FL_SIM_SRC)/%.cu: %.cu $(FL_SIM_DIR)/rewrite.lua
	@mkdir -p $(FL_SIM_SRC)
	$(SILENT) luajit $(FL_SIM_DIR)/rewrite.lua $< > $@.tmp && mv $@.tmp $@

$(FL_SIM_SRC)/%.cuh: %.cuh $(FL_SIM_DIR)/rewrite.lua
	@mkdir -p $(FL_SIM_SRC)
	$(SILENT) luajit $(FL_SIM_DIR)/rewrite.lua $< > $@.tmp && mv $@.tmp $@

$(OBJDIR)/%.sim.o: $(FL_SIM_SRC)/%.cu $(FL_SIM_REWRITTEN) $(FL_SIM_DIR)/cudasim.h $(FL_SIM_DIR)/sim_internal.h | $(OBJDIR)
	@echo "$(notdir $<) (cudasim)"
	$(SILENT) $(CXX) $(FL_SIM_CXXFLAGS) -include cudasim.h -x c++ -MMD -MP -c "$<" -o "$@"

$(OBJDIR)/%.cc.o: $(FL_SIM_DIR)/%.cc $(wildcard $(FL_SIM_DIR)/*.h) | $(OBJDIR)
	@echo "$(notdir $<)"
	$(SILENT) $(CXX) $(FL_SIM_CXXFLAGS) -c "$<" -o "$@"

$(OBJDIR)/%.c.o: $(FL_SIM_DIR)/%.c $(FL_SIM_DIR)/sim_half.h $(FL_SIM_DIR)/sim_internal.h | $(OBJDIR)
	@echo "$(notdir $<)"
	$(SILENT) $(CC) -std=c11 $(FL_SIM_FLAGS) -c "$<" -o "$@"

OBJECTS += $(FL_CU_OBJECTS) $(FL_SIM_LIB_OBJECTS)
$(TARGET): $(FL_CU_OBJECTS) $(FL_SIM_LIB_OBJECTS)
-include $(FL_CU_OBJECTS:.o=.d)

# The simulator's own checks, built with the library (tests/run.sh runs
# them): the scheduler's self-test and the library simulations compared
# with references (BLAS; the adjoint identities of convolution; NCCL's
# collectives across forked processes).
FL_SIM_BIN := $(abspath $(TARGETDIR)/../bin)
FL_SIM_CHECKS := $(FL_SIM_BIN)/cudasim-selftest $(FL_SIM_BIN)/check_sim_cublas $(FL_SIM_BIN)/check_sim_cudnn \
  $(FL_SIM_BIN)/check_sim_nccl $(FL_SIM_BIN)/check_sim_cudnn_graph
all: $(FL_SIM_CHECKS)

$(FL_SIM_SRC)/selftest.cu: $(FL_SIM_DIR)/selftest.cu $(FL_SIM_DIR)/rewrite.lua
	@mkdir -p $(FL_SIM_SRC)
	$(SILENT) luajit $(FL_SIM_DIR)/rewrite.lua $< > $@.tmp && mv $@.tmp $@

$(FL_SIM_BIN)/cudasim-selftest: $(OBJDIR)/selftest.sim.o $(OBJDIR)/sim_fiber.cc.o $(OBJDIR)/sim_runtime.cc.o
	@mkdir -p $(FL_SIM_BIN)
	@echo "linking cudasim-selftest"
	$(SILENT) $(CXX) -o "$@" $^ -lpthread

$(FL_SIM_BIN)/check_sim_cublas: $(FL_SIM_DIR)/check_sim_cublas.c $(FL_SIM_DIR)/sim_cublas.c $(FL_SIM_DIR)/sim_half.h
	@mkdir -p $(FL_SIM_BIN)
	@echo "linking check_sim_cublas"
	$(SILENT) $(CC) -std=c11 -O2 -I$(FL_CUDA_HOME)/include $< -o "$@" \
	  $(shell pkg-config --cflags --libs openblas) -lm

# With the simulated runtime, for collectives queued on its streams.
$(FL_SIM_BIN)/check_sim_nccl: $(FL_SIM_DIR)/check_sim_nccl.c $(FL_SIM_DIR)/sim_nccl.c $(FL_SIM_DIR)/sim_half.h \
  $(FL_SIM_DIR)/sim_internal.h $(OBJDIR)/sim_runtime.cc.o $(OBJDIR)/sim_fiber.cc.o
	@mkdir -p $(FL_SIM_BIN)
	@echo "linking check_sim_nccl"
	$(SILENT) $(CC) -std=c11 -O2 -D_GNU_SOURCE -I$(FL_CUDA_HOME)/include -I$(FL_SIM_DIR) $(FL_SIM_DIR)/check_sim_nccl.c \
	  $(FL_SIM_DIR)/sim_nccl.c $(OBJDIR)/sim_runtime.cc.o $(OBJDIR)/sim_fiber.cc.o -o "$@" -lrt -lstdc++ -lpthread

$(FL_SIM_BIN)/check_sim_cudnn: $(FL_SIM_DIR)/check_sim_cudnn.c $(OBJDIR)/sim_cudnn.c.o
	@mkdir -p $(FL_SIM_BIN)
	@echo "linking check_sim_cudnn"
	$(SILENT) $(CC) -std=c11 -O2 -I$(FL_CUDA_HOME)/include $^ -o "$@" -lm

# cuDNN's graph API (sim_cudnn_graph.c) through the backend calls, with the
# handle from sim_cudnn.c.
$(FL_SIM_BIN)/check_sim_cudnn_graph: $(FL_SIM_DIR)/check_sim_cudnn_graph.c $(OBJDIR)/sim_cudnn_graph.c.o \
  $(OBJDIR)/sim_cudnn.c.o
	@mkdir -p $(FL_SIM_BIN)
	@echo "linking check_sim_cudnn_graph"
	$(SILENT) $(CC) -std=c11 -O2 -I$(FL_CUDA_HOME)/include $^ -o "$@" -lm
endif
endif

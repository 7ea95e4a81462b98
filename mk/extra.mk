# extra.mk: appended by premake5.lua to the core's generated makefile
# (build/fsdp.make) under premake4, which has no custom build rules.
#   1. fsdp_cdef.o: the FFI declarations generated from the public header.
#   2. *.cu.o: the CUDA sources, compiled by nvcc when the build found it
#      (FL_NVCC non-empty) and the configuration is not asan.
# Both are added to OBJECTS and made prerequisites of the library, so
# `make -j` links only after they exist; -MMD -MP tracks the headers the
# CUDA sources include.

FL_CDEF_C := $(OBJDIR)/fsdp_cdef.c
FL_CDEF_O := $(OBJDIR)/fsdp_cdef.o

$(FL_CDEF_C): $(FL_ROOT)/core/include/fsdp.h $(FL_ROOT)/mk/gen_cdef.sh | $(OBJDIR)
	@echo "generating FFI declarations"
	$(SILENT) CC="$(CC)" sh $(FL_ROOT)/mk/gen_cdef.sh $< $@

$(FL_CDEF_O): $(FL_CDEF_C)
	$(SILENT) $(CC) $(CFLAGS) -o "$@" -c "$<"

OBJECTS += $(FL_CDEF_O)
$(TARGET): $(FL_CDEF_O)

ifneq ($(FL_NVCC),)
ifneq ($(config),asan)
FL_CU_SOURCES := $(shell find $(FL_ROOT)/core -name '*.cu' | sort)
FL_CU_OBJECTS := $(patsubst %.cu,$(OBJDIR)/%.cu.o,$(notdir $(FL_CU_SOURCES)))
FL_NVCC_FLAGS := $(shell sh $(FL_ROOT)/mk/nvcc_flags.sh)

vpath %.cu $(sort $(dir $(FL_CU_SOURCES)))

$(OBJDIR)/%.cu.o: %.cu $(FL_ROOT)/mk/nvcc_flags.sh | $(OBJDIR)
	@echo "$(notdir $<) (nvcc)"
	$(SILENT) $(FL_NVCC) $(FL_NVCC_FLAGS) -MMD -MP -c "$<" -o "$@"

OBJECTS += $(FL_CU_OBJECTS)
$(TARGET): $(FL_CU_OBJECTS)
-include $(FL_CU_OBJECTS:.o=.d)
endif
endif

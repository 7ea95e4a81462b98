# cdef.mk: appended by premake5.lua to the core's generated makefile
# (build/fsdp.make) under premake4, which has no custom build rules:
# fsdp_cdef.o, the FFI declarations generated from the public header, added
# to OBJECTS and made a prerequisite of the library, so `make -j` links
# only after it exists. Also spm.cxx.o: core/text/spm.cc (the
# SentencePiece shim, C++), which premake4 does not compile in a C project.

FL_CDEF_C := $(OBJDIR)/fsdp_cdef.c
FL_CDEF_O := $(OBJDIR)/fsdp_cdef.o

$(FL_CDEF_C): $(FL_ROOT)/core/include/fsdp.h $(FL_ROOT)/mk/gen_cdef.sh | $(OBJDIR)
	@echo "generating FFI declarations"
	$(SILENT) CC="$(CC)" sh $(FL_ROOT)/mk/gen_cdef.sh $< $@

$(FL_CDEF_O): $(FL_CDEF_C)
	$(SILENT) $(CC) $(CFLAGS) -o "$@" -c "$<"

OBJECTS += $(FL_CDEF_O)
$(TARGET): $(FL_CDEF_O)

FL_SPM_O := $(OBJDIR)/spm.cxx.o
FL_SPM_FLAGS := -std=c++17 -O2 -g -fPIC -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter \
  -I$(FL_ROOT)/core/include
ifeq ($(config),asan)
FL_SPM_FLAGS += -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
endif

$(FL_SPM_O): $(FL_ROOT)/core/text/spm.cc $(FL_ROOT)/core/include/fsdp.h | $(OBJDIR)
	@echo "spm.cc"
	$(SILENT) $(CXX) $(FL_SPM_FLAGS) -c "$<" -o "$@"

OBJECTS += $(FL_SPM_O)
$(TARGET): $(FL_SPM_O)

# The version script is an input of the link (premake5.lua).
$(TARGET): $(FL_ROOT)/mk/exports.map

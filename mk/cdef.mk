# cdef.mk: appended by premake5.lua to the core's generated makefile
# (build/fsdp.make) under premake4, which has no custom build rules:
# fsdp_cdef.o, the FFI declarations generated from the public header, added
# to OBJECTS and made a prerequisite of the library, so `make -j` links
# only after it exists.

FL_CDEF_C := $(OBJDIR)/fsdp_cdef.c
FL_CDEF_O := $(OBJDIR)/fsdp_cdef.o

$(FL_CDEF_C): $(FL_ROOT)/core/include/fsdp.h $(FL_ROOT)/mk/gen_cdef.sh | $(OBJDIR)
	@echo "generating FFI declarations"
	$(SILENT) CC="$(CC)" sh $(FL_ROOT)/mk/gen_cdef.sh $< $@

$(FL_CDEF_O): $(FL_CDEF_C)
	$(SILENT) $(CC) $(CFLAGS) -o "$@" -c "$<"

OBJECTS += $(FL_CDEF_O)
$(TARGET): $(FL_CDEF_O)

#!/bin/sh
# gen_cdef.sh HEADER OUT.c: turn the public header into a C file defining
# fl_ffi_cdef(), the header's declarations preprocessed for LuaJIT's
# ffi.cdef (no comments, no macros, no system includes). Compiling the text
# into the library keeps the Lua declarations identical to the binary.
set -eu
header=$1
out=$2
tmp="$out.tmp"
{
  echo '/* Generated from core/include/fsdp.h by mk/gen_cdef.sh: do not edit. */'
  echo 'const char *fl_ffi_cdef(void);'
  echo '__attribute__((visibility("default"))) const char *fl_ffi_cdef(void) {'
  echo '    return'
  ${CC:-cc} -E -P -DFL_FFI_CDEF -x c "$header" |
    sed -e '/^[[:space:]]*$/d' -e 's/\\/\\\\/g' -e 's/"/\\"/g' \
        -e 's/^/        "/' -e 's/$/\\n"/'
  echo '        ;'
  echo '}'
} > "$tmp"
mv "$tmp" "$out"

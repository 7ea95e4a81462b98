/*
 * cpu_alloc.h: the CPU backend's caching allocator (cpu_alloc.c).
 */
#ifndef FL_CPU_ALLOC_H
#define FL_CPU_ALLOC_H

#include "fsdp.h"

/* The CPU's caching allocator (core/cpu/cpu_alloc.c): 64-byte aligned
 * blocks; fl_cpu_free must get the size the block was allocated with. */
void *fl_cpu_alloc(int64_t nbytes);
void fl_cpu_free(void *ptr, int64_t nbytes);
int64_t fl_cpu_reserved_bytes(void);
/* Whether large host blocks and reserved ranges ask for transparent huge
 * pages (FSDP_CPU_HUGE_PAGES, default 1; cpu_alloc.c). */
bool fl_cpu_huge_pages(void);
enum { FL_CPU_HUGE_PAGE = 2 * 1024 * 1024 };
int64_t fl_cpu_empty_cache(void);

#endif /* FL_CPU_ALLOC_H */

/*
 * test_memory.c: the allocator statistics (in use, peak, counts, reset),
 * the memory limit that turns an allocation into a clean OOM error, and
 * the CPU allocator's huge-page blocks and huge-page gathered ranges.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>

#include "fl_tests.h"

static void statistics_follow_allocations(void **state) {
    (void)state;
    fl_memory_stats s0, s1, s2;
    fl_memory_stats_reset(CPU);
    fl_memory_stats_get(CPU, &s0);
    fl_tensor *a = fl_empty(SHAPE(1000), FL_F32, CPU);
    fl_tensor *b = fl_empty(SHAPE(500), FL_F64, CPU);
    fl_memory_stats_get(CPU, &s1);
    assert_int_equal(s1.in_use - s0.in_use, 8000);
    assert_int_equal(s1.allocations, 2);
    fl_tensor *v = fl_narrow(a, 0, 0, 10); /* views allocate nothing */
    fl_tensor_release(a);
    fl_tensor_release(b);
    fl_memory_stats_get(CPU, &s2);
    assert_int_equal(s2.in_use - s0.in_use, 4000); /* v keeps a's storage */
    assert_int_equal(s2.peak - s0.in_use, 8000);
    assert_int_equal(s2.frees, 1);
    fl_tensor_release(v);
    fl_memory_stats_reset(CPU);
    fl_memory_stats_get(CPU, &s2);
    assert_int_equal(s2.peak, s2.in_use);
    assert_int_equal(s2.allocations, 0);
}

static void limit_gives_oom_error(void **state) {
    (void)state;
    fl_memory_stats s;
    fl_memory_stats_get(CPU, &s);
    assert_int_equal(fl_memory_set_limit(CPU, s.in_use + 4096), FL_OK);
    fl_tensor *ok = fl_empty(SHAPE(1024), FL_F32, CPU);
    assert_non_null(ok);
    fl_tensor *big = fl_zeros(SHAPE(2, 1024), FL_F32, CPU);
    assert_null(big);
    assert_int_equal(fl_last_status(), FL_ERR_OOM);
    assert_error_mentions("zeros: out of memory on cpu", "requested 8192 bytes");
    fl_memory_stats after;
    fl_memory_stats_get(CPU, &after);
    assert_int_equal(after.failures, s.failures + 1);
    assert_int_equal(fl_memory_set_limit(CPU, 0), FL_OK);
    big = fl_zeros(SHAPE(2, 1024), FL_F32, CPU);
    assert_non_null(big);
    assert_int_not_equal(fl_memory_set_limit(CPU, -1), FL_OK);
    fl_tensor_release(ok);
    fl_tensor_release(big);
}

/* [Note: virtual storage]: meta tensors count the bytes they stand for in
 * the meta statistics, views share their base's, the bytes go with the
 * last reference, and none of it paces the collector (allocated_total). */
static void meta_counts_virtual_bytes(void **state) {
    (void)state;
    fl_memory_stats s;
    fl_memory_stats_get(META, &s);
    int64_t base = s.in_use, total = fl_memory_allocated_total();
    fl_tensor *m = fl_zeros(SHAPE(1 << 20, 1 << 20), FL_F32, META);
    fl_tensor *v = fl_narrow(m, 0, 0, 10);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, (int64_t)4 << 40);
    fl_tensor_release(m);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, (int64_t)4 << 40); /* the view keeps it */
    fl_tensor_release(v);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use, base);
    assert_int_equal(fl_memory_allocated_total(), total);
    m = fl_empty(SHAPE(3), FL_F32, META);
    assert_int_equal(fl_tensor_storage_bytes(m), 0); /* still no values */
    fl_tensor_release(m);
}

/* [Note: frees from before a trace]: inside fl_meta_trace_begin/end a
 * meta tensor made before the begin keeps its bytes in use when freed
 * (they go at the outermost end); one made inside frees as usual. */
static void meta_trace_holds_earlier_frees(void **state) {
    (void)state;
    fl_memory_stats s;
    fl_memory_stats_get(META, &s);
    int64_t base = s.in_use;
    fl_tensor *before = fl_empty(SHAPE(1000), FL_F32, META);
    fl_meta_trace_begin();
    fl_meta_trace_begin(); /* nested: only the outer end lets go */
    fl_tensor *inside = fl_empty(SHAPE(10), FL_F32, META);
    fl_tensor_release(before);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, 4000 + 40);
    fl_tensor_release(inside);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, 4000);
    fl_meta_trace_end();
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, 4000);
    fl_meta_trace_end();
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use, base);
    /* after the end, frees count at once again */
    before = fl_empty(SHAPE(7), FL_F32, META);
    fl_tensor_release(before);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use, base);
}

/* fl_meta_set_f32_gemm: a bf16 product on meta raises the peak by the f32
 * copies the CPU backend stages (operands, result), leaving in_use alone. */
static void meta_f32_gemm_staging(void **state) {
    (void)state;
    fl_tensor *x = fl_empty(SHAPE(8, 16), FL_BF16, META);
    fl_tensor *w = fl_empty(SHAPE(4, 16), FL_BF16, META);
    bool was = fl_meta_set_f32_gemm(true);
    fl_memory_stats_reset(META);
    fl_memory_stats s0, s1;
    fl_memory_stats_get(META, &s0);
    fl_tensor *y = fl_linear(x, w, NULL);
    fl_memory_stats_get(META, &s1);
    assert_int_equal(s1.in_use - s0.in_use, 8 * 4 * 2);
    assert_int_equal(s1.peak - s1.in_use, (8 * 16 + 16 * 4 + 8 * 4) * 4);
    fl_meta_set_f32_gemm(false);
    fl_tensor_release(y);
    fl_memory_stats_reset(META);
    y = fl_linear(x, w, NULL);
    fl_memory_stats_get(META, &s1);
    assert_int_equal(s1.peak, s1.in_use);
    fl_meta_set_f32_gemm(was);
    fl_tensor_release(y);
    fl_tensor_release(x);
    fl_tensor_release(w);
}

/* The VmFlags of the mapping holding p (from /proc/self/smaps) into
 * flags; false when it cannot be read. */
static bool mapping_flags(const void *p, char *flags, size_t cap) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512];
    bool inside = false, found = false;
    uintptr_t a = (uintptr_t)p;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(flags, cap, "%s", line + 8);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* The mapping holding p is advised as huge pages (VmFlags "hg"), where
 * the kernel has transparent huge pages at all (one without refuses the
 * advice: nothing to see). */
static void assert_advised_huge(const void *p) {
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "", flags[512];
    if (thp) {
        if (!fgets(mode, sizeof mode, thp)) mode[0] = 0;
        fclose(thp);
    }
    if (strstr(mode, "[never]") == NULL && mode[0] && mapping_flags(p, flags, sizeof flags))
        assert_non_null(strstr(flags, " hg"));
}

/* cpu_alloc.c: blocks of 2 MiB and more start on a 2 MiB boundary and are
 * advised as huge pages (VmFlags "hg"; FSDP_CPU_HUGE_PAGES=0: neither is
 * promised); smaller ones keep malloc's placement at 64-byte alignment. */
static void large_cpu_blocks_get_huge_pages(void **state) {
    (void)state;
    fl_tensor *small = fl_empty(SHAPE(1000), FL_F32, CPU);
    assert_int_equal((uintptr_t)small->data % 64, 0);
    fl_tensor_release(small);
    const char *env = getenv("FSDP_CPU_HUGE_PAGES");
    if (env && strcmp(env, "0") == 0) skip();
    fl_tensor *big = fl_empty(SHAPE(3, 1 << 20), FL_F32, CPU); /* 12 MiB */
    assert_non_null(big);
    assert_int_equal((uintptr_t)big->data % (2u << 20), 0);
    assert_advised_huge(big->data);
    fl_tensor_release(big);
}

/* cpu_backend.c: a unit's gathered buffer of 2 MiB and more lies in a
 * range aligned to 2 MiB and advised as huge pages, and what an unshard
 * writes after a reshard gave the pages back lazily is what it reads. */
static void gathered_ranges_get_huge_pages(void **state) {
    (void)state;
    const char *env = getenv("FSDP_CPU_HUGE_PAGES");
    if (env && strcmp(env, "0") == 0) skip();
    const char *names[] = {"w"};
    int ndims[] = {1};
    int64_t dims[] = {3 << 20}; /* 6 MiB gathered in bf16 */
    fl_unit_config cfg = {.master_dtype = FL_F32,
                          .param_dtype = FL_BF16,
                          .reduce_dtype = FL_F32,
                          .grad_dtype = FL_F32,
                          .device = CPU};
    fl_unit *u = fl_unit_new("layer", 1, names, ndims, dims, &cfg);
    assert_non_null(u);
    fl_tensor *shard = fl_unit_shard(u);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(fl_fill_(shard, round ? -2.5 : 1.5), FL_OK);
        assert_int_equal(fl_unit_unshard(u), FL_OK);
        assert_int_equal(fl_unit_wait(u), FL_OK);
        fl_tensor *w = fl_unit_param_view(u, 0);
        assert_non_null(w);
        assert_int_equal((uintptr_t)w->data % (2u << 20), 0);
        const uint16_t *bits = w->data;
        uint16_t want = fl_f32_to_bf16(round ? -2.5f : 1.5f);
        for (int64_t i = 0; i < dims[0]; i += 4099) assert_int_equal(bits[i], want);
        assert_int_equal(bits[dims[0] - 1], want);
        assert_advised_huge(w->data);
        fl_tensor_release(w);
        assert_int_equal(fl_unit_reshard(u), FL_OK);
    }
    fl_tensor_release(shard);
    fl_unit_free(u);
}

int fl_test_memory(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(statistics_follow_allocations),
        cmocka_unit_test(limit_gives_oom_error),
        cmocka_unit_test(meta_counts_virtual_bytes),
        cmocka_unit_test(meta_trace_holds_earlier_frees),
        cmocka_unit_test(meta_f32_gemm_staging),
        cmocka_unit_test(large_cpu_blocks_get_huge_pages),
        cmocka_unit_test(gathered_ranges_get_huge_pages),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}

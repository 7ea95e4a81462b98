/*
 * main.c: entry of fsdp-ctest, the C test suite of the core. Runs every
 * group (or the groups named on the command line) and exits non-zero if any
 * test failed. Set CMOCKA_MESSAGE_OUTPUT=TAP for machine-readable output
 * (tests/run.sh does).
 */
#include "fl_tests.h"

#include <stdio.h>
#include <stdbool.h>
#include <string.h>

typedef struct group {
    const char *name;
    int (*run)(void);
} group;

static const group groups[] = {
    {"dtype", fl_test_dtype},   {"rng", fl_test_rng},       {"tensor", fl_test_tensor},
    {"view", fl_test_view},     {"memory", fl_test_memory},
    {"optim", fl_test_optim},   {"device_pool", fl_test_device_pool},
    {"checksum", fl_test_checksum}, {"text", fl_test_text},
    {"threads", fl_test_threads},
};

int main(int argc, char **argv) {
    int failures = 0, ran = 0;
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        bool wanted = argc < 2;
        for (int a = 1; a < argc; a++) wanted |= strcmp(argv[a], groups[g].name) == 0;
        if (!wanted) continue;
        failures += groups[g].run();
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "fsdp-ctest: no group matches the arguments\n");
        return 2;
    }
    return failures ? 1 : 0;
}

/*
 * fl_tests.h: the groups of the C test suite (one executable, fsdp-ctest).
 * Each group is a function that runs its cmocka tests and returns the number
 * of failures; main.c runs them all.
 */
#ifndef FL_TESTS_H
#define FL_TESTS_H

int fl_test_dtype(void);
int fl_test_rng(void);
int fl_test_tensor(void);
int fl_test_view(void);
int fl_test_memory(void);
int fl_test_optim(void);
int fl_test_device_pool(void);
int fl_test_checksum(void);
int fl_test_text(void);
int fl_test_threads(void);

#endif /* FL_TESTS_H */

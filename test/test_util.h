/* Shared test helpers: cmocka with TAP output (meson counts each test), a leak-checking
   fixture built on the live counters, and tensor comparisons. */
#ifndef MT_TEST_UTIL_H
#define MT_TEST_UTIL_H
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "mixtape.h"

/* Per-test fixture: every test starts with no error and must end with no new live tensor
   and no new live byte. */
typedef struct {
    int64_t tensors, bytes;
} mt_test_live;

static inline int mt_test_setup(void **state) {
    static _Thread_local mt_test_live live;
    mt_clear_error();
    live.tensors = mt_live_tensors();
    live.bytes = mt_live_bytes();
    *state = &live;
    return 0;
}

static inline int mt_test_teardown(void **state) {
    mt_test_live *live = *state;
    int64_t t = mt_live_tensors(), b = mt_live_bytes();
    if (t != live->tensors || b != live->bytes) {
        fprintf(stderr, "# leak: %lld tensors, %lld bytes still alive\n",
                (long long)(t - live->tensors), (long long)(b - live->bytes));
        return -1; /* cmocka reports a failing teardown as a failed test */
    }
    mt_clear_error();
    return 0;
}

#define MT_TEST(fn) cmocka_unit_test_setup_teardown(fn, mt_test_setup, mt_test_teardown)

#define MT_RUN_TESTS(tests)                                                                        \
    (cmocka_set_message_output(CM_OUTPUT_TAP), cmocka_run_group_tests(tests, NULL, NULL))

/* Fails the test with the library's message when an error is pending. */
#define assert_no_error()                                                                          \
    do {                                                                                           \
        if (mt_last_status() != MT_OK) fail_msg("mixtape error: %s", mt_last_error());             \
    } while (0)

/* Asserts the pending error has this status and its message contains `needle`, then
   clears it. */
#define assert_error(status, needle)                                                               \
    do {                                                                                           \
        assert_int_equal(mt_last_status(), (status));                                              \
        if (!strstr(mt_last_error(), (needle)))                                                    \
            fail_msg("error \"%s\" does not mention \"%s\"", mt_last_error(), (needle));           \
        mt_clear_error();                                                                          \
    } while (0)

/* Releases a temporary made by the test: op results belong to the innermost scope when one
   is open (the scope releases them), and to the caller only when none is. */
static inline void mt_test_drop(mt_tensor *t) {
    if (mt_scope_depth() == 0) mt_release(t);
}

/* The tensor's values as a malloc'd double array (any dtype, any layout). */
static inline double *mt_test_values(const mt_tensor *t) {
    int64_t n = mt_numel(t);
    mt_tensor *tmp = mt_cast((mt_tensor *)t, MT_F64);
    double *v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (tmp && v) mt_copy_to_host(tmp, v, (size_t)n * sizeof *v);
    mt_test_drop(tmp);
    return v;
}

/* A tensor of dtype dt from doubles; owned like any op result (by the open scope, if any). */
static inline mt_tensor *mt_test_tensor(const double *v, mt_dtype dt, int ndim,
                                        const int64_t *shape) {
    mt_tensor *d = mt_from_data(v, MT_F64, ndim, shape, MT_CPU);
    mt_tensor *t = mt_cast(d, dt);
    mt_test_drop(d);
    return t;
}

/* Asserts |t - expect| <= atol + rtol * |expect| elementwise (NaN matches NaN, inf matches
   inf of the same sign). */
static inline void mt_test_assert_close(const mt_tensor *t, const double *expect, int64_t n,
                                        double atol, double rtol, const char *file, int line) {
    if (!t) fail_msg("%s:%d: tensor is NULL (%s)", file, line, mt_last_error());
    if (mt_numel(t) != n)
        fail_msg("%s:%d: %lld elements, expected %lld", file, line, (long long)mt_numel(t),
                 (long long)n);
    double *v = mt_test_values(t);
    int64_t bad = -1;
    double got = 0, want = 0;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        double a = v[i], e = expect[i];
        bool ok =
            (isnan(a) && isnan(e)) || (isinf(e) && a == e) || fabs(a - e) <= atol + rtol * fabs(e);
        if (!ok) {
            bad = i;
            got = a;
            want = e;
        }
    }
    free(v);
    if (bad >= 0)
        fail_msg("%s:%d: element %lld is %.9g, expected %.9g", file, line, (long long)bad, got,
                 want);
}
#define assert_tensor_close(t, expect, n, atol, rtol)                                              \
    mt_test_assert_close((t), (expect), (n), (atol), (rtol), __FILE__, __LINE__)

static inline void mt_test_assert_shape(const mt_tensor *t, int ndim, const int64_t *shape,
                                        const char *file, int line) {
    if (!t) fail_msg("%s:%d: tensor is NULL (%s)", file, line, mt_last_error());
    if (mt_ndim(t) != ndim) fail_msg("%s:%d: ndim %d, expected %d", file, line, mt_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        if (mt_dim(t, i) != shape[i])
            fail_msg("%s:%d: dim %d is %lld, expected %lld", file, line, i, (long long)mt_dim(t, i),
                     (long long)shape[i]);
}
#define assert_shape(t, ...) mt_test_assert_shape((t), MT_SHAPE(__VA_ARGS__), __FILE__, __LINE__)
#endif

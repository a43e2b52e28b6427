/* Ownership misuse: releasing a tensor that an open scope holds is safe (the release takes
   the scope's reference), and MT_CHECK_OWNERSHIP=1 reports double releases and retains still
   held when their scope ends, naming the op that made the tensor. It runs twice: in the
   default mode (the reports' cases are skipped) and with MT_CHECK_OWNERSHIP=1. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "mixtape.h"
#include "test_util.h"

/* The user releases a result the scope owns: nothing is freed twice, the scope's end releases
   the others, and later ops in the scope are unaffected. */
static void test_release_scope_owned(void **state) {
    (void)state;
    int64_t before = mt_live_tensors();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *y = mt_relu(x), *z = mt_exp(x);
    mt_release(y); /* y's only reference was the scope's: y is gone now */
    assert_int_equal(mt_live_tensors(), before + 2);
    mt_tensor *w = mt_add(z, x); /* the scope still works */
    assert_tensor_close(w, ((const double[]){1 + M_E, 1 + M_E, 1 + M_E}), 3, 1e-6, 1e-6);
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), before);
    assert_no_error();
    /* nested: a release takes the innermost scope's reference first */
    mt_scope_begin();
    mt_tensor *a = mt_zeros(MT_SHAPE(2), MT_F32, mt_test_device());
    mt_scope_begin();
    mt_release(a); /* held by the outer scope */
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), before);
    mt_scope_end();
    assert_int_equal(mt_live_tensors(), before);
    assert_no_error();
}

/* A second release of a dead tensor is an MT_ERR_STATE error naming the op that made it,
   and changes nothing else (no crash, no double free under ASan). */
static void test_double_release_reported(void **state) {
    (void)state;
    mt_tensor *x = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *y = mt_sigmoid(x);
    mt_release(y);
    mt_release(y);
    assert_error(MT_ERR_STATE, "mt_release: the tensor (made by mt_sigmoid) was already released");
    mt_retain(y);
    assert_error(MT_ERR_STATE, "mt_retain: the tensor (made by mt_sigmoid) was already released");
    mt_release(x);
    assert_no_error();
}

/* A tensor retained inside a scope and still held at its end is reported (not freed); one
   handed out with mt_scope_end_keep, or retained and released, is not. */
static void test_retain_held_at_scope_end_reported(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(2), MT_F32, dev);
    mt_tensor *kept = mt_retain(mt_tanh(x));
    int64_t reports = mt_debug_ownership_reports();
    mt_scope_end(); /* a report on stderr, not an error: the program may mean to keep it */
    assert_int_equal(mt_debug_ownership_reports(), reports + 1);
    assert_no_error();
    mt_release(kept);
    mt_scope_begin();
    x = mt_ones(MT_SHAPE(2), MT_F32, dev);
    mt_release(mt_retain(mt_tanh(x)));
    mt_tensor *out = mt_scope_end_keep(mt_exp(x));
    assert_int_equal(mt_debug_ownership_reports(), reports + 1);
    mt_release(out);
    assert_no_error();
}

#define CHECKED_ONLY(fn)                                                                           \
    (checked ? (struct CMUnitTest)MT_TEST(fn)                                                      \
             : MT_TEST_SKIPPED(fn, "reported in checked mode only (MT_CHECK_OWNERSHIP=1)"))

int main(void) {
    const char *env = getenv("MT_CHECK_OWNERSHIP");
    bool checked = env && *env && strcmp(env, "0") != 0;
    const struct CMUnitTest tests[] = {
        MT_TEST(test_release_scope_owned),
        CHECKED_ONLY(test_double_release_reported),
        CHECKED_ONLY(test_retain_held_at_scope_end_reported),
    };
    return MT_RUN_TESTS(tests);
}

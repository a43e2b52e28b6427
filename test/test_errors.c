/* The cross-cutting error contract: NULL in gives NULL out without touching the error; the
   first error of a thread sticks until mt_clear_error; messages name the op, the argument and
   the reason; out of memory is an error that leaks nothing. */
#include <pthread.h>
#include "test_util.h"

static mt_tensor *f32(int ndim, const int64_t *shape) {
    return mt_ones(ndim, shape, MT_F32, mt_test_device());
}

/* Every public function that returns a tensor, given a NULL tensor argument. */
static void test_null_propagates(void **state) {
    (void)state;
    mt_tensor *a = f32(MT_SHAPE(2, 3)), *w = f32(MT_SHAPE(4, 3));
    mt_tensor *lab = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_tensor *cond = mt_zeros(MT_SHAPE(2, 3), MT_BOOL, mt_test_device());
    mt_tensor *N = NULL;
    mt_tensor *(*binary[])(mt_tensor *, mt_tensor *) = {
        mt_add, mt_sub, mt_mul, mt_div, mt_pow, mt_maximum, mt_minimum,  mt_eq,
        mt_ne,  mt_lt,  mt_le,  mt_gt,  mt_ge,  mt_matmul,  mt_mse_loss, mt_cross_entropy};
    for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) {
        assert_null(binary[i](N, a));
        assert_null(binary[i](a, N));
        assert_null(binary[i](N, N));
    }
    mt_tensor *(*unary[])(mt_tensor *) = {
        mt_neg,   mt_exp,        mt_log,     mt_sqrt,    mt_rsqrt,   mt_abs,      mt_relu,
        mt_gelu,  mt_gelu_tanh,  mt_sigmoid, mt_tanh,    mt_sum_all, mt_mean_all, mt_max_all,
        mt_clone, mt_contiguous, mt_detach,  mt_flatten, mt_retain};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) assert_null(unary[i](N));
    mt_tensor *(*scalar[])(mt_tensor *, double) = {mt_add_scalar, mt_mul_scalar, mt_pow_scalar,
                                                   mt_rsub_scalar, mt_rdiv_scalar};
    for (size_t i = 0; i < sizeof scalar / sizeof *scalar; i++) assert_null(scalar[i](N, 2.0));
    assert_null(mt_where(N, a, a));
    assert_null(mt_where(cond, N, a));
    assert_null(mt_where(cond, a, N));
    assert_null(mt_sum(N, MT_DIMS(0), false));
    assert_null(mt_mean(N, MT_DIMS(0), true));
    assert_null(mt_max(N, MT_DIMS(0), false));
    assert_null(mt_softmax(N, 0));
    assert_null(mt_log_softmax(N, 0));
    assert_null(mt_linear(N, w, NULL));
    assert_null(mt_linear(a, N, NULL));
    assert_null(mt_cross_entropy_ex(N, lab, -100));
    assert_null(mt_cross_entropy_ex(a, N, -100));
    mt_tensor *with_null[2] = {a, NULL};
    assert_null(mt_cat(with_null, 2, 0));
    assert_null(mt_stack(with_null, 2, 0));
    assert_null(mt_cast(N, MT_F16));
    assert_null(mt_to(N, mt_test_device()));
    assert_null(mt_reshape(N, MT_SHAPE(6)));
    assert_null(mt_view(N, MT_SHAPE(6)));
    assert_null(mt_transpose(N, 0, 1));
    assert_null(mt_permute(N, MT_DIMS(1, 0)));
    assert_null(mt_narrow(N, 0, 0, 1));
    assert_null(mt_slice(N, 0, 0, 1, 1));
    assert_null(mt_expand(N, MT_SHAPE(2, 3)));
    assert_null(mt_squeeze(N, 0));
    assert_null(mt_unsqueeze(N, 0));
    assert_null(mt_zeros_like(N));
    assert_null(mt_ones_like(N));
    assert_null(mt_empty_like(N));
    assert_null(mt_grad(N));
    assert_true(isnan(mt_item(N)));
    mt_linear_layer layer;
    assert_int_equal(mt_linear_layer_init(&layer, 3, 4, true, MT_F32, mt_test_device()), 0);
    assert_null(mt_linear_layer_forward(&layer, N));
    mt_linear_layer_free(&layer);
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    assert_null(mt_grad_scaler_scale(s, N));
    mt_grad_scaler_free(s);
    /* accessors answer for NULL without an error */
    assert_int_equal(mt_ndim(N), -1);
    assert_int_equal(mt_numel(N), -1);
    assert_false(mt_requires_grad(N));
    assert_false(mt_is_contiguous(N));
    mt_release(N);
    mt_set_requires_grad(N, true);
    mt_zero_grad(N);
    assert_int_equal(mt_last_status(), MT_OK);
    assert_string_equal(mt_last_error(), "");
    mt_release(a);
    mt_release(w);
    mt_release(lab);
    mt_release(cond);
}

/* Functions that return a status report a NULL argument as an error naming it. */
static void test_null_status_functions(void **state) {
    (void)state;
    mt_tensor *a = f32(MT_SHAPE(3));
    float buf[3];
    const char *needles[6] = {"mt_backward: arg 1",     "mt_fill: arg 1",
                              "mt_copy: arg 2",         "mt_add_inplace: arg 1",
                              "mt_copy_to_host: arg 1", "mt_copy_to_host: arg 2"};
    for (int i = 0; i < 6; i++) {
        int rc = 0;
        switch (i) {
        case 0:
            rc = mt_backward(NULL, NULL);
            break;
        case 1:
            rc = mt_fill(NULL, 1);
            break;
        case 2:
            rc = mt_copy(a, NULL);
            break;
        case 3:
            rc = mt_add_inplace(NULL, a);
            break;
        case 4:
            rc = mt_copy_to_host(NULL, buf, sizeof buf);
            break;
        case 5:
            rc = mt_copy_to_host(a, NULL, sizeof buf);
            break;
        }
        assert_int_equal(rc, MT_ERR_NULL);
        assert_error(MT_ERR_NULL, needles[i]);
    }
    mt_release(a);
}

/* A whole step written without checks: the first failure flows through as NULL and the
   step is checked once at the end, with the message of the first error. */
static void test_unchecked_step(void **state) {
    (void)state;
    mt_tensor *x = f32(MT_SHAPE(4, 3)), *w = f32(MT_SHAPE(5, 2)); /* w has the wrong shape */
    mt_set_requires_grad(w, true);
    mt_scope_begin();
    mt_tensor *h = mt_relu(mt_linear(x, w, NULL));
    mt_tensor *loss = mt_mean_all(mt_mul(h, h));
    int rc = mt_backward(loss, NULL);
    mt_scope_end();
    assert_null(h);
    assert_null(loss);
    assert_int_equal(rc, MT_ERR_NULL);                /* backward saw the NULL... */
    assert_int_equal(mt_last_status(), MT_ERR_SHAPE); /* ...but the first error is kept */
    assert_error(MT_ERR_SHAPE, "mt_linear");
    assert_null(mt_grad(w));
    mt_release(x);
    mt_release(w);
}

static void test_first_error_sticks(void **state) {
    (void)state;
    mt_tensor *a = f32(MT_SHAPE(2, 3)), *b = f32(MT_SHAPE(3, 2));
    mt_tensor *i = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    assert_null(mt_add(a, b));
    assert_int_equal(mt_last_status(), MT_ERR_SHAPE);
    char first[512];
    snprintf(first, sizeof first, "%s", mt_last_error());
    assert_null(mt_exp(i));             /* a second, different error */
    assert_null(mt_transpose(a, 0, 9)); /* and a third */
    assert_int_equal(mt_last_status(), MT_ERR_SHAPE);
    assert_string_equal(mt_last_error(), first);
    /* successful calls leave it alone too */
    mt_tensor *ok = mt_add(a, a);
    assert_non_null(ok);
    assert_int_equal(mt_last_status(), MT_ERR_SHAPE);
    mt_clear_error();
    assert_int_equal(mt_last_status(), MT_OK);
    assert_string_equal(mt_last_error(), "");
    assert_null(mt_exp(i));
    assert_error(MT_ERR_DTYPE, "mt_exp");
    assert_string_equal(mt_status_name(MT_ERR_OOM), "out of memory");
    mt_release(ok);
    mt_release(a);
    mt_release(b);
    mt_release(i);
}

/* Errors are per thread. */
static void *other_thread(void *arg) {
    mt_tensor *a = arg;
    int ok = mt_last_status() == MT_OK;
    mt_tensor *r = mt_transpose(a, 0, 5);
    ok = ok && !r && mt_last_status() == MT_ERR_INVALID;
    mt_clear_error();
    return ok ? arg : NULL;
}

static void test_errors_per_thread(void **state) {
    (void)state;
    mt_tensor *a = f32(MT_SHAPE(2, 3)), *b = f32(MT_SHAPE(3, 2));
    assert_null(mt_add(a, b)); /* this thread's error */
    pthread_t th;
    void *res = NULL;
    assert_int_equal(pthread_create(&th, NULL, other_thread, a), 0);
    pthread_join(th, &res);
    assert_ptr_equal(res, a);             /* the other thread started clean */
    assert_error(MT_ERR_SHAPE, "mt_add"); /* and did not clear ours */
    mt_release(a);
    mt_release(b);
}

/* Messages name the op, the argument and the reason with shapes and dtypes. */
static void test_messages(void **state) {
    (void)state;
    mt_tensor *a = f32(MT_SHAPE(2, 3)), *b = f32(MT_SHAPE(4, 5));
    mt_tensor *i = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_tensor *lab = mt_zeros(MT_SHAPE(2), MT_F32, mt_test_device());

    assert_null(mt_matmul(a, b));
    assert_int_equal(mt_last_status(), MT_ERR_SHAPE);
    assert_non_null(strstr(mt_last_error(), "[2, 3]"));
    assert_error(MT_ERR_SHAPE, "mt_matmul: arg 2");

    assert_null(mt_sub(a, b));
    assert_non_null(strstr(mt_last_error(), "[4, 5]"));
    assert_error(MT_ERR_SHAPE, "mt_sub: shapes [2, 3] and [4, 5]");

    assert_null(mt_sum(a, MT_DIMS(2), false));
    assert_error(MT_ERR_INVALID, "mt_sum: arg");

    assert_null(mt_transpose(a, 0, 2));
    assert_error(MT_ERR_INVALID, "mt_transpose: arg");

    assert_null(mt_softmax(a, -3));
    assert_error(MT_ERR_INVALID, "mt_softmax: arg 2");

    assert_null(mt_reshape(a, MT_SHAPE(4)));
    assert_non_null(strstr(mt_last_error(), "[2, 3]"));
    assert_error(MT_ERR_SHAPE, "mt_reshape");

    assert_null(mt_cross_entropy(a, lab));
    assert_non_null(strstr(mt_last_error(), "f32"));
    assert_error(MT_ERR_DTYPE, "mt_cross_entropy: arg 2");

    assert_null(mt_cast(a, (mt_dtype)42));
    assert_error(MT_ERR_DTYPE, "mt_cast: arg 2");

    assert_null(mt_log(i));
    assert_error(MT_ERR_DTYPE, "mt_log: arg 1: dtype i64");

    /* a CUDA ordinal past every device of this machine (cuda:7 where there is none) */
    int missing = mt_cuda_device_count() + 7;
    char want[32];
    snprintf(want, sizeof want, "cuda:%d", missing);
    assert_null(mt_to(a, MT_CUDA(missing)));
    assert_error(MT_ERR_DEVICE, want);

    assert_null(mt_empty(MT_SHAPE(2, -1), MT_F32, mt_test_device()));
    assert_error(MT_ERR_SHAPE, "mt_empty: negative size in shape [2, -1]");

    assert_null(mt_from_data(NULL, MT_F32, MT_SHAPE(2), mt_test_device()));
    assert_error(MT_ERR_NULL, "mt_from_data: arg 1");

    assert_true(isnan(mt_item(a)));
    assert_error(MT_ERR_SHAPE, "mt_item: tensor of shape [2, 3]");

    float small[2];
    assert_int_equal(mt_copy_to_host(a, small, sizeof small), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_copy_to_host: arg 3");

    mt_tensor *ts[2] = {a, b};
    assert_null(mt_cat(ts, 2, 0));
    assert_error(MT_ERR_SHAPE, "mt_cat");

    assert_null(mt_mse_loss(a, b));
    assert_error(MT_ERR_SHAPE, "mt_mse_loss");

    mt_set_requires_grad(a, true);
    assert_int_equal(mt_add_inplace(a, a), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_add_inplace: arg 1");
    mt_release(a);
    mt_release(b);
    mt_release(i);
    mt_release(lab);
}

/* ---- out of memory */
static void test_oom_huge(void **state) {
    (void)state;
    const int64_t huge = (int64_t)1 << 40;
    assert_null(mt_empty(MT_SHAPE(huge), MT_F32, mt_test_device()));
    assert_int_equal(mt_last_status(), MT_ERR_OOM);
    assert_error(MT_ERR_OOM, "mt_empty");
    assert_null(mt_zeros(MT_SHAPE(1 << 20, 1 << 20), MT_F64, mt_test_device()));
    assert_error(MT_ERR_OOM, "mt_zeros");
    assert_null(mt_randn(MT_SHAPE(huge), MT_F16, mt_test_device()));
    assert_error(MT_ERR_OOM, "out of memory");
    /* sizes whose byte count overflows */
    assert_null(mt_empty(MT_SHAPE((int64_t)1 << 62, 4), MT_F64, mt_test_device()));
    assert_error(MT_ERR_OOM, "too large");
    /* a tensor of that size in the middle of an expression */
    mt_tensor *a = f32(MT_SHAPE(1));
    mt_scope_begin();
    mt_tensor *big = mt_expand(a, MT_SHAPE(huge)); /* a view: no memory */
    assert_non_null(big);
    assert_null(mt_exp(big));
    assert_error(MT_ERR_OOM, "mt_exp");
    assert_null(mt_add(big, big));
    assert_error(MT_ERR_OOM, "mt_add");
    mt_scope_end();
    mt_release(a);
}

static void test_oom_alloc_limit(void **state) {
    (void)state;
    mt_tensor *a = mt_rand(MT_SHAPE(1000), MT_F32, mt_test_device()),
              *b = mt_rand(MT_SHAPE(1000), MT_F32, mt_test_device());
    mt_tensor *w = mt_rand(MT_SHAPE(1000, 1000), MT_F32, mt_test_device());
    mt_set_requires_grad(a, true);
    int64_t live = mt_live_tensors(), bytes = mt_live_bytes();
    mt_debug_set_alloc_limit(1024); /* 1000 floats do not fit */
    assert_null(mt_add(a, b));
    assert_error(MT_ERR_OOM, "mt_add");
    assert_null(mt_exp(a));
    assert_error(MT_ERR_OOM, "mt_exp");
    assert_null(mt_cast(b, MT_F16)); /* 2000 bytes */
    assert_error(MT_ERR_OOM, "mt_cast");
    assert_null(mt_sum(w, MT_DIMS(0), false));
    assert_error(MT_ERR_OOM, "out of memory");
    assert_null(mt_matmul(w, w));
    assert_error(MT_ERR_OOM, "out of memory");
    /* ops that fit still work */
    mt_tensor *s = mt_sum_all(a);
    assert_non_null(s);
    assert_no_error();
    mt_release(s);
    mt_debug_set_alloc_limit(0);
    assert_int_equal(mt_live_tensors(), live);
    assert_int_equal(mt_live_bytes(), bytes);
    /* and everything works again */
    mt_tensor *c = mt_add(a, b);
    assert_non_null(c);
    mt_release(c);
    mt_release(a);
    mt_release(b);
    mt_release(w);
}

/* loss = sum(a) + sum(b * b) (or the other way round, so that each branch runs first once):
   the backward of b's branch needs a 256 KiB block, a's needs none. */
static mt_tensor *two_branch_loss(mt_tensor *a, mt_tensor *b, bool b_first) {
    mt_tensor *sa = mt_sum_all(a), *bb = mt_mul(b, b), *sb = mt_sum_all(bb);
    mt_tensor *loss = b_first ? mt_add(sb, sa) : mt_add(sa, sb);
    mt_release(sa);
    mt_release(bb);
    mt_release(sb);
    return loss;
}

static void assert_all(mt_tensor *t, double v, const char *what) {
    mt_tensor *h = mt_to(t, MT_CPU), *f = mt_cast(h, MT_F64);
    const double *d = mt_data_ptr(f);
    for (int64_t i = 0; i < mt_numel(f); i++)
        if (d[i] != v) fail_msg("%s[%lld] = %g, expected %g", what, (long long)i, d[i], v);
    mt_release(h);
    mt_release(f);
}

/* A backward that fails half-way leaves every .grad as it was before the call (an unchecked
   loop would otherwise step half a gradient), and its message names mt_backward and the op
   whose backward failed. */
static void test_failed_backward_changes_no_grad(void **state) {
    (void)state;
    for (int b_first = 0; b_first < 2; b_first++) {
        mt_device dev = mt_test_device();
        mt_tensor *a = mt_ones(MT_SHAPE(4), MT_F32, dev),
                  *b = mt_ones(MT_SHAPE(1 << 16), MT_F32, dev);
        mt_set_requires_grad(a, true);
        mt_set_requires_grad(b, true);
        mt_tensor *loss = two_branch_loss(a, b, b_first);
        assert_int_equal(mt_backward(loss, NULL), 0);
        mt_release(loss);
        loss = two_branch_loss(a, b, b_first);
        assert_no_error();
        mt_debug_set_alloc_limit(64 << 10);
        assert_true(mt_backward(loss, NULL) < 0);
        mt_debug_set_alloc_limit(0);
        if (strncmp(mt_last_error(), "mt_backward: in the backward of mt_", 35) != 0 ||
            strstr(mt_last_error(), "mt_sum: mt_sum") || strstr(mt_last_error(), "mt_mul: mt_mul"))
            fail_msg("message \"%s\" does not start with the entry point and the op",
                     mt_last_error());
        assert_error(MT_ERR_OOM, "out of memory");
        mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
        assert_all(ga, 1.0, "a.grad after the failed backward");
        assert_all(gb, 2.0, "b.grad after the failed backward");
        mt_release(ga);
        mt_release(gb);
        /* the same tape, retried without the limit, completes the accumulation once */
        mt_release(loss);
        loss = two_branch_loss(a, b, b_first);
        assert_int_equal(mt_backward(loss, NULL), 0);
        ga = mt_grad(a);
        gb = mt_grad(b);
        assert_all(ga, 2.0, "a.grad after the second backward");
        assert_all(gb, 4.0, "b.grad after the second backward");
        mt_release(ga);
        mt_release(gb);
        mt_release(loss);
        mt_release(a);
        mt_release(b);
        assert_no_error();
    }
}

/* An error inside a public call names that call first: the autocast cast made by mt_linear
   reads "mt_linear: mt_cast: ...", not just "mt_cast". */
static void test_error_names_entry_point(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_tensor *x = mt_ones(MT_SHAPE(2, 1 << 15), MT_F32, dev);
    mt_tensor *w = mt_ones(MT_SHAPE(2, 1 << 15), MT_F32, dev);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_debug_set_alloc_limit(64 << 10); /* the F16 copy of x (128 KiB) cannot be made */
    assert_null(mt_linear(x, w, NULL));
    mt_debug_set_alloc_limit(0);
    mt_autocast_end();
    if (strncmp(mt_last_error(), "mt_linear: ", 11) != 0)
        fail_msg("message \"%s\" does not start with \"mt_linear: \"", mt_last_error());
    assert_error(MT_ERR_OOM, "out of memory");
    /* a message that already starts with the entry point is not prefixed twice */
    mt_tensor *three = mt_ones(MT_SHAPE(3), MT_F32, dev);
    assert_null(mt_add(x, three));
    mt_release(three);
    if (strncmp(mt_last_error(), "mt_add: ", 8) != 0 || strstr(mt_last_error(), "mt_add: mt_add"))
        fail_msg("message \"%s\"", mt_last_error());
    mt_clear_error();
    mt_release(x);
    mt_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_null_propagates),
        MT_TEST(test_null_status_functions),
        MT_TEST(test_unchecked_step),
        MT_TEST(test_first_error_sticks),
        MT_TEST(test_errors_per_thread),
        MT_TEST(test_messages),
        MT_TEST(test_oom_huge),
        MT_TEST(test_oom_alloc_limit),
        MT_TEST(test_failed_backward_changes_no_grad),
        MT_TEST(test_error_names_entry_point),
    };
    return MT_RUN_TESTS(tests);
}

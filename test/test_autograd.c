/* The backward engine: order, accumulation, grad mode, detach, tape lifetime, version
   counters, errors, long chains, scopes and reference cycles. */
#include <pthread.h>
#include "test_util.h"

static mt_tensor *leaf_from(const double *v, int ndim, const int64_t *shape) {
    mt_tensor *t = mt_from_data(v, MT_F64, ndim, shape, mt_test_device());
    mt_set_requires_grad(t, true);
    return t;
}

/* Outside scopes only (the value helpers release what they create). */
static void assert_grad(mt_tensor *t, const double *expect, int64_t n, double tol) {
    mt_tensor *g = mt_grad(t);
    if (!g) fail_msg("no gradient (%s)", mt_last_error());
    assert_tensor_close(g, expect, n, tol, tol);
    mt_release(g);
}

/* A diamond whose two paths have very different lengths: x feeds a long chain and a short
   one that meet at z. x's node may run only after both paths delivered their gradient;
   running it earlier would send a partial gradient to the leaf. */
static void test_diamond_order(void **state) {
    (void)state;
    double v[3] = {0.5, -1.0, 2.0};
    mt_tensor *w = leaf_from(v, MT_SHAPE(3));
    mt_scope_begin();
    mt_tensor *x = mt_mul_scalar(w, 3.0); /* non-leaf: its node waits for both consumers */
    mt_tensor *longp = x;
    for (int i = 0; i < 20; i++) longp = mt_add_scalar(longp, 0.1);
    longp = mt_mul(longp, x); /* (x + 2) * x */
    mt_tensor *shortp = mt_exp(x);
    mt_tensor *z = mt_add(longp, shortp);
    assert_string_equal(mt_grad_fn_name(z), "add");
    assert_string_equal(mt_grad_fn_name(x), "mul_scalar");
    assert_string_equal(mt_grad_fn_name(w), "");
    assert_int_equal(mt_backward(mt_sum_all(z), NULL), 0);
    mt_scope_end();
    assert_no_error();
    /* dz/dw = 3 * (2x + 2 + exp(x)), x = 3w */
    double e[3];
    for (int i = 0; i < 3; i++) {
        double xi = 3 * v[i];
        e[i] = 3 * (2 * xi + 2 + exp(xi));
    }
    assert_grad(w, e, 3, 1e-12);
    mt_release(w);
}

/* A tensor used several times gets the sum of the gradients of every use. */
static void test_multiple_uses(void **state) {
    (void)state;
    double v[4] = {1, 2, -3, 0.5};
    mt_tensor *x = leaf_from(v, MT_SHAPE(4));
    mt_scope_begin();
    mt_tensor *y = mt_add(mt_mul(x, x), x);  /* x^2 + x */
    mt_tensor *y2 = mt_add(y, mt_add(x, x)); /* + 2x */
    assert_int_equal(mt_backward(mt_sum_all(y2), NULL), 0);
    mt_scope_end();
    double e[4];
    for (int i = 0; i < 4; i++) e[i] = 2 * v[i] + 3;
    assert_grad(x, e, 4, 1e-12);
    mt_release(x);
}

static void test_leaf_grad_accumulates(void **state) {
    (void)state;
    double v[2] = {1.5, -2};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2));
    double e1[2] = {3, -4}, e2[2] = {6, -8}, e3[2] = {1, 1};
    for (int step = 0; step < 2; step++) {
        mt_scope_begin();
        assert_int_equal(mt_backward(mt_sum_all(mt_mul(x, x)), NULL), 0);
        mt_scope_end();
        assert_grad(x, step == 0 ? e1 : e2, 2, 1e-12);
    }
    mt_zero_grad(x);
    assert_null(mt_grad(x));
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(x), NULL), 0);
    mt_scope_end();
    assert_grad(x, e3, 2, 0);
    mt_release(x);
    assert_no_error();
}

static void test_grad_disabled(void **state) {
    (void)state;
    double v[2] = {1, 2};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2));
    assert_true(mt_is_grad_enabled());
    assert_true(mt_set_grad_enabled(false));
    assert_false(mt_is_grad_enabled());
    mt_tensor *y = mt_exp(x), *z = mt_sum_all(y);
    assert_false(mt_requires_grad(y));
    assert_false(mt_requires_grad(z));
    assert_true(mt_is_leaf(y));
    assert_string_equal(mt_grad_fn_name(y), "");
    assert_false(mt_set_grad_enabled(true)); /* returns the previous mode */
    assert_true(mt_is_grad_enabled());
    assert_int_equal(mt_backward(z, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "does not require grad");
    assert_null(mt_grad(x));
    mt_release(y);
    mt_release(z);
    mt_release(x);
}

static void test_detach(void **state) {
    (void)state;
    double v[3] = {1, 2, 3};
    mt_tensor *x = leaf_from(v, MT_SHAPE(3));
    mt_scope_begin();
    mt_tensor *y = mt_mul_scalar(x, 2), *d = mt_detach(y);
    assert_true(mt_requires_grad(y));
    assert_false(mt_requires_grad(d));
    assert_true(mt_is_leaf(d));
    assert_ptr_equal(mt_test_data_addr(d), mt_test_data_addr(y)); /* shares storage */
    /* x * detach(2x): the detached factor is a constant */
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(x, d)), NULL), 0);
    mt_scope_end();
    double e[3] = {2, 4, 6};
    assert_grad(x, e, 3, 0);
    mt_release(x);
}

static void test_tape_freed_after_backward(void **state) {
    (void)state;
    double v[2] = {1, 3};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2));
    mt_scope_begin();
    mt_tensor *l = mt_sum_all(mt_mul(x, x));
    assert_int_equal(mt_backward(l, NULL), 0);
    assert_int_equal(mt_backward(l, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "already freed");
    mt_scope_end();
    double e[2] = {2, 6}, e2[2] = {4, 12};
    assert_grad(x, e, 2, 0); /* the failed second call added nothing */
    mt_zero_grad(x);
    /* retain_graph keeps it for another pass (no scope: the grad is checked in between) */
    mt_tensor *y = mt_mul(x, x);
    l = mt_sum_all(y);
    assert_int_equal(mt_backward_ex(l, NULL, true), 0);
    assert_int_equal(mt_backward_ex(l, NULL, true), 0);
    assert_grad(x, e2, 2, 0);
    assert_int_equal(mt_backward(l, NULL), 0); /* the last one may free it */
    assert_int_equal(mt_backward(l, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "retain_graph");
    mt_release(y);
    mt_release(l);
    mt_release(x);
}

static void test_version_counter(void **state) {
    (void)state;
    double v[3] = {1, 2, 3};
    mt_tensor *x = leaf_from(v, MT_SHAPE(3)), *w = leaf_from(v, MT_SHAPE(3));
    mt_tensor *one = mt_ones(MT_SHAPE(3), MT_F64, mt_test_device());
    /* mul saves both inputs; w changes in place (an optimizer-like update) before backward */
    mt_scope_begin();
    mt_tensor *l = mt_sum_all(mt_mul(x, w));
    bool prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_add_inplace(w, one), 0);
    mt_set_grad_enabled(prev);
    assert_int_equal(mt_backward(l, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "modified in place");
    mt_scope_end();
    /* exp saves its output; fill it under no-grad, then backward through it */
    mt_scope_begin();
    mt_tensor *y = mt_exp(x);
    l = mt_sum_all(mt_mul_scalar(y, 2.0));
    prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_fill(y, 0.0), 0);
    mt_set_grad_enabled(prev);
    assert_int_equal(mt_backward(l, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_exp");
    mt_scope_end();
    /* a change made to a tensor that was not saved is fine */
    mt_scope_begin();
    mt_tensor *c = mt_clone(x);
    l = mt_sum_all(mt_add(c, w)); /* add saves nothing */
    prev = mt_set_grad_enabled(false);
    assert_int_equal(mt_fill(w, 5.0), 0);
    mt_set_grad_enabled(prev);
    assert_int_equal(mt_backward(l, NULL), 0);
    mt_scope_end();
    double e[3] = {1, 1, 1};
    assert_grad(x, e, 3, 0);
    mt_release(one);
    mt_release(x);
    mt_release(w);
}

static void test_backward_errors(void **state) {
    (void)state;
    double v[4] = {1, 2, 3, 4};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2, 2));
    mt_scope_begin();
    mt_tensor *y = mt_mul_scalar(x, 2);
    assert_int_equal(mt_backward(y, NULL), MT_ERR_SHAPE);
    assert_error(MT_ERR_SHAPE, "[2, 2]");
    mt_tensor *bad = mt_ones(MT_SHAPE(4), MT_F64, mt_test_device());
    assert_int_equal(mt_backward(y, bad), MT_ERR_SHAPE);
    const char *m = mt_last_error();
    assert_non_null(strstr(m, "[4]"));
    assert_non_null(strstr(m, "[2, 2]"));
    mt_clear_error();
    assert_int_equal(mt_backward(NULL, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_backward: arg 1");
    /* a non-scalar root with an explicit gradient works, also in another dtype */
    mt_tensor *g = mt_full(MT_SHAPE(2, 2), MT_F32, mt_test_device(), 0.5);
    assert_int_equal(mt_backward(y, g), 0);
    mt_scope_end();
    double e[4] = {1, 1, 1, 1};
    assert_grad(x, e, 4, 0);
    /* requires_grad rules */
    mt_scope_begin();
    y = mt_exp(x);
    mt_set_requires_grad(y, false);
    assert_error(MT_ERR_STATE, "not a leaf");
    mt_tensor *i = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_set_requires_grad(i, true);
    assert_error(MT_ERR_DTYPE, "floating");
    assert_false(mt_requires_grad(i));
    /* a leaf that needs no grad */
    mt_tensor *c = mt_ones(MT_SHAPE(1), MT_F64, mt_test_device());
    assert_int_equal(mt_backward(c, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "does not require grad");
    mt_scope_end();
    /* backward on a leaf itself accumulates the seed */
    mt_tensor *s = mt_ones(MT_SHAPE(1), MT_F64, mt_test_device());
    mt_set_requires_grad(s, true);
    assert_int_equal(mt_backward(s, NULL), 0);
    double one = 1;
    assert_grad(s, &one, 1, 0);
    mt_release(s);
    mt_release(x);
}

/* Non-leaf tensors keep no .grad; only leaves that require grad receive one. */
static void test_only_leaves_get_grads(void **state) {
    (void)state;
    double v[2] = {1, 2};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2));
    mt_tensor *k = mt_from_data(v, MT_F64, MT_SHAPE(2), mt_test_device()); /* constant */
    mt_scope_begin();
    mt_tensor *y = mt_mul(x, k);
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    assert_null(mt_grad(y));
    assert_null(mt_grad(k));
    mt_scope_end();
    assert_grad(x, v, 2, 0);
    mt_release(x);
    mt_release(k);
}

#define CHAIN 100000

static void test_long_chain(void **state) {
    (void)state;
    double v = 0.0;
    mt_tensor *x = leaf_from(&v, MT_SHAPE(1));
    /* backward over the chain, then freeing it */
    mt_tensor *y = mt_retain(x);
    for (int i = 0; i < CHAIN; i++) {
        mt_tensor *n = mt_add_scalar(y, 1e-3);
        mt_release(y);
        y = n;
    }
    assert_no_error();
    assert_int_equal(mt_backward(y, NULL), 0);
    double one = 1;
    assert_grad(x, &one, 1, 0);
    mt_release(y);
    /* freeing an unused chain (no backward) must not recurse either */
    y = mt_retain(x);
    for (int i = 0; i < CHAIN; i++) {
        mt_tensor *n = i % 2 ? mt_mul_scalar(y, 1.0) : mt_exp(y); /* exp saves its output */
        mt_release(y);
        y = n;
    }
    assert_no_error();
    mt_release(y);
    mt_release(x);
}

/* Ending the scope that owns the forward results does not break a pending backward: the
   tape holds what it needs. */
static void test_scope_end_before_backward(void **state) {
    (void)state;
    double v[3] = {0.1, 0.2, 0.3};
    mt_tensor *x = leaf_from(v, MT_SHAPE(3));
    mt_scope_begin();
    mt_tensor *l = mt_sum_all(mt_mul(mt_sigmoid(x), mt_exp(x)));
    mt_retain(l);
    mt_scope_end();
    assert_int_equal(mt_backward(l, NULL), 0);
    mt_release(l);
    double e[3];
    for (int i = 0; i < 3; i++) {
        double s = 1 / (1 + exp(-v[i])), ex = exp(v[i]);
        e[i] = s * (1 - s) * ex + s * ex;
    }
    assert_grad(x, e, 3, 1e-12);
    mt_release(x);
}

/* Saved outputs must not keep their own node alive: everything is freed when the user's
   references go, with or without a backward. */
static void test_no_reference_cycles(void **state) {
    (void)state;
    int64_t t0 = mt_live_tensors(), b0 = mt_live_bytes();
    double v[4] = {0.1, 0.2, 0.3, 0.4};
    mt_tensor *x = leaf_from(v, MT_SHAPE(4));
    for (int pass = 0; pass < 3; pass++) {
        mt_scope_begin();
        /* ops that save their output (exp, sigmoid, tanh, sqrt, div) and their input */
        mt_tensor *a = mt_exp(x), *b = mt_sigmoid(a), *c = mt_tanh(b), *d = mt_sqrt(a);
        mt_tensor *e = mt_div(c, d), *l = mt_sum_all(mt_mul(e, x));
        if (pass == 1) assert_int_equal(mt_backward(l, NULL), 0);
        if (pass == 2) assert_int_equal(mt_backward_ex(l, NULL, true), 0);
        mt_scope_end();
    }
    assert_no_error();
    mt_zero_grad(x);
    mt_release(x);
    assert_int_equal(mt_live_tensors(), t0);
    assert_int_equal(mt_live_bytes(), b0);
}

/* Gradients reaching a leaf in another dtype are cast to the leaf's dtype. */
static void test_grad_dtype(void **state) {
    (void)state;
    mt_tensor *h = mt_full(MT_SHAPE(3), MT_F16, mt_test_device(), 2.0),
              *f = mt_full(MT_SHAPE(3), MT_F32, mt_test_device(), 3.0);
    mt_set_requires_grad(h, true);
    mt_set_requires_grad(f, true);
    mt_scope_begin();
    mt_tensor *y = mt_mul(h, f); /* f32 */
    assert_int_equal(mt_dtype_of(y), MT_F32);
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    mt_scope_end();
    mt_tensor *gh = mt_grad(h), *gf = mt_grad(f);
    assert_int_equal(mt_dtype_of(gh), MT_F16);
    assert_int_equal(mt_dtype_of(gf), MT_F32);
    double eh[3] = {3, 3, 3}, ef[3] = {2, 2, 2};
    assert_tensor_close(gh, eh, 3, 0, 0);
    assert_tensor_close(gf, ef, 3, 0, 0);
    mt_release(gh);
    mt_release(gf);
    mt_release(h);
    mt_release(f);
}

/* mt_set_grad: a user-provided gradient accumulates like one from backward. */
static void test_set_grad(void **state) {
    (void)state;
    double v[2] = {1, 2};
    mt_tensor *x = leaf_from(v, MT_SHAPE(2));
    mt_tensor *g = mt_full(MT_SHAPE(2), MT_F64, mt_test_device(), 10);
    assert_int_equal(mt_set_grad(x, g), 0);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(x), NULL), 0);
    mt_scope_end();
    double e[2] = {11, 11};
    assert_grad(x, e, 2, 0);
    /* a grad whose elements share memory (an expanded view) is not added to in place */
    mt_tensor *one = mt_full(MT_SHAPE(1), MT_F64, mt_test_device(), 5),
              *ex = mt_expand(one, MT_SHAPE(2));
    assert_int_equal(mt_set_grad(x, ex), 0);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(x, x)), NULL), 0);
    mt_scope_end();
    double e2[2] = {5 + 2 * v[0], 5 + 2 * v[1]};
    assert_grad(x, e2, 2, 0);
    assert_true(mt_item(one) == 5);
    mt_release(ex);
    mt_release(one);
    mt_tensor *bad = mt_ones(MT_SHAPE(3), MT_F64, mt_test_device());
    assert_int_equal(mt_set_grad(x, bad), MT_ERR_SHAPE);
    assert_error(MT_ERR_SHAPE, "mt_set_grad: arg 2");
    assert_int_equal(mt_set_grad(x, NULL), 0);
    assert_null(mt_grad(x));
    mt_release(bad);
    mt_release(g);
    mt_release(x);
}

/* A backward that fails half-way (out of memory) reports it and leaks nothing. */
static void test_backward_oom(void **state) {
    (void)state;
    mt_tensor *x = mt_ones(MT_SHAPE(1000), MT_F32, mt_test_device());
    mt_set_requires_grad(x, true);
    mt_scope_begin();
    mt_tensor *l = mt_sum_all(mt_mul(mt_exp(x), x));
    mt_debug_set_alloc_limit(1000); /* gradients of 4000 bytes cannot be made */
    int rc = mt_backward(l, NULL);
    mt_debug_set_alloc_limit(0);
    assert_int_equal(rc, MT_ERR_OOM);
    assert_error(MT_ERR_OOM, "out of memory");
    mt_scope_end();
    mt_release(x);
}

/* Threads record and run their own tapes; grad mode is per thread. Tensors made on one
   thread may be freed on another. */
static void *thread_step(void *arg) {
    mt_tensor *shared = arg;
    bool off = mt_set_grad_enabled(false); /* only this thread */
    mt_set_grad_enabled(off);
    double v[3] = {1, 2, 3};
    mt_tensor *x = mt_from_data(v, MT_F64, MT_SHAPE(3), mt_test_device());
    mt_set_requires_grad(x, true);
    for (int i = 0; i < 200; i++) {
        mt_scope_begin();
        mt_backward(mt_sum_all(mt_mul(mt_mul(x, x), shared)), NULL);
        mt_scope_end();
    }
    mt_tensor *g = mt_grad(x);
    double gv[3] = {0};
    mt_copy_to_host(g, gv, sizeof gv);
    bool ok = mt_last_status() == MT_OK;
    for (int j = 0; j < 3; j++) ok = ok && gv[j] == 200 * 2 * v[j] * 0.5;
    mt_release(g);
    mt_release(x);
    mt_set_grad_enabled(false);        /* must not leak into other threads */
    return ok ? mt_exp(shared) : NULL; /* released by the main thread */
}

static void test_threads(void **state) {
    (void)state;
    mt_tensor *shared = mt_full(MT_SHAPE(3), MT_F64, mt_test_device(), 0.5);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thread_step, shared), 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        assert_non_null(r);
        mt_release(r);
    }
    assert_true(mt_is_grad_enabled());
    mt_release(shared);
}

/* Regression: mt_gradcheck called while the caller has a scope open. Its internal cast of
   each gradient was tracked by the caller's scope and also released by gradcheck, so
   mt_scope_end released it a second time (use after free). */
static mt_tensor *gradcheck_mul_tanh(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_sum_all(mt_tanh(mt_mul(in[0], in[1])));
}
static void test_gradcheck_inside_scope(void **state) {
    (void)state;
    mt_tensor *a =
        mt_from_data((const double[]){0.1, -0.4, 0.7}, MT_F64, MT_SHAPE(3), mt_test_device());
    mt_tensor *b =
        mt_from_data((const double[]){0.5, 0.3, -0.2}, MT_F64, MT_SHAPE(3), mt_test_device());
    mt_set_requires_grad(a, true);
    mt_set_requires_grad(b, true);
    int64_t before = mt_live_tensors();
    mt_scope_begin();
    assert_int_equal(mt_gradcheck(gradcheck_mul_tanh, (mt_tensor *[]){a, b}, 2, NULL, NULL), 0);
    mt_scope_end();
    assert_no_error();
    assert_int_equal(mt_live_tensors(), before);
    mt_release(a);
    mt_release(b);
}

/* mt_gradcheck itself: it must catch a wrong gradient (here the second factor is detached,
   so its analytic gradient is missing), leave the inputs' existing .grad as they were, and
   refuse inputs finite differences cannot check. */
static mt_tensor *gradcheck_wrong(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_mul(in[0], mt_detach(in[1]));
}
static void test_gradcheck_catches_and_refuses(void **state) {
    (void)state;
    mt_tensor *a =
        mt_from_data((const double[]){0.1, -0.4, 0.7}, MT_F64, MT_SHAPE(3), mt_test_device());
    mt_tensor *b =
        mt_from_data((const double[]){0.5, 0.3, -0.2}, MT_F64, MT_SHAPE(3), mt_test_device());
    mt_set_requires_grad(a, true);
    mt_set_requires_grad(b, true);
    mt_tensor *kept = mt_full(MT_SHAPE(3), MT_F64, mt_test_device(), 7.0);
    assert_int_equal(mt_set_grad(a, kept), 0);
    assert_int_equal(mt_gradcheck(gradcheck_wrong, (mt_tensor *[]){a, b}, 2, NULL, NULL),
                     MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_gradcheck: input 1 element 0: analytic gradient 0");
    mt_tensor *g = mt_grad(a);
    assert_ptr_equal(g, kept); /* restored, not accumulated into */
    mt_release(g);
    /* the same tensor given twice: its gradient is still restored, not freed */
    assert_int_equal(mt_gradcheck(gradcheck_mul_tanh, (mt_tensor *[]){a, a}, 2, NULL, NULL), 0);
    g = mt_grad(a);
    assert_ptr_equal(g, kept);
    assert_tensor_close(g, ((const double[]){7, 7, 7}), 3, 0, 0);
    mt_release(g);
    /* the correct function passes on the same inputs */
    assert_int_equal(mt_gradcheck(gradcheck_mul_tanh, (mt_tensor *[]){a, b}, 2, NULL, NULL), 0);

    mt_tensor *f = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_set_requires_grad(f, true);
    assert_int_equal(mt_gradcheck(gradcheck_mul_tanh, (mt_tensor *[]){f, b}, 2, NULL, NULL),
                     MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "input 0 is f32; finite differences need f64");
    mt_tensor *c = mt_zeros(MT_SHAPE(3), MT_F64, mt_test_device());
    assert_int_equal(mt_gradcheck(gradcheck_mul_tanh, (mt_tensor *[]){c, c}, 2, NULL, NULL),
                     MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "no input requires grad");
    assert_int_equal(mt_gradcheck(NULL, (mt_tensor *[]){a, b}, 2, NULL, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_gradcheck: arg 1");
    mt_release(c);
    mt_release(f);
    mt_release(kept);
    mt_release(a);
    mt_release(b);
}

/* mt_gradcheck perturbs its inputs in place, element by element, and must put every element
   back bit for bit, after a failed check too. A transposed leaf makes logical element j a
   different storage element than j: perturbing the wrong one would not match the analytic
   gradient, which differs per element here. */
static mt_tensor *gradcheck_exp_weighted(mt_tensor *const *in, void *ctx) {
    return mt_mul(mt_exp(in[0]), (mt_tensor *)ctx);
}
static mt_tensor *gradcheck_half_detached(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_mul(in[0], mt_detach(in[0])); /* analytic x, numeric 2x */
}
static void test_gradcheck_strided_input_restored(void **state) {
    (void)state;
    const double v[6] = {0.3, -1.2, 0.8, 2.0, -0.5, 0.1};
    mt_tensor *base = mt_from_data(v, MT_F64, MT_SHAPE(2, 3), mt_test_device());
    mt_tensor *x = mt_transpose(base, 0, 1); /* [3, 2], strides [1, 3] */
    mt_set_requires_grad(x, true);
    assert_true(mt_is_leaf(x));
    assert_false(mt_is_contiguous(x));
    mt_tensor *w = mt_test_tensor((const double[]){1, -2, 3, -4, 5, -6}, MT_F64, MT_SHAPE(3, 2));
    assert_int_equal(mt_gradcheck(gradcheck_exp_weighted, &x, 1, w, NULL), 0);
    double after[6];
    assert_int_equal(mt_copy_to_host(base, after, sizeof after), 0);
    assert_memory_equal(after, v, sizeof v);
    assert_int_equal(mt_gradcheck(gradcheck_half_detached, &x, 1, NULL, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_gradcheck: input 0 element 0");
    assert_int_equal(mt_copy_to_host(base, after, sizeof after), 0);
    assert_memory_equal(after, v, sizeof v);
    assert_null(mt_grad(x)); /* it had none before either */
    mt_release(w);
    mt_release(x);
    mt_release(base);
}

/* A gradient that is the tensor itself, or holds it as its own gradient, would be a reference
   cycle that frees neither: refused, and nothing leaks (the fixture checks). */
static void test_set_grad_refuses_cycles(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *b = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    assert_int_equal(mt_set_grad(a, a), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "reference cycle");
    assert_int_equal(mt_set_grad(a, b), 0);
    assert_int_equal(mt_set_grad(b, a), MT_ERR_INVALID); /* b -> a -> b */
    assert_error(MT_ERR_INVALID, "reference cycle");
    mt_tensor *v = mt_reshape(a, MT_SHAPE(3)); /* a view shares storage, not the tensor: fine */
    assert_int_equal(mt_set_grad(b, v), 0);
    mt_release(v);
    assert_int_equal(mt_set_grad(a, NULL), 0);
    assert_int_equal(mt_set_grad(b, NULL), 0);
    mt_release(a);
    mt_release(b);
}

/* Two threads running backward into one shared leaf at the same time lose no update (torch
   documents this as safe): the leaf's gradient is exactly the sum of every backward. */
typedef struct {
    mt_tensor *w;
    double scale;
    int steps, failed;
} shared_leaf_job;
static void *shared_leaf_worker(void *arg) {
    shared_leaf_job *j = arg;
    for (int i = 0; i < j->steps; i++) {
        mt_scope_begin();
        mt_tensor *y = mt_sum_all(mt_mul_scalar(j->w, j->scale));
        if (mt_backward(y, NULL) != 0) j->failed = 1;
        mt_scope_end();
    }
    if (mt_last_status() != MT_OK) j->failed = 1;
    return NULL;
}
static void test_shared_leaf_threads(void **state) {
    (void)state;
    mt_tensor *w = mt_ones(MT_SHAPE(1 << 20), MT_F64, mt_test_device());
    mt_set_requires_grad(w, true);
    shared_leaf_job jobs[2] = {{w, 1.0, 40, 0}, {w, 2.0, 40, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, shared_leaf_worker, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_false(jobs[0].failed || jobs[1].failed);
    mt_tensor *g = mt_grad(w);
    double *v = mt_test_values(g);
    for (int i = 0; i < (1 << 20); i++)
        if (v[i] != 120.0)
            fail_msg("element %d of the shared gradient is %g, expected 120", i, v[i]);
    free(v);
    mt_release(g);
    mt_release(w);
}

/* Threads running backward through a shared non-leaf part of one graph (h below): a backward
   that reaches a node another thread's backward holds fails, naming the op, and changes
   nothing; the ones that run are exact (the leaf's gradient is the sum of exactly those).
   The per-backward counts live in the nodes, so two at once used to corrupt them. */
typedef struct {
    mt_tensor *h;
    int steps, ran, refused, other;
} shared_node_job;
static void *shared_node_worker(void *arg) {
    shared_node_job *j = arg;
    for (int i = 0; i < j->steps; i++) {
        mt_scope_begin();
        int rc = mt_backward_ex(mt_sum_all(mt_mul_scalar(j->h, 2.0)), NULL, true);
        if (rc == 0)
            j->ran++;
        else if (rc == MT_ERR_STATE && strstr(mt_last_error(), "another thread"))
            j->refused++;
        else
            j->other++;
        mt_clear_error();
        mt_scope_end();
    }
    return NULL;
}
static void test_shared_node_threads(void **state) {
    (void)state;
    mt_tensor *x = mt_ones(MT_SHAPE(64), MT_F64, mt_test_device());
    mt_set_requires_grad(x, true);
    mt_tensor *a = mt_add_scalar(x, 1.0);
    mt_tensor *h = mt_mul_scalar(a, 3.0); /* shared nodes: mul, add */
    shared_node_job jobs[2] = {{h, 200, 0, 0, 0}, {h, 200, 0, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, shared_node_worker, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(jobs[0].other + jobs[1].other, 0);
    int ran = jobs[0].ran + jobs[1].ran;
    assert_true(ran > 0);
    mt_tensor *g = mt_grad(x);
    double *v = mt_test_values(g);
    for (int i = 0; i < 64; i++)
        if (v[i] != 6.0 * ran)
            fail_msg("element %d of the gradient is %g after %d backwards, expected %g", i, v[i],
                     ran, 6.0 * ran);
    free(v);
    mt_release(g);
    mt_release(h);
    mt_release(a);
    mt_release(x);
}

static int count_ready(mt_tensor *leaf, void *user) {
    (void)leaf;
    ++*(int *)user;
    return 0;
}

/* requires_grad switched off on a leaf after the ops that used it, before backward (a
   parameter frozen mid-graph): it gets no gradient and fires no hook, as torch; the other
   leaf still gets its own. */
static void test_leaf_frozen_before_backward(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_tensor *x = mt_full(MT_SHAPE(3), MT_F32, dev, 2.0);
    mt_tensor *w = mt_full(MT_SHAPE(3), MT_F32, dev, 3.0);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(w, true);
    int fired = 0;
    assert_true(mt_tensor_register_grad_ready_hook(x, count_ready, &fired) > 0);
    mt_scope_begin();
    mt_tensor *y = mt_sum_all(mt_mul(mt_mul(x, x), w));
    mt_set_requires_grad(x, false);
    assert_int_equal(mt_backward(y, NULL), 0);
    mt_scope_end();
    assert_null(mt_grad(x));
    assert_int_equal(fired, 0);
    mt_tensor *gw = mt_grad(w);
    double want[3] = {4, 4, 4};
    assert_tensor_close(gw, want, 3, 0, 0);
    mt_release(gw);
    assert_no_error();
    mt_release(x);
    mt_release(w);
}

/* Allocations of a backward from a fresh graph: the walk of mt_debug_fail_nth_alloc ends at
   the first n the call does not reach. */
static int64_t backward_allocations(bool through_reshape) {
    for (int64_t n = 1;; n++) {
        mt_scope_begin();
        mt_tensor *w = mt_ones(MT_SHAPE(1024), MT_F32, mt_test_device());
        mt_set_requires_grad(w, true);
        mt_tensor *y = through_reshape ? mt_reshape(w, MT_SHAPE(32, 32)) : w;
        mt_tensor *l = mt_sum_all(mt_mul_scalar(y, 2.0));
        mt_debug_fail_nth_alloc(n);
        int rc = mt_backward(l, NULL);
        bool never_reached = mt_debug_fail_nth_alloc(0);
        mt_clear_error();
        mt_scope_end();
        if (never_reached) {
            assert_int_equal(rc, 0);
            return n - 1;
        }
    }
}

/* A gradient that comes through a view op's backward is still adopted as the leaf's .grad:
   the backward's view (made with grad mode off) holds no reference to the gradient, so the
   one extra allocation is that view's header, not a copy of the gradient. */
static void test_grad_through_view_adopted(void **state) {
    (void)state;
    int64_t plain = backward_allocations(false), viewed = backward_allocations(true);
    if (viewed > plain + 1)
        fail_msg("a backward through mt_reshape made %lld allocations, %lld without it",
                 (long long)viewed, (long long)plain);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_diamond_order),
        MT_TEST(test_multiple_uses),
        MT_TEST(test_leaf_grad_accumulates),
        MT_TEST(test_grad_disabled),
        MT_TEST(test_detach),
        MT_TEST(test_tape_freed_after_backward),
        MT_TEST(test_version_counter),
        MT_TEST(test_backward_errors),
        MT_TEST(test_only_leaves_get_grads),
        MT_TEST(test_long_chain),
        MT_TEST(test_scope_end_before_backward),
        MT_TEST(test_no_reference_cycles),
        MT_TEST(test_grad_dtype),
        MT_TEST(test_set_grad),
        MT_TEST(test_backward_oom),
        MT_TEST(test_threads),
        MT_TEST(test_gradcheck_inside_scope),
        MT_TEST(test_gradcheck_catches_and_refuses),
        MT_TEST(test_gradcheck_strided_input_restored),
        MT_TEST(test_set_grad_refuses_cycles),
        MT_TEST(test_shared_leaf_threads),
        MT_TEST(test_shared_node_threads),
        MT_TEST(test_leaf_frozen_before_backward),
        MT_TEST(test_grad_through_view_adopted),
    };
    return MT_RUN_TESTS(tests);
}

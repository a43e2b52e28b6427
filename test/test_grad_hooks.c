/* Gradient-ready hooks: called once per backward, when the leaf's gradient is final (every
   path delivered), in order of readiness; errors from hooks stop backward; argument errors. */
#include "test_util.h"

typedef struct {
    int calls;
    double seen[4];  /* sum of the leaf's gradient at each call */
    int *log, *nlog; /* shared log of a test */
    int tag;
    int fail_with;
} recorder;

static double grad_sum(mt_tensor *leaf) {
    mt_tensor *g = mt_grad(leaf);
    if (!g) return NAN;
    mt_tensor *s = mt_sum_all(g);
    double v = mt_item(s);
    mt_release(s);
    mt_release(g);
    return v;
}

static int record(mt_tensor *leaf, void *user) {
    recorder *r = user;
    if (r->calls < 4) r->seen[r->calls] = grad_sum(leaf);
    r->calls++;
    if (r->log) r->log[(*r->nlog)++] = r->tag;
    return r->fail_with;
}

static mt_tensor *leaf(double v, int64_t n) {
    mt_tensor *t = mt_full(MT_SHAPE(n), MT_F32, mt_test_device(), v);
    mt_set_requires_grad(t, true);
    return t;
}

/* w reaches the loss on a long and a short path: the hook must wait for both. */
static void test_hook_sees_final_gradient(void **state) {
    (void)state;
    mt_tensor *w = leaf(2.0, 3), *unused = leaf(1.0, 3);
    recorder r = {0}, ru = {0};
    int h = mt_tensor_register_grad_ready_hook(w, record, &r);
    assert_true(h > 0);
    assert_true(mt_tensor_register_grad_ready_hook(unused, record, &ru) > 0);
    for (int step = 0; step < 2; step++) {
        mt_scope_begin();
        mt_tensor *longp = w;
        for (int i = 0; i < 20; i++) longp = mt_mul_scalar(longp, 1.0);
        mt_tensor *y = mt_add(mt_mul_scalar(longp, 3.0), mt_mul(w, w)); /* dy/dw = 3 + 2w = 7 */
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        mt_scope_end();
    }
    assert_int_equal(r.calls, 2);               /* once per backward */
    assert_true(fabs(r.seen[0] - 21.0) < 1e-5); /* the full gradient, not a part of it */
    assert_true(fabs(r.seen[1] - 42.0) < 1e-5); /* accumulated over two backwards */
    assert_int_equal(ru.calls, 0);              /* not reached: not called */
    assert_int_equal(mt_tensor_remove_grad_ready_hook(w, h), 0);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(mt_mul_scalar(w, 1.0)), NULL), 0);
    mt_scope_end();
    assert_int_equal(r.calls, 2); /* removed */
    mt_release(w);
    mt_release(unused);
}

/* In a two-layer chain the layer nearer the loss is ready first (what DDP buckets rely on). */
static void test_hook_order_follows_backward(void **state) {
    (void)state;
    mt_tensor *w1 = leaf(0.5, 4), *w2 = leaf(0.25, 4),
              *x = mt_full(MT_SHAPE(4), MT_F32, mt_test_device(), 1.0);
    int log[8], nlog = 0;
    recorder r1 = {.log = log, .nlog = &nlog, .tag = 1};
    recorder r2 = {.log = log, .nlog = &nlog, .tag = 2};
    assert_true(mt_tensor_register_grad_ready_hook(w1, record, &r1) > 0);
    assert_true(mt_tensor_register_grad_ready_hook(w2, record, &r2) > 0);
    mt_scope_begin();
    mt_tensor *h = mt_tanh(mt_mul(x, w1));
    mt_tensor *loss = mt_sum_all(mt_mul(mt_tanh(h), w2));
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_scope_end();
    assert_int_equal(nlog, 2);
    assert_int_equal(log[0], 2);
    assert_int_equal(log[1], 1);
    mt_release(w1);
    mt_release(w2);
    mt_release(x);
}

static void test_hook_on_root_leaf(void **state) {
    (void)state;
    mt_tensor *w = leaf(3.0, 1);
    recorder r = {0};
    assert_true(mt_tensor_register_grad_ready_hook(w, record, &r) > 0);
    assert_int_equal(mt_backward(w, NULL), 0);
    assert_int_equal(r.calls, 1);
    assert_true(fabs(r.seen[0] - 1.0) < 1e-6);
    mt_release(w);
}

static void test_hook_error_stops_backward(void **state) {
    (void)state;
    mt_tensor *w = leaf(1.0, 2);
    recorder r = {.fail_with = MT_ERR_INVALID};
    assert_true(mt_tensor_register_grad_ready_hook(w, record, &r) > 0);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(mt_mul_scalar(w, 2.0)), NULL), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "grad-ready hook 1 failed");
    mt_scope_end();
    mt_release(w);
}

static int noop(mt_tensor *t, void *user) {
    (void)t;
    (void)user;
    return 0;
}

static void test_hook_argument_errors(void **state) {
    (void)state;
    mt_tensor *w = leaf(1.0, 2);
    mt_tensor *c = mt_full(MT_SHAPE(2), MT_F32, mt_test_device(), 1.0);
    assert_int_equal(mt_tensor_register_grad_ready_hook(NULL, noop, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "arg 1");
    assert_int_equal(mt_tensor_register_grad_ready_hook(w, NULL, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "arg 2: hook is NULL");
    assert_int_equal(mt_tensor_register_grad_ready_hook(c, noop, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "does not require grad");
    mt_tensor *y = mt_mul_scalar(w, 2.0);
    assert_int_equal(mt_tensor_register_grad_ready_hook(y, noop, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "not a leaf (made by mt_mul_scalar)");
    assert_int_equal(mt_tensor_remove_grad_ready_hook(w, 7), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "no hook with handle 7");
    mt_release(y);
    mt_release(w);
    mt_release(c);
}

/* A hook may release the root of the backward that runs it (the backward holds its own
   reference: ASan saw the tape freed under the running backward). */
static mt_tensor *released_root;
static int release_root(mt_tensor *t, void *user) {
    (void)t;
    (void)user;
    mt_release(released_root);
    released_root = NULL;
    return 0;
}

static void test_hook_releases_root(void **state) {
    (void)state;
    mt_tensor *a = leaf(2.0, 2), *b = leaf(3.0, 2);
    assert_true(mt_tensor_register_grad_ready_hook(a, release_root, NULL) > 0);
    mt_tensor *y = mt_mul(a, b);
    released_root = mt_sum_all(y);
    mt_release(y);
    assert_int_equal(mt_backward(released_root, NULL), 0);
    assert_null(released_root);
    assert_true(fabs(grad_sum(a) - 6.0) < 1e-6 && fabs(grad_sum(b) - 4.0) < 1e-6);
    mt_release(a);
    mt_release(b);
}

/* A hook is user code: what its calls return goes to its own scope (or, without one, to the
   scope around the backward), so a hook that uses scopes leaks nothing per step. */
static int scoped_work(mt_tensor *t, void *user) {
    (void)user;
    mt_scope_begin();
    mt_mul_scalar(mt_grad(t), 0.5);
    mt_scope_end();
    mt_mul_scalar(mt_grad(t), 2.0); /* to the step's scope */
    return 0;
}

static void test_hook_results_go_to_scopes(void **state) {
    (void)state;
    mt_tensor *w = leaf(1.0, 4);
    assert_true(mt_tensor_register_grad_ready_hook(w, scoped_work, NULL) > 0);
    int64_t live = 0;
    for (int step = 0; step < 3; step++) {
        mt_scope_begin();
        assert_int_equal(mt_backward(mt_sum_all(mt_mul(w, w)), NULL), 0);
        mt_scope_end();
        if (step == 0) live = mt_live_tensors();
        assert_int_equal(mt_live_tensors(), live);
    }
    mt_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_hook_sees_final_gradient),  MT_TEST(test_hook_order_follows_backward),
        MT_TEST(test_hook_on_root_leaf),         MT_TEST(test_hook_error_stops_backward),
        MT_TEST(test_hook_argument_errors),      MT_TEST(test_hook_releases_root),
        MT_TEST(test_hook_results_go_to_scopes),
    };
    return MT_RUN_TESTS(tests);
}

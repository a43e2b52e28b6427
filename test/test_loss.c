/* Losses: mse_loss and cross_entropy against reference loops in double, every floating
   dtype, non-contiguous inputs, ignore_index, autocast dtypes, gradients (values and finite
   differences in F64) and error paths. */
#include "test_util.h"

/* ---------------------------------------------------------------- mse_loss */

static void test_mse_forward_backward(void **state) {
    (void)state;
    double p[6] = {1, 2, 3, 4, 5, 6}, q[6] = {1.5, 2, 1, 4, 7, 5.25};
    double loss = 0, gp[6];
    for (int i = 0; i < 6; i++) {
        loss += (p[i] - q[i]) * (p[i] - q[i]) / 6;
        gp[i] = 2 * (p[i] - q[i]) / 6;
    }
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        mt_tensor *a = mt_test_tensor(p, dts[k], MT_SHAPE(2, 3));
        mt_tensor *b = mt_test_tensor(q, dts[k], MT_SHAPE(2, 3));
        mt_set_requires_grad(a, true);
        mt_set_requires_grad(b, true);
        mt_tensor *l = mt_mse_loss(a, b);
        assert_no_error();
        assert_int_equal(mt_ndim(l), 0);
        assert_int_equal(mt_dtype_of(l), dts[k]);
        assert_string_equal(mt_grad_fn_name(l), "mse_loss");
        double tol = dts[k] == MT_BF16 ? 1e-2 : dts[k] == MT_F16 ? 1e-3 : 1e-6;
        assert_tensor_close(l, &loss, 1, 0, tol);
        assert_int_equal(mt_backward(l, NULL), 0);
        mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
        double ngp[6];
        for (int i = 0; i < 6; i++) ngp[i] = -gp[i];
        assert_int_equal(mt_dtype_of(ga), dts[k]);
        assert_tensor_close(ga, gp, 6, tol, tol);
        assert_tensor_close(gb, ngp, 6, tol, tol);
        mt_release(ga);
        mt_release(gb);
        mt_release(l);
        mt_release(a);
        mt_release(b);
    }
}

static void test_mse_non_contiguous_and_large(void **state) {
    (void)state;
    mt_manual_seed(21);
    mt_tensor *a = mt_randn(MT_SHAPE(300, 200), MT_F32, mt_test_device());
    mt_tensor *b = mt_randn(MT_SHAPE(200, 300), MT_F32, mt_test_device());
    mt_tensor *bt = mt_transpose(b, 0, 1);
    double *x = mt_test_values(a), *y = mt_test_values(bt), ref = 0;
    for (int i = 0; i < 60000; i++) ref += (x[i] - y[i]) * (x[i] - y[i]);
    ref /= 60000;
    mt_tensor *l = mt_mse_loss(a, bt);
    assert_tensor_close(l, &ref, 1, 0, 1e-6);
    mt_release(l);
    free(x);
    free(y);
    mt_release(bt);
    mt_release(b);
    mt_release(a);
}

static void test_mse_autocast(void **state) {
    (void)state;
    mt_tensor *a = mt_full(MT_SHAPE(4, 4), MT_F16, mt_test_device(), 300.0);
    mt_tensor *b = mt_zeros(MT_SHAPE(4, 4), MT_F16, mt_test_device());
    /* outside autocast F16 in, F16 out: 300^2 = 90000 overflows F16 */
    mt_tensor *l = mt_mse_loss(a, b);
    assert_int_equal(mt_dtype_of(l), MT_F16);
    assert_true(isinf(mt_item(l)));
    mt_release(l);
    /* under autocast the FP32 rule computes it in F32 */
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    l = mt_mse_loss(a, b);
    mt_autocast_end();
    assert_int_equal(mt_dtype_of(l), MT_F32);
    assert_true(mt_item(l) == 90000.0);
    mt_release(l);
    mt_release(a);
    mt_release(b);
}

static mt_tensor *mse_fn(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_mse_loss(in[0], in[1]);
}

static void test_mse_gradcheck(void **state) {
    (void)state;
    mt_manual_seed(4);
    mt_tensor *in[2] = {mt_randn(MT_SHAPE(3, 5), MT_F64, mt_test_device()),
                        mt_randn(MT_SHAPE(3, 5), MT_F64, mt_test_device())};
    mt_set_requires_grad(in[0], true);
    mt_set_requires_grad(in[1], true);
    int rc = mt_gradcheck(mse_fn, in, 2, NULL, NULL);
    if (rc) fail_msg("%s", mt_last_error());
    /* one side only */
    mt_set_requires_grad(in[1], false);
    rc = mt_gradcheck(mse_fn, in, 2, NULL, NULL);
    if (rc) fail_msg("%s", mt_last_error());
    mt_release(in[0]);
    mt_release(in[1]);
}

static void test_mse_errors(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device());
    mt_tensor *b = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *c = mt_zeros(MT_SHAPE(2, 3), MT_I64, mt_test_device());
    assert_null(mt_mse_loss(a, b));
    assert_error(MT_ERR_SHAPE,
                 "mt_mse_loss: arg 2: target shape [3] differs from pred shape [2, 3]");
    assert_null(mt_mse_loss(c, a));
    assert_error(MT_ERR_DTYPE, "mt_mse_loss: arg 1");
    assert_null(mt_mse_loss(a, c));
    assert_error(MT_ERR_DTYPE, "mt_mse_loss: arg 2");
    assert_null(mt_mse_loss(NULL, a));
    assert_null(mt_mse_loss(a, NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_release(a);
    mt_release(b);
    mt_release(c);
}

/* ---------------------------------------------------------------- cross_entropy */

/* Mean over counted rows of lse - x[label]; grad = (softmax - onehot) / counted. */
static double ref_ce(const double *x, const int64_t *lab, int64_t N, int64_t C, int64_t ignore,
                     double *grad) {
    double total = 0;
    int64_t valid = 0;
    for (int64_t r = 0; r < N; r++)
        if (lab[r] != ignore) valid++;
    for (int64_t r = 0; r < N; r++) {
        const double *p = x + r * C;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++) m = fmax(m, p[c]);
        for (int64_t c = 0; c < C; c++) s += exp(p[c] - m);
        double lse = m + log(s);
        if (lab[r] == ignore) {
            if (grad)
                for (int64_t c = 0; c < C; c++) grad[r * C + c] = 0;
            continue;
        }
        total += lse - p[lab[r]];
        if (grad)
            for (int64_t c = 0; c < C; c++)
                grad[r * C + c] = (exp(p[c] - lse) - (c == lab[r])) / (double)valid;
    }
    return total / (double)valid;
}

static mt_tensor *labels_of(const int64_t *v, int64_t n) {
    return mt_from_data(v, MT_I64, 1, &n, mt_test_device());
}

static void test_ce_forward_backward_dtypes(void **state) {
    (void)state;
    const int64_t N = 5, C = 7;
    double x[35];
    for (int i = 0; i < 35; i++) x[i] = (double)((i * 37) % 23 - 11) / 4.0;
    int64_t lab[5] = {3, 0, 6, -100, 2};
    mt_tensor *labels = labels_of(lab, N);
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        mt_tensor *t = mt_test_tensor(x, dts[k], MT_SHAPE(N, C));
        double *xv = mt_test_values(t), grad[35];
        double ref = ref_ce(xv, lab, N, C, -100, grad);
        mt_set_requires_grad(t, true);
        mt_tensor *l = mt_cross_entropy(t, labels);
        assert_no_error();
        assert_int_equal(mt_ndim(l), 0);
        assert_int_equal(mt_dtype_of(l), dts[k]);
        assert_string_equal(mt_grad_fn_name(l), "cross_entropy");
        double tol = dts[k] == MT_BF16  ? 1e-2
                     : dts[k] == MT_F16 ? 1e-3
                     : dts[k] == MT_F32 ? 1e-6
                                        : 1e-12;
        assert_tensor_close(l, &ref, 1, 0, tol);
        assert_int_equal(mt_backward(l, NULL), 0);
        mt_tensor *g = mt_grad(t);
        assert_int_equal(mt_dtype_of(g), dts[k]);
        assert_tensor_close(g, grad, 35, tol, tol);
        mt_release(g);
        mt_release(l);
        mt_release(t);
        free(xv);
    }
    mt_release(labels);
}

static void test_ce_layouts_and_sizes(void **state) {
    (void)state;
    /* transposed logits; long rows (heap buffers); many rows (parallel) */
    const int64_t sizes[][2] = {{6, 5000}, {3000, 20}, {40, 1000}};
    for (int k = 0; k < 3; k++) {
        int64_t N = sizes[k][0], C = sizes[k][1];
        mt_manual_seed(31 + k);
        mt_tensor *raw = mt_randn(MT_SHAPE(C, N), MT_F32, mt_test_device());
        mt_tensor *big = mt_mul_scalar(raw, 5.0);
        mt_tensor *t = mt_transpose(big, 0, 1); /* [N, C], column-major */
        int64_t *lab = malloc((size_t)N * sizeof *lab);
        for (int64_t r = 0; r < N; r++) lab[r] = (r * 7919) % C;
        lab[N / 2] = -100;
        mt_tensor *labels = labels_of(lab, N);
        double *xv = mt_test_values(t), *grad = malloc((size_t)(N * C) * sizeof *grad);
        double ref = ref_ce(xv, lab, N, C, -100, grad);
        mt_tensor *leaf = mt_detach(t);
        mt_set_requires_grad(leaf, true);
        mt_tensor *l = mt_cross_entropy(leaf, labels);
        assert_tensor_close(l, &ref, 1, 0, 1e-5);
        assert_int_equal(mt_backward(l, NULL), 0);
        mt_tensor *g = mt_grad(leaf);
        assert_tensor_close(g, grad, N * C, 1e-7, 1e-4);
        mt_release(g);
        mt_release(l);
        mt_release(leaf);
        free(grad);
        free(xv);
        mt_release(labels);
        free(lab);
        mt_release(t);
        mt_release(big);
        mt_release(raw);
    }
}

static void test_ce_ignore_index(void **state) {
    (void)state;
    double x[6] = {1, 2, 3, 0.5, 0.25, -1};
    mt_tensor *t = mt_test_tensor(x, MT_F64, MT_SHAPE(2, 3));
    mt_set_requires_grad(t, true);
    /* a custom ignore index */
    int64_t lab[2] = {7, 1};
    mt_tensor *labels = labels_of(lab, 2);
    double grad[6];
    double ref = ref_ce(x, lab, 2, 3, 7, grad);
    mt_tensor *l = mt_cross_entropy_ex(t, labels, 7);
    assert_tensor_close(l, &ref, 1, 0, 1e-12);
    assert_int_equal(mt_backward(l, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_tensor_close(g, grad, 6, 1e-12, 0);
    assert_true(grad[0] == 0 && grad[1] == 0 && grad[2] == 0);
    mt_release(g);
    mt_zero_grad(t);
    mt_release(l);
    mt_release(labels);
    /* every row ignored: nan like torch */
    int64_t all[2] = {-100, -100};
    labels = labels_of(all, 2);
    l = mt_cross_entropy(t, labels);
    assert_no_error();
    assert_true(isnan(mt_item(l)));
    mt_release(l);
    mt_release(labels);
    /* MT_IGNORE_INDEX_NONE: -100 is an ordinary (out of range) label; a device finds it in
       the kernel and reports it at the next synchronisation */
    labels = labels_of((const int64_t[]){0, -100}, 2);
    assert_deferred_error(mt_cross_entropy_ex(t, labels, MT_IGNORE_INDEX_NONE), MT_ERR_INVALID,
                          "mt_cross_entropy", "label -100 at row 1");
    mt_release(labels);
    labels = labels_of((const int64_t[]){2, 0}, 2);
    l = mt_cross_entropy_ex(t, labels, MT_IGNORE_INDEX_NONE);
    ref = ref_ce(x, (const int64_t[]){2, 0}, 2, 3, MT_IGNORE_INDEX_NONE, NULL);
    assert_tensor_close(l, &ref, 1, 0, 1e-12);
    mt_release(l);
    mt_release(labels);
    mt_release(t);
}

/* An ignored row does not take part, whatever its logits hold: an inf or NaN there leaves the
   loss finite and the row's gradient exactly 0, so it cannot make a GradScaler step skip.
   (torch's gradient there is NaN, from its log_softmax backward's 0 * exp(NaN); mixtape gives
   the exact derivative instead: see mt_cross_entropy in mixtape.h.) A row that is not
   ignored propagates its NaN as torch does. Every floating dtype. */
static void test_ce_ignored_nonfinite_rows(void **state) {
    (void)state;
    const mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        mt_scope_begin();
        double x[12] = {1, 2, 0.5, NAN, 1, 2, INFINITY, 0, 1, 0.3, -1, 2};
        mt_tensor *t = mt_test_param(x, dts[k], MT_SHAPE(4, 3));
        mt_tensor *l = mt_cross_entropy(t, labels_of((const int64_t[]){0, -100, -100, 2}, 4));
        assert_int_equal(mt_backward(l, NULL), 0);
        double *g = mt_test_values(mt_grad(t));
        assert_true(isfinite(mt_item(l)));
        for (int i = 0; i < 12; i++) {
            if (i >= 3 && i < 9)
                assert_true(g[i] == 0);
            else
                assert_true(isfinite(g[i]) && g[i] != 0);
        }
        free(g);
        mt_zero_grad(t);
        l = mt_cross_entropy(t, labels_of((const int64_t[]){0, 1, -100, 2}, 4));
        assert_int_equal(mt_backward(l, NULL), 0);
        g = mt_test_values(mt_grad(t));
        assert_true(isnan(mt_item(l)));
        for (int i = 3; i < 6; i++) assert_true(isnan(g[i]));
        free(g);
        assert_no_error();
        mt_scope_end();
    }
}

/* Logits far from 0: the loss and gradient depend on the differences alone. The row's max
   and its log-sum are kept apart (their sum rounded at the max's scale lost the log-sum:
   [3e38, 3e38, -3e38] gave loss 0 and gradient [0, 1, 0]; 60000 lost 2 digits in FP32). */
static void test_ce_large_logits(void **state) {
    (void)state;
    const mt_dtype dts[2] = {MT_F32, MT_F64};
    double x[9] = {60000, 60000, 59000, 3e38, 3e38, -3e38, 3000, 3000, 2999};
    double e = exp(-1.0), d = 2 + e; /* the third row: softmax [1, 1, e] / d */
    double want_loss = (log(2.0) + log(2.0) + log(d)) / 3;
    double want_grad[9] = {-0.5 / 3, 0.5 / 3,         0,         -0.5 / 3, 0.5 / 3,
                           0,        (1 / d - 1) / 3, 1 / d / 3, e / d / 3};
    for (int k = 0; k < 2; k++) {
        mt_scope_begin();
        mt_tensor *t = mt_test_param(x, dts[k], MT_SHAPE(3, 3));
        mt_tensor *l = mt_cross_entropy(t, labels_of((const int64_t[]){0, 0, 0}, 3));
        assert_int_equal(mt_backward(l, NULL), 0);
        double tol = dts[k] == MT_F64 ? 1e-12 : 1e-6;
        assert_true(fabs(mt_item(l) - want_loss) <= tol * want_loss);
        assert_tensor_close(mt_grad(t), want_grad, 9, tol, tol);
        assert_no_error();
        mt_scope_end();
    }
}

static void test_ce_autocast(void **state) {
    (void)state;
    double x[8] = {1, 2, 3, 4, -1, 0, 1, 9};
    mt_tensor *t = mt_test_tensor(x, MT_F16, MT_SHAPE(2, 4));
    mt_tensor *labels = labels_of((const int64_t[]){3, 0}, 2);
    mt_set_requires_grad(t, true);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *l = mt_cross_entropy(t, labels);
    mt_autocast_end();
    assert_int_equal(mt_dtype_of(l), MT_F32);
    double grad[8];
    double ref = ref_ce(x, (const int64_t[]){3, 0}, 2, 4, -100, grad);
    assert_tensor_close(l, &ref, 1, 0, 1e-6);
    assert_int_equal(mt_backward(l, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_int_equal(mt_dtype_of(g), MT_F16);
    assert_tensor_close(g, grad, 8, 1e-3, 1e-3);
    mt_release(g);
    mt_release(l);
    mt_release(labels);
    mt_release(t);
}

typedef struct {
    mt_tensor *labels;
    int64_t ignore;
    bool transpose;
} ce_ctx;

static mt_tensor *ce_fn(mt_tensor *const *in, void *vctx) {
    ce_ctx *c = vctx;
    mt_tensor *x = c->transpose ? mt_transpose(in[0], 0, 1) : in[0];
    return mt_cross_entropy_ex(x, c->labels, c->ignore);
}

static void test_ce_gradcheck(void **state) {
    (void)state;
    mt_manual_seed(9);
    mt_tensor *t = mt_randn(MT_SHAPE(4, 6), MT_F64, mt_test_device());
    mt_tensor *tt = mt_randn(MT_SHAPE(6, 4), MT_F64, mt_test_device());
    mt_set_requires_grad(t, true);
    mt_set_requires_grad(tt, true);
    mt_tensor *l1 = labels_of((const int64_t[]){0, 5, 2, 3}, 4);
    mt_tensor *l2 = labels_of((const int64_t[]){1, -100, 4, -100}, 4);
    mt_tensor *l3 = labels_of((const int64_t[]){2, 2, 9, 0}, 4);
    ce_ctx cases[] = {{l1, -100, false},
                      {l2, -100, false},
                      {l3, 9, false},
                      {l1, MT_IGNORE_INDEX_NONE, false},
                      {l2, -100, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mt_tensor *in = cases[i].transpose ? tt : t;
        int rc = mt_gradcheck(ce_fn, &in, 1, &cases[i], NULL);
        if (rc) fail_msg("case %zu: %s", i, mt_last_error());
    }
    mt_release(l1);
    mt_release(l2);
    mt_release(l3);
    mt_release(tt);
    mt_release(t);
}

static void test_ce_errors(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(3, 4), MT_F32, mt_test_device());
    mt_tensor *good = labels_of((const int64_t[]){0, 1, 2}, 3);
    /* labels dtype */
    mt_tensor *l32 = mt_zeros(MT_SHAPE(3), MT_I32, mt_test_device()),
              *lf = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    assert_null(mt_cross_entropy(t, l32));
    assert_error(MT_ERR_DTYPE, "mt_cross_entropy: arg 2: labels must be i64, got i32");
    assert_null(mt_cross_entropy(t, lf));
    assert_error(MT_ERR_DTYPE, "labels must be i64");
    /* labels shape */
    mt_tensor *l2d = mt_zeros(MT_SHAPE(3, 1), MT_I64, mt_test_device()),
              *l4 = mt_zeros(MT_SHAPE(4), MT_I64, mt_test_device());
    assert_null(mt_cross_entropy(t, l2d));
    assert_error(MT_ERR_SHAPE, "labels shape [3, 1]");
    assert_null(mt_cross_entropy(t, l4));
    assert_error(MT_ERR_SHAPE, "labels shape [4] does not match logits [3, 4]");
    /* labels out of range: found by the op on the CPU, by the kernel on a device (reported at
       the next synchronisation) */
    mt_tensor *hi = labels_of((const int64_t[]){0, 4, 1}, 3),
              *neg = labels_of((const int64_t[]){0, 1, -1}, 3);
    assert_deferred_error(mt_cross_entropy(t, hi), MT_ERR_INVALID, "mt_cross_entropy",
                          "label 4 at row 1 is out of range [0, 4)");
    assert_deferred_error(mt_cross_entropy(t, neg), MT_ERR_INVALID, "mt_cross_entropy",
                          "label -1 at row 2");
    /* a non-contiguous labels view is read correctly, and checked */
    mt_tensor *six = labels_of((const int64_t[]){0, 9, 1, 9, 3, 9}, 6);
    mt_tensor *strided = mt_slice(six, 0, 0, 6, 2);
    mt_tensor *l = mt_cross_entropy(t, strided);
    assert_no_error();
    mt_release(l);
    mt_tensor *odd = mt_slice(six, 0, 1, 6, 2);
    /* every row of `odd` is bad: the CPU names the first, a device kernel whichever of its
       threads reported first (both carry the label) */
    assert_deferred_error(mt_cross_entropy(t, odd), MT_ERR_INVALID, "mt_cross_entropy",
                          mt_device_of(t).type == MT_DEVICE_CPU ? "label 9 at row 0"
                                                                : "label 9 at row");
    /* logits rank and dtype */
    mt_tensor *t1 = mt_zeros(MT_SHAPE(4), MT_F32, mt_test_device()),
              *t3 = mt_zeros(MT_SHAPE(3, 4, 1), MT_F32, mt_test_device());
    mt_tensor *ti = mt_zeros(MT_SHAPE(3, 4), MT_I64, mt_test_device());
    assert_null(mt_cross_entropy(t1, good));
    assert_error(MT_ERR_SHAPE, "logits must be [N, C], got shape [4]");
    assert_null(mt_cross_entropy(t3, good));
    assert_error(MT_ERR_SHAPE, "[3, 4, 1]");
    assert_null(mt_cross_entropy(ti, good));
    assert_error(MT_ERR_DTYPE, "mt_cross_entropy: arg 1");
    assert_null(mt_cross_entropy(NULL, good));
    assert_null(mt_cross_entropy(t, NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_release(ti);
    mt_release(t3);
    mt_release(t1);
    mt_release(odd);
    mt_release(strided);
    mt_release(six);
    mt_release(hi);
    mt_release(neg);
    mt_release(l2d);
    mt_release(l4);
    mt_release(l32);
    mt_release(lf);
    mt_release(good);
    mt_release(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_mse_forward_backward),
        MT_TEST(test_mse_non_contiguous_and_large),
        MT_TEST(test_mse_autocast),
        MT_TEST(test_mse_gradcheck),
        MT_TEST(test_mse_errors),
        MT_TEST(test_ce_forward_backward_dtypes),
        MT_TEST(test_ce_layouts_and_sizes),
        MT_TEST(test_ce_ignore_index),
        MT_TEST(test_ce_ignored_nonfinite_rows),
        MT_TEST(test_ce_large_logits),
        MT_TEST(test_ce_autocast),
        MT_TEST(test_ce_gradcheck),
        MT_TEST(test_ce_errors),
    };
    return MT_RUN_TESTS(tests);
}

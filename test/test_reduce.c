/* Reductions and softmax: forward against reference loops (several dims, keepdim, negative
   dims, transposed, sliced and expanded inputs, every floating dtype, the parallel paths),
   accuracy of large and low-precision sums, autocast dtypes, gradients by finite differences
   in F64, and error paths. */
#include "test_util.h"

enum { SUM, MEAN, MAX };

/* ---------------------------------------------------------------- reference helpers */

/* Reference reduction of a contiguous double array of `shape` over mask, results in the
   order of the kept dims. */
static int64_t ref_reduce(int op, const double *x, int nd, const int64_t *shape, uint32_t mask,
                          double *out) {
    int64_t K = 1, R = 1;
    for (int d = 0; d < nd; d++) {
        if (mask & (1u << d))
            R *= shape[d];
        else
            K *= shape[d];
    }
    for (int64_t k = 0; k < K; k++) out[k] = op == MAX ? -INFINITY : 0.0;
    for (int64_t i = 0; i < K * R; i++) {
        int64_t rem = i, k = 0, kmul = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            if (!(mask & (1u << d))) {
                k += idx * kmul;
                kmul *= shape[d];
            }
        }
        if (op == MAX)
            out[k] = x[i] > out[k] ? x[i] : out[k];
        else
            out[k] += x[i];
    }
    if (op == MEAN)
        for (int64_t k = 0; k < K; k++) out[k] /= (double)R;
    return K;
}

/* Deterministic values that are exact in F16/BF16 (multiples of 1/8 in [-6.25, 6.25]), all
   distinct within a window of 101 so max has no ties in small tensors. */
static double *test_values(int64_t n) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7919) % 101 - 50) / 8.0;
    return v;
}

static mt_tensor *reduce(int op, mt_tensor *t, int ndims, const int *dims, bool keepdim) {
    return op == SUM    ? mt_sum(t, ndims, dims, keepdim)
           : op == MEAN ? mt_mean(t, ndims, dims, keepdim)
                        : mt_max(t, ndims, dims, keepdim);
}

/* Checks op over every subset of the dims of t (values x, contiguous order of t's shape)
   against the reference, with and without keepdim, using negative dims for odd subsets. */
static void check_all_subsets(int op, mt_tensor *t, const double *x, double atol, double rtol) {
    int nd = mt_ndim(t);
    int64_t shape[MT_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = mt_dim(t, d);
    double *ref = malloc((size_t)mt_numel(t) * sizeof *ref);
    for (uint32_t mask = 1; mask < (1u << nd); mask++) {
        int dims[MT_MAX_DIMS], n = 0;
        for (int d = 0; d < nd; d++)
            if (mask & (1u << d)) dims[n++] = (mask & 1) ? d - nd : d;
        int64_t K = ref_reduce(op, x, nd, shape, mask, ref);
        for (int keep = 0; keep < 2; keep++) {
            mt_tensor *r = reduce(op, t, n, dims, keep);
            assert_no_error();
            int rnd = keep ? nd : nd - n;
            assert_int_equal(mt_ndim(r), rnd);
            for (int d = 0, j = 0; d < nd; d++) {
                if (mask & (1u << d)) {
                    if (keep) assert_int_equal(mt_dim(r, d), 1);
                } else {
                    assert_int_equal(mt_dim(r, keep ? d : j), shape[d]);
                    j++;
                }
            }
            assert_tensor_close(r, ref, K, atol, rtol);
            mt_release(r);
        }
    }
    free(ref);
}

/* ---------------------------------------------------------------- forward */

static void test_forward_all_dims_f32_f64(void **state) {
    (void)state;
    double *x = test_values(120);
    mt_dtype dts[2] = {MT_F32, MT_F64};
    for (int i = 0; i < 2; i++) {
        mt_tensor *t = mt_test_tensor(x, dts[i], MT_SHAPE(2, 3, 4, 5));
        for (int op = SUM; op <= MAX; op++) check_all_subsets(op, t, x, 1e-5, 1e-6);
        mt_release(t);
    }
    free(x);
}

static void test_forward_low_precision(void **state) {
    (void)state;
    double *x = test_values(60);
    mt_dtype dts[2] = {MT_F16, MT_BF16};
    for (int i = 0; i < 2; i++) {
        mt_tensor *t = mt_test_tensor(x, dts[i], MT_SHAPE(3, 4, 5));
        for (int op = SUM; op <= MAX; op++) {
            /* results are rounded once to the storage dtype */
            check_all_subsets(op, t, x, 1e-3, dts[i] == MT_F16 ? 1e-3 : 8e-3);
            mt_tensor *r = reduce(op, t, MT_DIMS(1), false);
            assert_int_equal(mt_dtype_of(r), dts[i]); /* outside autocast: the input's dtype */
            mt_release(r);
        }
        mt_release(t);
    }
    free(x);
}

static void test_all_and_scalar(void **state) {
    (void)state;
    double x[6] = {1, -2, 3.5, 4, 0.5, -6};
    mt_tensor *t = mt_test_tensor(x, MT_F32, MT_SHAPE(2, 3));
    mt_tensor *s = mt_sum_all(t), *m = mt_mean_all(t), *mx = mt_max_all(t);
    assert_no_error();
    assert_int_equal(mt_ndim(s), 0);
    assert_int_equal(mt_ndim(m), 0);
    assert_int_equal(mt_ndim(mx), 0);
    assert_true(mt_item(s) == 1.0);
    assert_true(mt_item(m) == 1.0 / 6.0 || fabs(mt_item(m) - 1.0 / 6.0) < 1e-7);
    assert_true(mt_item(mx) == 4.0);
    mt_release(s);
    mt_release(m);
    mt_release(mx);
    /* ndims == 0 with keepdim keeps every dim as 1 */
    s = mt_sum(t, 0, NULL, true);
    assert_shape(s, 1, 1);
    mt_release(s);
    mt_release(t);
    /* 0-d input: dims 0 / -1 are accepted like torch */
    mt_tensor *z = mt_scalar(2.5, MT_F32, mt_test_device());
    s = mt_sum(z, MT_DIMS(-1), false);
    assert_no_error();
    assert_int_equal(mt_ndim(s), 0);
    assert_true(mt_item(s) == 2.5);
    mt_release(s);
    s = mt_max_all(z);
    assert_true(mt_item(s) == 2.5);
    mt_release(s);
    mt_release(z);
}

static void test_empty(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(0, 3), MT_F32, mt_test_device());
    mt_tensor *s = mt_sum(t, MT_DIMS(0), false), *m = mt_mean(t, MT_DIMS(0), false);
    assert_no_error();
    assert_tensor_close(s, ((const double[]){0, 0, 0}), 3, 0, 0);
    assert_tensor_close(m, ((const double[]){NAN, NAN, NAN}), 3, 0, 0);
    mt_release(s);
    mt_release(m);
    s = mt_sum(t, MT_DIMS(1), true); /* no outputs */
    assert_no_error();
    assert_shape(s, 0, 1);
    mt_release(s);
    assert_null(mt_max(t, MT_DIMS(0), false));
    assert_error(MT_ERR_SHAPE, "empty");
    assert_null(mt_max_all(t));
    assert_error(MT_ERR_SHAPE, "[0, 3]");
    mt_release(t);
}

/* ---------------------------------------------------------------- layouts */

static void test_non_contiguous(void **state) {
    (void)state;
    double *x = test_values(60);
    mt_tensor *base = mt_test_tensor(x, MT_F32, MT_SHAPE(3, 4, 5));
    /* transposed [5, 4, 3]: values in its own logical order */
    mt_tensor *tt = mt_permute(base, MT_DIMS(2, 1, 0));
    assert_false(mt_is_contiguous(tt));
    double *xt = mt_test_values(tt);
    for (int op = SUM; op <= MAX; op++) check_all_subsets(op, tt, xt, 1e-5, 1e-6);
    free(xt);
    /* transposed inner pair, F16 storage */
    mt_tensor *h = mt_cast(base, MT_F16), *ht = mt_transpose(h, 1, 2);
    double *xh = mt_test_values(ht);
    for (int op = SUM; op <= MAX; op++) check_all_subsets(op, ht, xh, 1e-3, 1e-3);
    free(xh);
    /* strided slice */
    mt_tensor *sl = mt_slice(base, 2, 0, 5, 2);
    double *xs = mt_test_values(sl);
    for (int op = SUM; op <= MAX; op++) check_all_subsets(op, sl, xs, 1e-5, 1e-6);
    free(xs);
    /* expanded (stride 0) input */
    mt_tensor *row = mt_test_tensor((const double[]){1, 2, 3}, MT_F32, MT_SHAPE(1, 3));
    mt_tensor *ex = mt_expand(row, MT_SHAPE(4, 3));
    mt_tensor *s0 = mt_sum(ex, MT_DIMS(0), false), *s1 = mt_sum(ex, MT_DIMS(1), false);
    assert_tensor_close(s0, ((const double[]){4, 8, 12}), 3, 0, 0);
    assert_tensor_close(s1, ((const double[]){6, 6, 6, 6}), 4, 0, 0);
    mt_release(s0);
    mt_release(s1);
    mt_release(ex);
    mt_release(row);
    mt_release(sl);
    mt_release(ht);
    mt_release(h);
    mt_release(tt);
    mt_release(base);
    free(x);
}

/* Shapes that take each kernel path above the parallel threshold: row mode over many
   outputs, row mode with few outputs (split reduced range), column mode with many and with
   few chunks, and a strided column. */
static void test_parallel_paths(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{4000, 37}, {3, 50000}, {50000, 3}, {300, 700}, {20000, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0] * shapes[s][1];
        double *x = test_values(n);
        mt_tensor *t = mt_test_tensor(x, MT_F32, MT_SHAPE(shapes[s][0], shapes[s][1]));
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int op = SUM; op <= MAX; op++)
            for (int d = 0; d < 2; d++) {
                mt_tensor *r = reduce(op, t, 1, &d, false);
                int64_t K = ref_reduce(op, x, 2, shapes[s], 1u << d, ref);
                assert_tensor_close(r, ref, K, 1e-3, 1e-6);
                mt_release(r);
                /* the same through a transposed view */
                mt_tensor *tt = mt_transpose(t, 0, 1);
                int od = 1 - d;
                r = reduce(op, tt, 1, &od, false);
                assert_tensor_close(r, ref, K, 1e-3, 1e-6);
                mt_release(r);
                mt_release(tt);
            }
        mt_tensor *h = mt_cast(t, MT_BF16);
        mt_tensor *r = mt_mean(h, MT_DIMS(0), false);
        double *xb = mt_test_values(h);
        int64_t K = ref_reduce(MEAN, xb, 2, shapes[s], 1u, ref);
        assert_tensor_close(r, ref, K, 1e-3, 8e-3);
        free(xb);
        mt_release(r);
        mt_release(h);
        free(ref);
        mt_release(t);
        free(x);
    }
}

/* A short contiguous kept dim under a reduced one ([outer, R, V], dim 1): the column kernel
   makes about outer (output group, split) tiles. On the emulated device (4 SMs: a grid cap
   of 128 blocks) that is more than the grid, so its blocks loop over tiles; on a GPU's larger
   cap these shapes take one pass. Every output is checked. */
static void test_many_column_tiles(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1000, 3, 4}, {600, 5, 16}, {257, 40, 6}};
    const mt_dtype dts[] = {MT_F32, MT_F16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0] * shapes[s][1] * shapes[s][2];
        double *x = test_values(n), *ref = malloc((size_t)n * sizeof *ref);
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
            mt_tensor *t = mt_test_tensor(x, dts[i], 3, shapes[s]);
            for (int op = SUM; op <= MAX; op++) {
                mt_tensor *r = reduce(op, t, MT_DIMS(1), false);
                assert_no_error();
                int64_t K = ref_reduce(op, x, 3, shapes[s], 1u << 1, ref);
                assert_tensor_close(r, ref, K, 1e-2, dts[i] == MT_F16 ? 1e-3 : 1e-6);
                mt_release(r);
            }
            mt_release(t);
        }
        free(ref);
        free(x);
    }
}

/* ---------------------------------------------------------------- accuracy */

static void test_large_sum_accuracy(void **state) {
    (void)state;
    /* 2^24 + 1000 ones: a plain FP32 running sum stalls at 16777216 */
    int64_t n = (1 << 24) + 1000;
    mt_tensor *t = mt_ones(MT_SHAPE(n), MT_F32, mt_test_device());
    mt_tensor *s = mt_sum_all(t);
    assert_no_error();
    assert_true(mt_item(s) == (double)(float)n);
    mt_release(s);
    mt_release(t);
    /* one million uniform values against a double sum */
    mt_manual_seed(7);
    t = mt_rand(MT_SHAPE(1000, 1000), MT_F32, mt_test_device());
    double *v = mt_test_values(t), ref = 0;
    for (int64_t i = 0; i < 1000000; i++) ref += v[i];
    free(v);
    s = mt_sum_all(t);
    assert_true(fabs(mt_item(s) - ref) <= 2e-7 * ref);
    mt_release(s);
    /* the same through the column path (dim 0) and transposed */
    mt_tensor *c = mt_sum(t, MT_DIMS(0), false);
    s = mt_sum_all(c);
    assert_true(fabs(mt_item(s) - ref) <= 2e-7 * ref);
    mt_release(s);
    mt_release(c);
    mt_release(t);
}

static void test_low_precision_accumulates_in_fp32(void **state) {
    (void)state;
    /* 4096 x f16(0.1): a sum accumulated in F16 stalls at 256 (half an ulp there is 0.125);
       FP32 accumulation gives 409.5, exactly representable in F16 */
    mt_tensor *t = mt_full(MT_SHAPE(4096), MT_F16, mt_test_device(), 0.1);
    mt_tensor *s = mt_sum_all(t);
    assert_int_equal(mt_dtype_of(s), MT_F16);
    assert_true(mt_item(s) == 409.5);
    mt_release(s);
    mt_release(t);
    /* mean of 100000 F16 values of 1.5 stays 1.5, even though the sum (150000) is beyond
       the F16 range; the sum itself overflows to inf when stored as F16, like torch */
    t = mt_full(MT_SHAPE(100000), MT_F16, mt_test_device(), 1.5);
    mt_tensor *m = mt_mean_all(t);
    s = mt_sum_all(t);
    assert_true(mt_item(m) == 1.5);
    assert_true(isinf(mt_item(s)) && mt_item(s) > 0);
    mt_release(m);
    mt_release(s);
    mt_release(t);
    /* BF16: 3000 x 1.0 accumulated in BF16 would stall at 256; FP32 gives 3000, stored as
       3008 (BF16 has 8 significant bits; 3000 is a tie between 2992 and 3008, to even) as
       torch gives */
    t = mt_ones(MT_SHAPE(3000), MT_BF16, mt_test_device());
    s = mt_sum_all(t);
    assert_true(mt_item(s) == 3008.0);
    mt_release(s);
    mt_release(t);
}

static void test_autocast_dtypes(void **state) {
    (void)state;
    mt_tensor *t = mt_full(MT_SHAPE(100000), MT_F16, mt_test_device(), 1.5);
    mt_set_requires_grad(t, true);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *s = mt_sum_all(t), *m = mt_mean(t, MT_DIMS(0), true), *mx = mt_max_all(t);
    mt_tensor *sm = mt_softmax(t, 0);
    mt_autocast_end();
    assert_no_error();
    assert_int_equal(mt_dtype_of(s), MT_F32); /* FP32 rule: no overflow under autocast */
    assert_true(mt_item(s) == 150000.0);
    assert_int_equal(mt_dtype_of(m), MT_F32);
    assert_int_equal(mt_dtype_of(sm), MT_F32);
    assert_int_equal(mt_dtype_of(mx), MT_F16); /* max runs in its input's dtype */
    /* the gradient reaches the F16 input in F16 */
    assert_int_equal(mt_backward(s, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_int_equal(mt_dtype_of(g), MT_F16);
    double *gv = mt_test_values(g);
    assert_true(gv[0] == 1.0 && gv[99999] == 1.0);
    free(gv);
    mt_release(g);
    mt_release(s);
    mt_release(m);
    mt_release(mx);
    mt_release(sm);
    mt_release(t);
}

/* ---------------------------------------------------------------- backward */

static void test_sum_mean_backward_values(void **state) {
    (void)state;
    double x[6] = {1, 2, 3, 4, 5, 6};
    mt_tensor *t = mt_test_tensor(x, MT_F32, MT_SHAPE(2, 3));
    mt_set_requires_grad(t, true);
    mt_tensor *s = mt_sum(t, MT_DIMS(1), false);
    mt_tensor *w = mt_test_tensor((const double[]){2, 3}, MT_F32, MT_SHAPE(2));
    mt_tensor *p = mt_mul(s, w);
    mt_tensor *m = mt_mean_all(p);
    assert_string_equal(mt_grad_fn_name(s), "sum");
    assert_int_equal(mt_backward(m, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_tensor_close(g, ((const double[]){1, 1, 1, 1.5, 1.5, 1.5}), 6, 1e-6, 0);
    assert_tensor_close(m, ((const double[]){(6 * 2 + 15 * 3) / 2.0}), 1, 1e-5, 0);
    assert_true(mt_is_contiguous(g));
    mt_release(g);
    mt_release(m);
    mt_release(p);
    mt_release(w);
    mt_release(s);
    mt_release(t);
}

static void test_max_backward_ties(void **state) {
    (void)state;
    /* ties split the gradient evenly among the maxima (torch's amax) */
    double x[8] = {1, 3, 3, 2, 5, 0, 5, 5};
    mt_tensor *t = mt_test_tensor(x, MT_F64, MT_SHAPE(2, 4));
    mt_set_requires_grad(t, true);
    mt_tensor *m = mt_max(t, MT_DIMS(1), false);
    assert_tensor_close(m, ((const double[]){3, 5}), 2, 0, 0);
    mt_tensor *s = mt_sum_all(m);
    assert_int_equal(mt_backward(s, NULL), 0);
    mt_tensor *g = mt_grad(t);
    assert_tensor_close(g, ((const double[]){0, 0.5, 0.5, 0, 1.0 / 3, 0, 1.0 / 3, 1.0 / 3}), 8,
                        1e-12, 0);
    mt_release(g);
    mt_release(s);
    mt_release(m);
    mt_release(t);
}

/* Rows long enough for the vector lanes (the CPU's max looks for NaN beside its lanes and
   redoes a row that has one): a NaN anywhere in a row (lane, fold or tail position) makes
   the row's max NaN; inf and -inf together (whose sum is NaN) give inf; rows without NaN
   give their exact maximum. A max over dims 0 and 2 also carries a NaN from one run into
   the next. */
static void test_max_nan_long_rows(void **state) {
    (void)state;
    static const int lengths[] = {64, 100, 200, 1024};
    static double v[8 * 1024], want[8];
    for (int li = 0; li < 4; li++) {
        int n = lengths[li];
        const int nan_at[6] = {0, 1, 17, 63, n - 1, n / 2 + 3};
        for (int r = 0; r < 8; r++) {
            want[r] = -1e30;
            for (int i = 0; i < n; i++) {
                v[r * n + i] = (double)((i * 37 + r * 11) % 101) - 50.0;
                want[r] = fmax(want[r], v[r * n + i]);
            }
            if (r < 6) {
                v[r * n + nan_at[r]] = NAN;
                want[r] = NAN;
            } else if (r == 6) {
                v[r * n + 5] = INFINITY;
                v[r * n + n - 2] = -INFINITY;
                want[r] = INFINITY;
            }
        }
        mt_tensor *t = mt_test_tensor(v, MT_F32, MT_SHAPE(8, n));
        mt_tensor *m = mt_max(t, MT_DIMS(1), false);
        assert_tensor_close(m, want, 8, 0, 0);
        mt_tensor *t3 = mt_view(t, MT_SHAPE(2, 4, n)); /* rows 0-3 and 4-7 into one output each */
        mt_tensor *m3 = mt_max(t3, MT_DIMS(0, 2), false);
        double want3[4];
        for (int k = 0; k < 4; k++)
            want3[k] = isnan(want[k]) || isnan(want[4 + k]) ? NAN : fmax(want[k], want[4 + k]);
        assert_tensor_close(m3, want3, 4, 0, 0);
        mt_release(m3);
        mt_release(t3);
        mt_release(m);
        mt_release(t);
    }
}

static void test_max_nan_propagates(void **state) {
    (void)state;
    mt_tensor *t = mt_test_tensor((const double[]){1, NAN, 2, 7, 4, 3}, MT_F32, MT_SHAPE(2, 3));
    mt_tensor *m = mt_max(t, MT_DIMS(1), false), *a = mt_max_all(t);
    assert_tensor_close(m, ((const double[]){NAN, 7}), 2, 0, 0);
    assert_true(isnan(mt_item(a)));
    mt_release(m);
    mt_release(a);
    mt_release(t);
}

typedef struct {
    int op, ndims, dims[3];
    bool keepdim, transpose;
} red_ctx;

static mt_tensor *red_fn(mt_tensor *const *in, void *vctx) {
    red_ctx *c = vctx;
    mt_tensor *x = c->transpose ? mt_transpose(in[0], 0, -1) : in[0];
    return reduce(c->op, x, c->ndims, c->dims, c->keepdim);
}

static void test_gradcheck_reductions(void **state) {
    (void)state;
    double *x = test_values(24);
    for (int i = 0; i < 24; i++) x[i] += 0.001 * i; /* no ties */
    mt_tensor *t = mt_test_tensor(x, MT_F64, MT_SHAPE(2, 3, 4));
    mt_set_requires_grad(t, true);
    red_ctx cases[] = {
        {SUM, 2, {0, 2}, false, false},   {SUM, 1, {-1}, true, true},
        {SUM, 0, {0}, false, false},      {MEAN, 1, {1}, true, false},
        {MEAN, 2, {-3, -1}, false, true}, {MEAN, 0, {0}, true, false},
        {MAX, 1, {2}, false, false},      {MAX, 2, {0, 1}, true, true},
        {MAX, 0, {0}, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = mt_gradcheck(red_fn, &t, 1, &cases[i], NULL);
        if (rc) fail_msg("case %zu: %s", i, mt_last_error());
    }
    mt_release(t);
    free(x);
}

typedef struct {
    int op;
    bool transpose;
} all_ctx;

static mt_tensor *all_fn(mt_tensor *const *in, void *vctx) {
    all_ctx *c = vctx;
    mt_tensor *x = c->transpose ? mt_transpose(in[0], 0, -1) : in[0];
    return c->op == SUM ? mt_sum_all(x) : c->op == MEAN ? mt_mean_all(x) : mt_max_all(x);
}

/* The whole-tensor reductions, contiguous and transposed, and on a 0-d input. */
static void test_gradcheck_all_reductions(void **state) {
    (void)state;
    double *x = test_values(24);
    for (int i = 0; i < 24; i++) x[i] += 0.001 * i; /* a unique maximum */
    mt_tensor *t = mt_test_tensor(x, MT_F64, MT_SHAPE(2, 3, 4));
    mt_tensor *z = mt_scalar(0.75, MT_F64, mt_test_device());
    mt_set_requires_grad(t, true);
    mt_set_requires_grad(z, true);
    for (int op = SUM; op <= MAX; op++)
        for (int tr = 0; tr < 2; tr++) {
            all_ctx c = {op, tr};
            int rc = mt_gradcheck(all_fn, &t, 1, &c, NULL);
            if (rc) fail_msg("op %d transpose %d: %s", op, tr, mt_last_error());
            c.transpose = false;
            rc = mt_gradcheck(all_fn, &z, 1, &c, NULL);
            if (rc) fail_msg("op %d on 0-d: %s", op, mt_last_error());
        }
    mt_release(z);
    mt_release(t);
    free(x);
}

/* ---------------------------------------------------------------- softmax */

static void ref_softmax(const double *x, int nd, const int64_t *shape, int dim, bool lg,
                        double *y) {
    int64_t L = shape[dim], inner = 1, outer = 1;
    for (int d = dim + 1; d < nd; d++) inner *= shape[d];
    for (int d = 0; d < dim; d++) outer *= shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const double *p = x + o * L * inner + i;
            double m = -INFINITY, s = 0;
            for (int64_t l = 0; l < L; l++) m = fmax(m, p[l * inner]);
            for (int64_t l = 0; l < L; l++) s += exp(p[l * inner] - m);
            for (int64_t l = 0; l < L; l++) {
                double v = p[l * inner] - m;
                y[o * L * inner + i + l * inner] = lg ? v - log(s) : exp(v) / s;
            }
        }
}

static void test_softmax_forward(void **state) {
    (void)state;
    int64_t shape[3] = {3, 4, 5};
    double *x = test_values(60), y[60];
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int i = 0; i < 4; i++) {
        mt_tensor *t = mt_test_tensor(x, dts[i], 3, shape);
        double tol = dts[i] == MT_F64   ? 1e-12
                     : dts[i] == MT_F32 ? 1e-6
                     : dts[i] == MT_F16 ? 2e-3
                                        : 1e-2;
        for (int lg = 0; lg < 2; lg++)
            for (int d = -3; d < 3; d++) {
                mt_tensor *s = lg ? mt_log_softmax(t, d) : mt_softmax(t, d);
                assert_no_error();
                assert_int_equal(mt_dtype_of(s), dts[i]);
                ref_softmax(x, 3, shape, d < 0 ? d + 3 : d, lg, y);
                assert_tensor_close(s, y, 60, tol, tol);
                mt_release(s);
            }
        mt_release(t);
    }
    free(x);
}

static void test_softmax_layouts_and_sizes(void **state) {
    (void)state;
    /* transposed input, long rows (heap buffers), many rows (parallel) */
    const int64_t shapes[][2] = {{7, 3000}, {5000, 10}, {2, 70000}};
    for (size_t k = 0; k < 3; k++) {
        int64_t n = shapes[k][0] * shapes[k][1];
        mt_manual_seed(11 + k);
        mt_tensor *r = mt_randn(MT_SHAPE(shapes[k][0], shapes[k][1]), MT_F32, mt_test_device());
        mt_tensor *t = mt_mul_scalar(r, 8.0);
        double *x = mt_test_values(t), *y = malloc((size_t)n * sizeof *y);
        for (int lg = 0; lg < 2; lg++) {
            ref_softmax(x, 2, shapes[k], 1, lg, y);
            mt_tensor *s = lg ? mt_log_softmax(t, 1) : mt_softmax(t, 1);
            assert_tensor_close(s, y, n, lg ? 1e-5 : 1e-9, 1e-5);
            mt_release(s);
            /* same numbers from the transposed layout along dim 0 */
            mt_tensor *tt = mt_transpose(t, 0, 1);
            s = lg ? mt_log_softmax(tt, 0) : mt_softmax(tt, 0);
            mt_tensor *back = mt_transpose(s, 0, 1);
            assert_tensor_close(back, y, n, lg ? 1e-5 : 1e-9, 1e-5);
            mt_release(back);
            mt_release(s);
            mt_release(tt);
        }
        free(x);
        free(y);
        mt_release(t);
        mt_release(r);
    }
}

static void test_softmax_stability(void **state) {
    (void)state;
    double x[8] = {1000, 0, -1000, 999, -INFINITY, 0, 0, 0};
    mt_tensor *t = mt_test_tensor(x, MT_F32, MT_SHAPE(2, 4));
    mt_tensor *l = mt_log_softmax(t, 1), *s = mt_softmax(t, 1);
    double l1 = -log(1 + exp(-1.0));
    double el[8] = {l1,        -1000 + l1 - 0.0, -2000 + l1, -1 + l1,
                    -INFINITY, -log(3),          -log(3),    -log(3)};
    el[1] = -1000 + l1;
    assert_tensor_close(l, el, 8, 1e-4, 1e-6);
    double es[8] = {exp(l1), 0, 0, exp(-1 + l1), 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
    assert_tensor_close(s, es, 8, 1e-7, 1e-6);
    mt_release(l);
    mt_release(s);
    mt_release(t);
    /* a 0-d input is a row of one element */
    mt_tensor *z = mt_scalar(3.0, MT_F32, mt_test_device());
    s = mt_softmax(z, 0);
    l = mt_log_softmax(z, -1);
    assert_true(mt_item(s) == 1.0 && mt_item(l) == 0.0);
    mt_release(s);
    mt_release(l);
    mt_release(z);
}

typedef struct {
    int dim;
    bool log, transpose;
} sm_ctx;

static mt_tensor *sm_fn(mt_tensor *const *in, void *vctx) {
    sm_ctx *c = vctx;
    mt_tensor *x = c->transpose ? mt_transpose(in[0], 0, 2) : in[0];
    return c->log ? mt_log_softmax(x, c->dim) : mt_softmax(x, c->dim);
}

static void test_gradcheck_softmax(void **state) {
    (void)state;
    mt_manual_seed(3);
    mt_tensor *t = mt_randn(MT_SHAPE(2, 3, 4), MT_F64, mt_test_device());
    mt_set_requires_grad(t, true);
    for (int lg = 0; lg < 2; lg++)
        for (int d = -1; d < 3; d++)
            for (int tr = 0; tr < 2; tr++) {
                sm_ctx c = {d, lg, tr};
                int rc = mt_gradcheck(sm_fn, &t, 1, &c, NULL);
                if (rc) fail_msg("log %d dim %d transpose %d: %s", lg, d, tr, mt_last_error());
            }
    mt_release(t);
}

/* The F32 fused backward against the formula evaluated in double. */
static void test_softmax_backward_f32(void **state) {
    (void)state;
    mt_manual_seed(5);
    mt_tensor *t = mt_randn(MT_SHAPE(6, 300), MT_F32, mt_test_device());
    mt_tensor *v = mt_randn(MT_SHAPE(6, 300), MT_F32, mt_test_device());
    double *x = mt_test_values(t), *cv = mt_test_values(v), y[1800], ref[1800];
    mt_set_requires_grad(t, true);
    for (int lg = 0; lg < 2; lg++) {
        ref_softmax(x, 2, (const int64_t[]){6, 300}, 1, false, y);
        for (int r = 0; r < 6; r++) {
            double s = 0;
            for (int i = 0; i < 300; i++)
                s += lg ? cv[r * 300 + i] : cv[r * 300 + i] * y[r * 300 + i];
            for (int i = 0; i < 300; i++) {
                int k = r * 300 + i;
                ref[k] = lg ? cv[k] - y[k] * s : y[k] * (cv[k] - s);
            }
        }
        mt_tensor *s = lg ? mt_log_softmax(t, 1) : mt_softmax(t, 1);
        assert_int_equal(mt_backward(s, v), 0);
        mt_tensor *g = mt_grad(t);
        assert_tensor_close(g, ref, 1800, 1e-6, 1e-4);
        mt_release(g);
        mt_zero_grad(t);
        mt_release(s);
        /* the same along dim 0 of the transposed copy: the tiled kernels */
        mt_tensor *tt = mt_transpose(t, 0, 1), *tc = mt_contiguous(tt);
        mt_tensor *vt = mt_transpose(v, 0, 1), *vc = mt_contiguous(vt);
        s = lg ? mt_log_softmax(tc, 0) : mt_softmax(tc, 0);
        assert_int_equal(mt_backward(s, vc), 0);
        g = mt_grad(t);
        assert_tensor_close(g, ref, 1800, 1e-6, 1e-4);
        mt_release(g);
        mt_zero_grad(t);
        mt_release(s);
        mt_release(vc);
        mt_release(vt);
        mt_release(tc);
        mt_release(tt);
    }
    free(x);
    free(cv);
    mt_release(v);
    mt_release(t);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device());
    assert_null(mt_sum(t, MT_DIMS(2), false));
    assert_error(MT_ERR_INVALID, "mt_sum");
    assert_null(mt_mean(t, MT_DIMS(-3), false));
    assert_error(MT_ERR_INVALID, "mt_mean");
    assert_null(mt_sum(t, MT_DIMS(1, -1), false));
    assert_error(MT_ERR_INVALID, "more than once");
    assert_null(mt_max(t, MT_DIMS(0, 0), true));
    assert_error(MT_ERR_INVALID, "mt_max: arg 3: dim 0 appears more than once");
    assert_null(mt_sum(t, 3, (const int[]){0, 1, 0}, false));
    assert_error(MT_ERR_INVALID, "3 dims");
    assert_null(mt_sum(t, -1, NULL, false));
    assert_error(MT_ERR_INVALID, "arg 2");
    assert_null(mt_sum(t, 1, NULL, false));
    assert_error(MT_ERR_NULL, "dims is NULL");
    assert_null(mt_softmax(t, 2));
    assert_error(MT_ERR_INVALID, "mt_softmax");
    assert_null(mt_log_softmax(t, -3));
    assert_error(MT_ERR_INVALID, "mt_log_softmax");
    mt_tensor *i = mt_zeros(MT_SHAPE(4), MT_I64, mt_test_device());
    assert_null(mt_sum_all(i));
    assert_error(MT_ERR_DTYPE, "i64");
    assert_null(mt_softmax(i, 0));
    assert_error(MT_ERR_DTYPE, "mt_softmax");
    /* every reduction names itself on a non-floating input */
    mt_tensor *(*alls[])(mt_tensor *) = {mt_sum_all, mt_mean_all, mt_max_all};
    const char *all_names[] = {"mt_sum_all: arg 1", "mt_mean_all: arg 1", "mt_max_all: arg 1"};
    for (int k = 0; k < 3; k++) {
        assert_null(alls[k](i));
        assert_int_equal(mt_last_status(), MT_ERR_DTYPE);
        assert_non_null(strstr(mt_last_error(), "arg 1: dtype i64"));
        assert_error(MT_ERR_DTYPE, all_names[k]);
    }
    assert_null(mt_sum(i, MT_DIMS(0), false));
    assert_error(MT_ERR_DTYPE, "mt_sum: arg 1");
    assert_null(mt_mean(i, MT_DIMS(0), true));
    assert_error(MT_ERR_DTYPE, "mt_mean: arg 1");
    assert_null(mt_max(i, MT_DIMS(0), false));
    assert_error(MT_ERR_DTYPE, "mt_max: arg 1");
    assert_null(mt_log_softmax(i, 0));
    assert_error(MT_ERR_DTYPE, "mt_log_softmax: arg 1");
    assert_null(mt_max(t, MT_DIMS(5), false));
    assert_error(MT_ERR_INVALID, "mt_max: arg 3");
    assert_null(mt_mean(t, MT_DIMS(0, -2), false));
    assert_error(MT_ERR_INVALID, "mt_mean: arg 3");
    /* softmax of a 0-d tensor accepts dim 0 and -1 only */
    mt_tensor *z = mt_scalar(1, MT_F32, mt_test_device());
    assert_null(mt_softmax(z, 1));
    assert_error(MT_ERR_INVALID, "mt_softmax: arg 2");
    mt_release(z);
    /* NULL in, NULL out, error untouched */
    assert_null(mt_sum(NULL, 0, NULL, false));
    assert_null(mt_softmax(NULL, 0));
    assert_null(mt_max_all(NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_release(i);
    mt_release(t);
}

static void test_out_of_memory(void **state) {
    (void)state;
    mt_tensor *t = mt_ones(MT_SHAPE(64, 1000), MT_F32, mt_test_device());
    mt_set_requires_grad(t, true);
    /* below every output's size (the [1000] sum is 4000 bytes), so each op fails on any
       device whatever scratch its kernels need */
    mt_debug_set_alloc_limit(2048);
    assert_null(mt_softmax(t, 1));
    assert_error(MT_ERR_OOM, "");
    assert_null(mt_sum(t, MT_DIMS(0), false));
    assert_error(MT_ERR_OOM, "");
    assert_null(mt_log_softmax(t, 0));
    assert_error(MT_ERR_OOM, "");
    mt_debug_set_alloc_limit(0);
    /* backward that cannot allocate reports the error and leaks nothing */
    mt_tensor *s = mt_sum(t, MT_DIMS(1), false), *l = mt_sum_all(s);
    mt_debug_set_alloc_limit(4096);
    assert_true(mt_backward(l, NULL) < 0);
    assert_error(MT_ERR_OOM, "");
    mt_debug_set_alloc_limit(0);
    mt_release(l);
    mt_release(s);
    mt_release(t);
}

/* A NaN maximum sends the gradient to the NaN element(s), as torch's max() does (values
   printed by python3-torch 1.13: max_all of [[1, nan, 3], [2, 5, 5]] gives [[0, 1, 0],
   [0, 0, 0]]); the same rule per row for mt_max over a dim (torch 1.13's amax gives the NaN
   row nan everywhere instead: the NaN element is the useful answer). Ties share evenly. */
static void test_max_grad_nan(void **state) {
    (void)state;
    const double v[] = {1, NAN, 3, 2, 5, 5};
    mt_tensor *x = mt_test_tensor(v, MT_F64, MT_SHAPE(2, 3));
    mt_set_requires_grad(x, true);
    mt_tensor *m = mt_max_all(x);
    assert_int_equal(mt_backward(m, NULL), 0);
    mt_tensor *g = mt_grad(x);
    assert_tensor_close(g, ((const double[]){0, 1, 0, 0, 0, 0}), 6, 0, 0);
    mt_release(g);
    mt_release(m);
    assert_int_equal(mt_set_grad(x, NULL), 0);
    mt_tensor *r = mt_max(x, MT_DIMS(1), false), *s = mt_sum_all(r);
    assert_int_equal(mt_backward(s, NULL), 0);
    g = mt_grad(x);
    assert_tensor_close(g, ((const double[]){0, 1, 0, 0, 0.5, 0.5}), 6, 0, 0);
    mt_tensor *rel[] = {g, r, s, x};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) mt_release(rel[i]);
    assert_no_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_forward_all_dims_f32_f64),
        MT_TEST(test_forward_low_precision),
        MT_TEST(test_all_and_scalar),
        MT_TEST(test_empty),
        MT_TEST(test_non_contiguous),
        MT_TEST(test_parallel_paths),
        MT_TEST(test_many_column_tiles),
        MT_TEST(test_large_sum_accuracy),
        MT_TEST(test_low_precision_accumulates_in_fp32),
        MT_TEST(test_autocast_dtypes),
        MT_TEST(test_sum_mean_backward_values),
        MT_TEST(test_max_backward_ties),
        MT_TEST(test_max_nan_propagates),
        MT_TEST(test_max_nan_long_rows),
        MT_TEST(test_gradcheck_reductions),
        MT_TEST(test_gradcheck_all_reductions),
        MT_TEST(test_softmax_forward),
        MT_TEST(test_softmax_layouts_and_sizes),
        MT_TEST(test_softmax_stability),
        MT_TEST(test_gradcheck_softmax),
        MT_TEST(test_softmax_backward_f32),
        MT_TEST(test_errors),
        MT_TEST(test_out_of_memory),
        MT_TEST(test_max_grad_nan),
    };
    return MT_RUN_TESTS(tests);
}

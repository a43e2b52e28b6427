/* Layer norm, batch norm and the fused batch norm + residual + relu: forward against naive
   formulas in double (every floating dtype), running-statistics updates, eval mode, FP64
   finite-difference gradients, autocast (the activation stays low, parameters and
   statistics FP32), error paths, and the clean refusal on devices without the kernels. */
#include "test_util.h"

/* deterministic pseudo-random values in [-2, 2) */
static void fill_values(double *v, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (double)(s >> 8) / 16777216.0 * 4.0 - 2.0;
    }
}

static mt_tensor *random_tensor(mt_dtype dt, uint32_t seed, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc((size_t)n * sizeof *v);
    fill_values(v, n, seed);
    mt_tensor *t = mt_test_tensor(v, dt, ndim, shape);
    free(v);
    return t;
}

static double tol_for(mt_dtype dt) {
    return dt == MT_F64 ? 1e-12 : dt == MT_F32 ? 1e-5 : dt == MT_F16 ? 4e-3 : 3e-2;
}

/* ---------------------------------------------------------------- layer norm */

/* rows of D values: y = (x - mean) / sqrt(var + eps) * w + b, values rounded like x first */
static void layer_norm_ref(const double *x, const double *w, const double *b, int64_t rows,
                           int64_t D, double eps, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * D;
        double m = 0, v = 0;
        for (int64_t j = 0; j < D; j++) m += xr[j] / (double)D;
        for (int64_t j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m) / (double)D;
        for (int64_t j = 0; j < D; j++)
            y[r * D + j] = (xr[j] - m) / sqrt(v + eps) * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

static void test_layer_norm_reference(void **state) {
    (void)state;
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++)
        for (int nd = 1; nd <= 2; nd++)
            for (int affine = 0; affine < 2; affine++) {
                mt_scope_begin();
                mt_tensor *x = random_tensor(dts[k], 1, MT_SHAPE(2, 3, 4));
                mt_dtype pdt = dts[k] == MT_F64 ? MT_F64 : MT_F32;
                const int64_t *pshape = (const int64_t[]){3, 4} + (2 - nd);
                mt_tensor *w = affine ? random_tensor(pdt, 2, nd, pshape) : NULL;
                mt_tensor *b = affine ? random_tensor(pdt, 3, nd, pshape) : NULL;
                mt_tensor *y = mt_layer_norm(x, nd, w, b, 1e-5);
                assert_no_error();
                assert_int_equal(mt_dtype_of(y), dts[k]);
                assert_shape(y, 2, 3, 4);
                double *xv = mt_test_values(x), *wv = w ? mt_test_values(w) : NULL,
                       *bv = b ? mt_test_values(b) : NULL, ref[24];
                int64_t D = nd == 1 ? 4 : 12;
                layer_norm_ref(xv, wv, bv, 24 / D, D, 1e-5, ref);
                assert_tensor_close(y, ref, 24, tol_for(dts[k]), tol_for(dts[k]));
                free(xv);
                free(wv);
                free(bv);
                mt_scope_end();
            }
}

typedef struct {
    int nd;
    bool affine;
} ln_gc;

static mt_tensor *ln_fn(mt_tensor *const *in, void *ctx) {
    const ln_gc *g = ctx;
    return mt_layer_norm(in[0], g->nd, g->affine ? in[1] : NULL, g->affine ? in[2] : NULL, 1e-5);
}

static void test_layer_norm_gradcheck(void **state) {
    (void)state;
    mt_scope_begin();
    for (int nd = 1; nd <= 2; nd++) {
        const int64_t *ps = (const int64_t[]){3, 5} + (2 - nd);
        mt_tensor *in[3] = {random_tensor(MT_F64, 4, MT_SHAPE(2, 3, 5)),
                            random_tensor(MT_F64, 5, nd, ps), random_tensor(MT_F64, 6, nd, ps)};
        for (int i = 0; i < 3; i++) mt_set_requires_grad(in[i], true);
        ln_gc g = {nd, true};
        if (mt_gradcheck(ln_fn, in, 3, &g, NULL)) fail_msg("%s", mt_last_error());
        g.affine = false;
        mt_set_requires_grad(in[1], false);
        mt_set_requires_grad(in[2], false);
        if (mt_gradcheck(ln_fn, in, 3, &g, NULL)) fail_msg("%s", mt_last_error());
    }
    mt_scope_end();
}

/* No rows: an empty result, and zero gradients for weight and bias. */
static void test_layer_norm_empty(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_zeros(MT_SHAPE(0, 4), MT_F32, mt_test_device());
    mt_tensor *w = mt_full(MT_SHAPE(4), MT_F32, mt_test_device(), 2.0);
    mt_tensor *b = mt_zeros(MT_SHAPE(4), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_tensor *y = mt_layer_norm(x, 1, w, b, 1e-5);
    assert_shape(y, 0, 4);
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    double zero[4] = {0};
    assert_tensor_close(mt_grad(w), zero, 4, 0, 0);
    assert_tensor_close(mt_grad(b), zero, 4, 0, 0);
    mt_scope_end();
}

/* A row whose mean square passes F32's range has an infinite variance: the output is 0 (as
   torch and the two-pass CUDA kernel), not inf - inf. */
static void test_layer_norm_huge_row(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_test_tensor((const double[]){3e19, -3e19}, MT_F32, MT_SHAPE(1, 2));
    assert_tensor_close(mt_layer_norm(x, 1, NULL, NULL, 1e-5), ((const double[]){0, 0}), 2, 0, 0);
    mt_scope_end();
}

/* A non-contiguous input is normalised as its logical values. */
static void test_layer_norm_strided(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = random_tensor(MT_F32, 7, MT_SHAPE(4, 3));
    mt_tensor *xt = mt_transpose(x, 0, 1), *xc = mt_contiguous(xt);
    mt_tensor *a = mt_layer_norm(xt, 1, NULL, NULL, 1e-5),
              *b = mt_layer_norm(xc, 1, NULL, NULL, 1e-5);
    double *bv = mt_test_values(b);
    assert_tensor_close(a, bv, 12, 0, 0);
    free(bv);
    mt_scope_end();
}

/* ---------------------------------------------------------------- batch norm */

typedef struct {
    int64_t N, C, S;
} bn_shape;

/* y = act((x - mean) / sqrt(var + eps) * w + b + res); batch statistics (training) update
   rm/rv in place, else rm/rv are used */
static void batch_norm_ref(bn_shape s, const double *x, double *rm, double *rv, const double *w,
                           const double *b, const double *res, bool training, double mom,
                           double eps, bool relu, double *y) {
    int64_t M = s.N * s.S;
    for (int64_t c = 0; c < s.C; c++) {
        double m = 0, v = 0;
        for (int64_t n = 0; n < s.N; n++)
            for (int64_t i = 0; i < s.S; i++) m += x[(n * s.C + c) * s.S + i] / (double)M;
        for (int64_t n = 0; n < s.N; n++)
            for (int64_t i = 0; i < s.S; i++) {
                double d = x[(n * s.C + c) * s.S + i] - m;
                v += d * d / (double)M;
            }
        if (training && rm) {
            rm[c] = (1 - mom) * rm[c] + mom * m;
            rv[c] = (1 - mom) * rv[c] + mom * v * (double)M / (double)(M - 1);
        }
        if (!training) {
            m = rm[c];
            v = rv[c];
        }
        for (int64_t n = 0; n < s.N; n++)
            for (int64_t i = 0; i < s.S; i++) {
                int64_t k = (n * s.C + c) * s.S + i;
                double t = (x[k] - m) / sqrt(v + eps) * (w ? w[c] : 1) + (b ? b[c] : 0);
                if (res) t += res[k];
                y[k] = relu && t < 0 ? 0 : t;
            }
    }
}

/* y against batch_norm_ref's output and the running statistics against its update (FP32 for
   every low dtype, F64 for F64). */
static void assert_bn_matches(mt_dtype dt, mt_tensor *y, const double *ref, int64_t n,
                              mt_tensor *rm, const double *rm0, mt_tensor *rv, const double *rv0) {
    assert_tensor_close(y, ref, n, tol_for(dt), tol_for(dt));
    double t = dt == MT_F64 ? 1e-12 : 1e-5;
    assert_tensor_close(rm, rm0, 2, t, t);
    assert_tensor_close(rv, rv0, 2, t, t);
}

static void check_bn(mt_dtype dt, bool training, bool with_res, bool relu) {
    mt_scope_begin();
    bn_shape s = {3, 2, 6};
    mt_dtype pdt = dt == MT_F64 ? MT_F64 : MT_F32;
    mt_tensor *x = random_tensor(dt, 11, MT_SHAPE(3, 2, 2, 3));
    mt_tensor *res = with_res ? random_tensor(dt, 12, MT_SHAPE(3, 2, 2, 3)) : NULL;
    mt_tensor *w = random_tensor(pdt, 13, MT_SHAPE(2)), *b = random_tensor(pdt, 14, MT_SHAPE(2));
    double rm0[2] = {0.25, -0.5}, rv0[2] = {1.5, 0.75};
    mt_tensor *rm = mt_test_tensor(rm0, pdt, MT_SHAPE(2)),
              *rv = mt_test_tensor(rv0, pdt, MT_SHAPE(2));
    mt_tensor *y = with_res || relu ? mt_batch_norm_act(x, rm, rv, w, b, res, training, 0.1, 1e-5,
                                                        relu ? MT_ACT_RELU : MT_ACT_NONE)
                                    : mt_batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
    assert_no_error();
    assert_int_equal(mt_dtype_of(y), dt);
    double *xv = mt_test_values(x), *wv = mt_test_values(w), *bv = mt_test_values(b);
    double *resv = res ? mt_test_values(res) : NULL, ref[36];
    batch_norm_ref(s, xv, rm0, rv0, wv, bv, resv, training, 0.1, 1e-5, relu, ref);
    assert_bn_matches(dt, y, ref, 36, rm, rm0, rv, rv0);
    free(xv);
    free(wv);
    free(bv);
    free(resv);
    mt_scope_end();
}

static void test_batch_norm_reference(void **state) {
    (void)state;
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++)
        for (int training = 0; training < 2; training++) {
            check_bn(dts[k], training, false, false);
            check_bn(dts[k], training, true, true);
            check_bn(dts[k], training, false, true);
            check_bn(dts[k], training, true, false);
        }
}

/* Channels that take several blocks on CUDA (partial sums per split, finished per channel):
   NCHW runs shorter than a block's 256 values (S = 56) and longer (S = 1056), splits that
   end inside a run, and the same inputs channels-last; training with the running update,
   weight, bias, residual and relu, against the double reference. */
static void check_bn_split(mt_dtype dt, const int64_t *dims, bool cl) {
    mt_scope_begin();
    bn_shape s = {dims[0], dims[1], dims[2] * dims[3]};
    int64_t n = s.N * s.C * s.S, C = s.C;
    mt_dtype pdt = dt == MT_F64 ? MT_F64 : MT_F32;
    mt_tensor *x = random_tensor(dt, 71, 4, dims), *res = random_tensor(dt, 72, 4, dims);
    if (cl) {
        x = mt_to_channels_last(x);
        res = mt_to_channels_last(res);
    }
    mt_tensor *w = random_tensor(pdt, 73, 1, &C), *b = random_tensor(pdt, 74, 1, &C);
    double rm0[2] = {0.25, -0.5}, rv0[2] = {1.5, 0.75};
    mt_tensor *rm = mt_test_tensor(rm0, pdt, 1, &C), *rv = mt_test_tensor(rv0, pdt, 1, &C);
    for (int relu = 0; relu < 2; relu++) {
        mt_tensor *y = mt_batch_norm_act(x, rm, rv, w, b, relu ? res : NULL, true, 0.1, 1e-5,
                                         relu ? MT_ACT_RELU : MT_ACT_NONE);
        assert_no_error();
        double *xv = mt_test_values(x), *wv = mt_test_values(w), *bv = mt_test_values(b);
        double *resv = relu ? mt_test_values(res) : NULL, *ref = malloc((size_t)n * sizeof *ref);
        batch_norm_ref(s, xv, rm0, rv0, wv, bv, resv, true, 0.1, 1e-5, relu, ref);
        assert_bn_matches(dt, y, ref, n, rm, rm0, rv, rv0);
        free(xv);
        free(wv);
        free(bv);
        free(resv);
        free(ref);
    }
    mt_scope_end();
}

static void test_batch_norm_splits(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F32, MT_F64, MT_BF16};
    for (int k = 0; k < 3; k++)
        for (int cl = 0; cl < 2; cl++) {
            check_bn_split(dts[k], (const int64_t[]){160, 2, 7, 8}, cl);
            check_bn_split(dts[k], (const int64_t[]){8, 2, 32, 33}, cl);
        }
}

/* Large mean against a small spread: the one-pass statistics must not cancel. */
static void test_batch_norm_offset(void **state) {
    (void)state;
    mt_scope_begin();
    double v[8];
    for (int i = 0; i < 8; i++) v[i] = 10000.0 + (i % 4) * 0.125;
    mt_tensor *x = mt_test_tensor(v, MT_F32, MT_SHAPE(4, 2));
    mt_tensor *y = mt_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 0.0);
    double ref[8];
    batch_norm_ref((bn_shape){4, 2, 1}, v, NULL, NULL, NULL, NULL, NULL, true, 0.1, 0.0, false,
                   ref);
    assert_tensor_close(y, ref, 8, 1e-4, 1e-4);
    mt_scope_end();
}

/* Batches beyond what cuDNN's spatial batch norm takes (880,801 in training, 65,535 in eval:
   its kernels put the batch in a grid dimension) run on the own kernels, with the same
   results; on the emulated device the fake cuDNN refuses them. */
static void check_bn_batch(int64_t N, int64_t C, bool training) {
    mt_scope_begin();
    bn_shape s = {N, C, 1};
    mt_tensor *x = random_tensor(MT_F32, 61, MT_SHAPE(N, C));
    double rm0[2] = {0.25, -0.5}, rv0[2] = {1.5, 0.75};
    mt_tensor *rm = mt_test_tensor(rm0, MT_F32, 1, &C), *rv = mt_test_tensor(rv0, MT_F32, 1, &C);
    mt_tensor *y = mt_batch_norm(x, rm, rv, NULL, NULL, training, 0.1, 1e-5);
    assert_no_error();
    double *xv = mt_test_values(x), *ref = malloc((size_t)(N * C) * sizeof *ref);
    batch_norm_ref(s, xv, rm0, rv0, NULL, NULL, NULL, training, 0.1, 1e-5, false, ref);
    assert_tensor_close(y, ref, N * C, 1e-4, 1e-4);
    assert_tensor_close(rm, rm0, C, 1e-5, 1e-5);
    assert_tensor_close(rv, rv0, C, 1e-5, 1e-5);
    free(xv);
    free(ref);
    mt_scope_end();
}

static void test_batch_norm_large_batch(void **state) {
    (void)state;
    check_bn_batch(65536, 2, false);
    check_bn_batch(880802, 1, true);
}

typedef struct {
    bool training, relu, plain; /* plain: no weight, bias or residual */
} bn_gc;

static mt_tensor *bn_fn(mt_tensor *const *in, void *ctx) {
    const bn_gc *g = ctx;
    /* the running buffers are fresh each call: the gradient check calls this many times */
    mt_tensor *rm = mt_zeros(MT_SHAPE(2), MT_F64, mt_test_device());
    mt_tensor *rv = mt_ones(MT_SHAPE(2), MT_F64, mt_test_device());
    mt_tensor *w = g->plain ? NULL : in[1], *b = g->plain ? NULL : in[2];
    mt_tensor *res = g->plain ? NULL : in[3];
    mt_tensor *y = mt_batch_norm_act(in[0], rm, rv, w, b, res, g->training, 0.1, 1e-5,
                                     g->relu ? MT_ACT_RELU : MT_ACT_NONE);
    mt_test_drop(rm);
    mt_test_drop(rv);
    return y;
}

static mt_tensor *in2_dummy(void) {
    return mt_zeros(MT_SHAPE(1), MT_F64, mt_test_device());
}

static void test_batch_norm_gradcheck(void **state) {
    (void)state;
    mt_scope_begin();
    for (int mode = 0; mode < 4; mode++) {
        bn_gc g = {mode & 1, (mode >> 1) & 1, false};
        mt_tensor *in[4] = {
            random_tensor(MT_F64, 21, MT_SHAPE(3, 2, 4)), random_tensor(MT_F64, 22, MT_SHAPE(2)),
            random_tensor(MT_F64, 23, MT_SHAPE(2)), random_tensor(MT_F64, 24, MT_SHAPE(3, 2, 4))};
        for (int i = 0; i < 4; i++) mt_set_requires_grad(in[i], true);
        if (mt_gradcheck(bn_fn, in, 4, &g, NULL))
            fail_msg("training %d relu %d: %s", g.training, g.relu, mt_last_error());
        g.plain = true;
        for (int i = 1; i < 4; i++) mt_set_requires_grad(in[i], false);
        if (mt_gradcheck(bn_fn, in, 4, &g, NULL))
            fail_msg("plain, training %d relu %d: %s", g.training, g.relu, mt_last_error());
    }
    /* an [N, C] input */
    bn_gc g = {true, false, true};
    mt_tensor *in2[4] = {random_tensor(MT_F64, 25, MT_SHAPE(5, 2)), in2_dummy(), in2_dummy(),
                         in2_dummy()};
    mt_set_requires_grad(in2[0], true);
    if (mt_gradcheck(bn_fn, in2, 4, &g, NULL)) fail_msg("[N, C]: %s", mt_last_error());
    mt_scope_end();
}

/* Only the residual needs a gradient: it gets the incoming gradient, masked by the relu. */
static void test_batch_norm_act_residual_grad(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = random_tensor(MT_F32, 51, MT_SHAPE(4, 2, 3));
    mt_tensor *res = random_tensor(MT_F32, 52, MT_SHAPE(4, 2, 3));
    mt_set_requires_grad(res, true);
    mt_tensor *y = mt_batch_norm_act(x, NULL, NULL, NULL, NULL, res, true, 0.1, 1e-5, MT_ACT_RELU);
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    double *yv = mt_test_values(y), mask[24];
    for (int i = 0; i < 24; i++) mask[i] = yv[i] > 0;
    assert_tensor_close(mt_grad(res), mask, 24, 0, 0);
    assert_null(mt_grad(x));
    free(yv);
    mt_scope_end();
}

/* relu(bn(x)) propagates NaN as torch's relu does: a NaN in a channel makes its statistics
   NaN, and every output of that channel must be NaN, not a clamped 0 that would hide the
   overflow from the GradScaler. NCHW and channels-last, F32 and F16 (the CUDA backend's
   cuDNN Ex path and its own kernels). */
/* Edges where torch defines the result: eps 0 on a constant channel normalises by 0 (its
   InvStd), not by inf, so output and gradient are 0, not NaN; an empty batch trains to an
   empty result, leaves the running buffers alone, and gives weight and bias zero gradients
   (the CUDA kernel returned before writing them). */
static void test_batch_norm_torch_edges(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(2, 2, 2, 2), MT_F32, dev);
    mt_set_requires_grad(x, true);
    mt_tensor *y = mt_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 0.0);
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(y, y)), NULL), 0);
    double zeros[16] = {0};
    assert_tensor_close(y, zeros, 16, 0, 0);
    assert_tensor_close(mt_grad(x), zeros, 16, 0, 0);
    for (int training = 0; training < 2; training++) {
        mt_tensor *e = mt_zeros(MT_SHAPE(0, 3, 4, 4), MT_F32, dev);
        mt_tensor *rm = mt_zeros(MT_SHAPE(3), MT_F32, dev), *rv = mt_ones(MT_SHAPE(3), MT_F32, dev);
        mt_tensor *w = mt_full(MT_SHAPE(3), MT_F32, dev, 2.0),
                  *b = mt_ones(MT_SHAPE(3), MT_F32, dev);
        mt_set_requires_grad(w, true);
        mt_set_requires_grad(b, true);
        y = mt_batch_norm_act(e, rm, rv, w, b, NULL, training, 0.1, 1e-5, MT_ACT_RELU);
        assert_non_null(y);
        assert_shape(y, 0, 3, 4, 4);
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        assert_tensor_close(mt_grad(w), zeros, 3, 0, 0);
        assert_tensor_close(mt_grad(b), zeros, 3, 0, 0);
        assert_tensor_close(rm, zeros, 3, 0, 0);
        assert_tensor_close(rv, ((const double[]){1, 1, 1}), 3, 0, 0);
    }
    mt_scope_end();
}

static void test_batch_norm_act_nan(void **state) {
    (void)state;
    const mt_dtype dts[2] = {MT_F32, MT_F16};
    for (int i = 0; i < 4; i++) {
        mt_scope_begin();
        double v[32];
        fill_values(v, 32, 61);
        v[5] = NAN; /* [0, 1, 0, 1] in NCHW: channel 1 */
        mt_tensor *x = mt_test_tensor(v, dts[i % 2], MT_SHAPE(2, 4, 2, 2));
        if (i >= 2) x = mt_to_channels_last(x);
        mt_tensor *y =
            mt_batch_norm_act(x, NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, MT_ACT_RELU);
        assert_non_null(y);
        double *yv = mt_test_values(mt_contiguous(y));
        for (int n = 0; n < 2; n++)
            for (int c = 0; c < 4; c++)
                for (int s = 0; s < 4; s++) {
                    double e = yv[(n * 4 + c) * 4 + s];
                    if (c == 1)
                        assert_true(isnan(e));
                    else
                        assert_true(e >= 0);
                }
        free(yv);
        mt_scope_end();
    }
}

/* An inf among a channel's (or a row's) values makes its variance NaN (inf - inf), as in torch:
   every output of that channel or row is NaN, and so is the running variance. The variance's
   clamp at 0 once turned that NaN into 0 on the CPU and in the own CUDA kernels, which gave
   -inf outputs (0 after a ReLU) and a finite running variance, unlike cuDNN. NCHW and
   channels-last, F32 and F16, batch norm and layer norm. */
static void test_norm_inf_makes_nan(void **state) {
    (void)state;
    const mt_dtype dts[2] = {MT_F32, MT_F16};
    for (int i = 0; i < 4; i++) {
        mt_scope_begin();
        double v[32];
        fill_values(v, 32, 67);
        v[5] = INFINITY; /* [0, 1, 0, 1] in NCHW: channel 1; in layer norm's [8, 4]: row 1 */
        mt_tensor *x = mt_test_tensor(v, dts[i % 2], MT_SHAPE(2, 4, 2, 2));
        if (i >= 2) x = mt_to_channels_last(x);
        mt_tensor *rm = mt_zeros(MT_SHAPE(4), MT_F32, mt_test_device());
        mt_tensor *rv = mt_ones(MT_SHAPE(4), MT_F32, mt_test_device());
        mt_tensor *y = mt_batch_norm(x, rm, rv, NULL, NULL, true, 0.1, 1e-5);
        assert_non_null(y);
        double *yv = mt_test_values(mt_contiguous(y)), *mv = mt_test_values(rm),
               *vv = mt_test_values(rv);
        for (int n = 0; n < 2; n++)
            for (int c = 0; c < 4; c++)
                for (int s = 0; s < 4; s++)
                    assert_true(c == 1 ? isnan(yv[(n * 4 + c) * 4 + s])
                                       : isfinite(yv[(n * 4 + c) * 4 + s]));
        for (int c = 0; c < 4; c++) {
            assert_true(c == 1 ? isnan(vv[c]) : isfinite(vv[c]));
            assert_true(c == 1 ? !isfinite(mv[c]) : isfinite(mv[c]));
        }
        free(yv);
        free(mv);
        free(vv);
        mt_tensor *z =
            mt_layer_norm(mt_test_tensor(v, dts[i % 2], MT_SHAPE(8, 4)), 1, NULL, NULL, 1e-5);
        double *zv = mt_test_values(z);
        for (int k = 0; k < 32; k++) assert_true(k / 4 == 1 ? isnan(zv[k]) : isfinite(zv[k]));
        free(zv);
        assert_no_error();
        mt_scope_end();
    }
}

/* O1 and O2 BF16: the activation stays BF16, weight, bias and statistics stay FP32, and the
   gradients come back in each input's dtype. */
static void test_norm_autocast(void **state) {
    (void)state;
    for (int level = 0; level < 2; level++) {
        mt_scope_begin();
        mt_tensor *x = random_tensor(MT_BF16, 31, MT_SHAPE(2, 3, 4));
        mt_tensor *w = random_tensor(MT_F32, 32, MT_SHAPE(3)),
                  *b = random_tensor(MT_F32, 33, MT_SHAPE(3));
        mt_tensor *rm = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
        mt_tensor *rv = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
        mt_set_requires_grad(x, true);
        mt_set_requires_grad(w, true);
        mt_set_requires_grad(b, true);
        mt_autocast_begin(MT_BF16, level ? MT_AMP_O2 : MT_AMP_O1);
        mt_tensor *y = mt_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
        mt_tensor *lw = random_tensor(MT_F32, 34, MT_SHAPE(4));
        mt_tensor *z = mt_layer_norm(y, 1, lw, NULL, 1e-5);
        mt_autocast_end();
        assert_no_error();
        assert_int_equal(mt_dtype_of(y), MT_BF16);
        assert_int_equal(mt_dtype_of(z), MT_BF16);
        assert_int_equal(mt_dtype_of(rm), MT_F32);
        /* the statistics were taken from the BF16 values in FP32 */
        double *xv = mt_test_values(x), *wv = mt_test_values(w), *bv = mt_test_values(b), ref[24];
        double rm0[3] = {0, 0, 0}, rv0[3] = {1, 1, 1};
        batch_norm_ref((bn_shape){2, 3, 4}, xv, rm0, rv0, wv, bv, NULL, true, 0.1, 1e-5, false,
                       ref);
        assert_tensor_close(y, ref, 24, 3e-2, 3e-2);
        assert_tensor_close(rm, rm0, 3, 1e-6, 1e-6);
        assert_tensor_close(rv, rv0, 3, 1e-6, 1e-6);
        assert_int_equal(mt_backward(mt_sum_all(z), NULL), 0);
        mt_tensor *gx = mt_grad(x), *gw = mt_grad(w), *gb = mt_grad(b);
        assert_non_null(gx);
        assert_int_equal(mt_dtype_of(gx), MT_BF16);
        assert_int_equal(mt_dtype_of(gw), MT_F32);
        assert_int_equal(mt_dtype_of(gb), MT_F32);
        free(xv);
        free(wv);
        free(bv);
        mt_scope_end();
    }
}

/* The running buffers are written without history and bump their version; eval leaves them. */
static void test_batch_norm_running_buffers(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = random_tensor(MT_F32, 41, MT_SHAPE(4, 3));
    mt_tensor *rm = mt_zeros(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *rv = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    mt_tensor *y = mt_batch_norm(x, rm, rv, NULL, NULL, true, 0.5, 1e-5);
    assert_non_null(y);
    assert_false(mt_requires_grad(rm));
    assert_string_equal(mt_grad_fn_name(rm), "");
    double *before = mt_test_values(rm);
    y = mt_batch_norm(x, rm, rv, NULL, NULL, false, 0.5, 1e-5);
    assert_non_null(y);
    assert_tensor_close(rm, before, 3, 0, 0);
    /* momentum 0 keeps them, momentum 1 replaces them by the batch statistics */
    y = mt_batch_norm(x, rm, rv, NULL, NULL, true, 0.0, 1e-5);
    assert_tensor_close(rm, before, 3, 0, 0);
    free(before);
    mt_scope_end();
}

static void test_norm_errors(void **state) {
    (void)state;
    mt_scope_begin();
    mt_device dev = mt_test_device();
    mt_tensor *x = mt_zeros(MT_SHAPE(2, 3, 4), MT_F32, dev);
    mt_tensor *w3 = mt_ones(MT_SHAPE(3), MT_F32, dev), *w4 = mt_ones(MT_SHAPE(4), MT_F32, dev);
    mt_tensor *i64 = mt_zeros(MT_SHAPE(2, 3), MT_I64, dev);
    assert_null(mt_layer_norm(NULL, 1, NULL, NULL, 1e-5));
    assert_int_equal(mt_last_status(), MT_OK);
    assert_null(mt_layer_norm(x, 0, NULL, NULL, 1e-5));
    assert_error(MT_ERR_INVALID, "normalized_ndim 0 must be in [1, 3]");
    assert_null(mt_layer_norm(x, 1, w3, NULL, 1e-5));
    assert_error(MT_ERR_SHAPE, "mt_layer_norm: arg 3: weight shape [3] must equal the last 1");
    assert_null(mt_layer_norm(x, 1, w4, w3, 1e-5));
    assert_error(MT_ERR_SHAPE, "arg 4: bias shape [3]");
    assert_null(mt_layer_norm(x, 1, NULL, NULL, -1));
    assert_error(MT_ERR_INVALID, "eps");
    assert_null(mt_layer_norm(i64, 1, NULL, NULL, 1e-5));
    assert_error(MT_ERR_DTYPE, "mt_layer_norm");
    assert_null(mt_batch_norm(w3, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_SHAPE, "input must be [N, C, ...], got shape [3]");
    assert_null(mt_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5));
    assert_error(MT_ERR_INVALID, "eval mode");
    assert_null(mt_batch_norm(x, w3, NULL, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_INVALID, "given together");
    assert_null(mt_batch_norm(x, w4, w4, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_SHAPE, "running_mean shape [4] must be [C] = [3]");
    mt_tensor *r64 = mt_zeros(MT_SHAPE(3), MT_F64, dev);
    assert_null(mt_batch_norm(x, r64, r64, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_DTYPE, "running_mean must be f32");
    assert_null(mt_batch_norm(x, NULL, NULL, w4, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_SHAPE, "arg 4: weight");
    mt_tensor *one = mt_zeros(MT_SHAPE(1, 3), MT_F32, dev);
    assert_null(mt_batch_norm(one, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_SHAPE, "more than 1 value per channel");
    assert_null(mt_batch_norm_act(x, NULL, NULL, NULL, NULL, w3, true, 0.1, 1e-5, MT_ACT_RELU));
    assert_error(MT_ERR_SHAPE, "residual shape [3] differs");
    /* the fused add runs in x's dtype, where the unfused add would promote */
    mt_tensor *res16 = mt_cast(x, MT_F16);
    assert_null(mt_batch_norm_act(x, NULL, NULL, NULL, NULL, res16, true, 0.1, 1e-5, MT_ACT_RELU));
    assert_error(MT_ERR_DTYPE, "arg 6: residual is f16, the input f32");
    mt_release(res16);
    assert_null(mt_batch_norm_act(x, NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, 7));
    assert_error(MT_ERR_INVALID, "activation 7");
    mt_tensor *rg = mt_zeros(MT_SHAPE(3), MT_F32, dev);
    mt_set_requires_grad(rg, true);
    assert_null(mt_batch_norm(x, rg, w3, NULL, NULL, true, 0.1, 1e-5));
    assert_error(MT_ERR_INVALID, "requires grad");
    mt_scope_end();
}

/* One fault injected into the fake cuDNN (MTEMU_CUDNN_FAIL) around a batch norm in training
   and the backward of sum(y * y): returns the forward's result (NULL if it failed) and sets
   *bwd to the backward's status. */
static mt_tensor *bn_train_with(const char *fwd_fail, const char *bwd_fail, mt_tensor *x,
                                mt_tensor *rm, mt_tensor *rv, int *bwd) {
    setenv("MTEMU_CUDNN_FAIL", fwd_fail, 1);
    mt_tensor *y = mt_batch_norm(x, rm, rv, NULL, NULL, true, 0.1, 1e-5);
    setenv("MTEMU_CUDNN_FAIL", bwd_fail, 1);
    *bwd = y ? mt_backward(mt_sum_all(mt_mul(y, y)), NULL) : -1;
    unsetenv("MTEMU_CUDNN_FAIL");
    return y;
}

/* On CUDA the plain batch norm in training runs through cuDNN on F16 activations, forward and
   backward; F32 and F64 training run on the own kernels, whose statistics are sums of shifted
   values in double (through cuDNN, FP32 statistics lost digits on offset data on an H200:
   src/cuda/bn_cudnn.c); eval and the fused residual + ReLU on F32 do not call the training
   entry points either. A fault injected into the fake cuDNN shows the routing (the fake's
   numerics would not: it is more exact than the real one). On F32 and F64 the faults change
   nothing, as cuDNN is never called; on F16 each is a clear error naming the op and the call,
   and changes nothing: the running buffers keep their values and no gradient appears. */
static void test_batch_norm_cudnn_routing(void **state) {
    (void)state;
    const char *fwd = "cudnnBatchNormalizationForwardTraining=2000",
               *bwd = "cudnnBatchNormalizationBackward=5000";
    mt_device d = mt_test_device();
    mt_scope_begin();
    int rc;
    const mt_dtype own[] = {MT_F32, MT_F64};
    for (int k = 0; k < 2; k++) {
        mt_tensor *x = random_tensor(own[k], 41 + (uint32_t)k, MT_SHAPE(4, 3, 5));
        mt_set_requires_grad(x, true);
        mt_tensor *rm = own[k] == MT_F32 ? mt_zeros(MT_SHAPE(3), MT_F32, d) : NULL;
        mt_tensor *rv = own[k] == MT_F32 ? mt_ones(MT_SHAPE(3), MT_F32, d) : NULL;
        if (!bn_train_with(fwd, bwd, x, rm, rv, &rc))
            fail_msg("%s batch norm in training called cuDNN: %s", mt_dtype_name(own[k]),
                     mt_last_error());
        if (rc != 0)
            fail_msg("%s batch norm backward called cuDNN: %s", mt_dtype_name(own[k]),
                     mt_last_error());
        mt_tensor *gx = mt_grad(x);
        assert_non_null(gx);
        mt_release(gx);
    }
    mt_tensor *x = random_tensor(MT_F16, 43, MT_SHAPE(4, 3, 5));
    mt_set_requires_grad(x, true);
    mt_tensor *rm = mt_zeros(MT_SHAPE(3), MT_F32, d), *rv = mt_ones(MT_SHAPE(3), MT_F32, d);
    assert_null(bn_train_with(fwd, "", x, rm, rv, &rc));
    assert_error(MT_ERR_DEVICE, "mt_batch_norm: cuDNN error in "
                                "cudnnBatchNormalizationForwardTraining: CUDNN_STATUS_BAD_PARAM");
    assert_tensor_close(rm, ((const double[]){0, 0, 0}), 3, 0, 0);
    assert_tensor_close(rv, ((const double[]){1, 1, 1}), 3, 0, 0);
    setenv("MTEMU_CUDNN_FAIL", fwd, 1);
    assert_non_null(mt_batch_norm(x, rm, rv, NULL, NULL, false, 0.1, 1e-5)); /* eval: inference */
    mt_tensor *w = mt_ones(MT_SHAPE(3), MT_F32, d), *b = mt_zeros(MT_SHAPE(3), MT_F32, d);
    mt_tensor *x32 = random_tensor(MT_F32, 44, MT_SHAPE(4, 3, 5));
    assert_non_null(mt_batch_norm_act(x32, NULL, NULL, w, b, x32, true, 0.1, 1e-5, MT_ACT_RELU));
    unsetenv("MTEMU_CUDNN_FAIL");
    assert_non_null(bn_train_with("", bwd, x, rm, rv, &rc));
    assert_int_not_equal(rc, 0);
    assert_error(MT_ERR_DEVICE, "cuDNN error in cudnnBatchNormalizationBackward: "
                                "CUDNN_STATUS_EXECUTION_FAILED");
    assert_null(mt_grad(x));
    mt_scope_end();
}

/* Eval mode's plain batch norm runs through cudnnBatchNormalizationForwardInference: a fault
   injected there is the op's error; the fused ReLU in eval stays on the own kernels. */
static void test_batch_norm_cudnn_eval(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = random_tensor(MT_F32, 47, MT_SHAPE(4, 3, 5));
    mt_tensor *rm = random_tensor(MT_F32, 48, MT_SHAPE(3)), *rv = mt_ones(MT_SHAPE(3), MT_F32, d);
    setenv("MTEMU_CUDNN_FAIL", "cudnnBatchNormalizationForwardInference=2000", 1);
    assert_null(mt_batch_norm(x, rm, rv, NULL, NULL, false, 0.1, 1e-5));
    assert_error(MT_ERR_DEVICE, "mt_batch_norm: cuDNN error in "
                                "cudnnBatchNormalizationForwardInference: CUDNN_STATUS_BAD_PARAM");
    assert_non_null(mt_batch_norm_act(x, rm, rv, NULL, NULL, NULL, false, 0.1, 1e-5, MT_ACT_RELU));
    unsetenv("MTEMU_CUDNN_FAIL");
    mt_scope_end();
}

/* x [N, C, H, W] F16 channels-last (C a multiple of 4), the residual alike */
static mt_tensor *nhwc_f16(uint32_t seed) {
    mt_tensor *t = random_tensor(MT_F16, seed, MT_SHAPE(2, 8, 3, 3));
    mt_tensor *c = mt_to_channels_last(t);
    mt_release(t);
    return c;
}

/* One fused call with the fault named by `fail` injected into the fake cuDNN: NULL means
   it ran elsewhere than that entry point. */
static mt_tensor *bn_act_with(const char *fail, mt_tensor *x, mt_tensor *rm, mt_tensor *rv,
                              mt_tensor *res) {
    setenv("MTEMU_CUDNN_FAIL", fail, 1);
    mt_tensor *y = mt_batch_norm_act(x, rm, rv, NULL, NULL, res, true, 0.1, 1e-5, MT_ACT_RELU);
    unsetenv("MTEMU_CUDNN_FAIL");
    return y;
}

/* The fused batch norm + (add +) ReLU in training on NHWC F16 with C a multiple of 4 runs
   through cudnnBatchNormalizationForwardTrainingEx, forward, and BackwardEx, backward: a
   fault injected into either is the op's error naming that call, and the failed forward
   leaves the running statistics as they were. F32, NCHW, or C not a multiple of 4 run
   elsewhere (the same injection changes nothing there). */
static void test_batch_norm_cudnn_ex(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = nhwc_f16(51), *res = nhwc_f16(52);
    mt_tensor *rm = mt_zeros(MT_SHAPE(8), MT_F32, d), *rv = mt_ones(MT_SHAPE(8), MT_F32, d);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(res, true);
    const char *fwd = "cudnnBatchNormalizationForwardTrainingEx=3000";
    for (int with_res = 0; with_res < 2; with_res++) {
        assert_null(bn_act_with(fwd, x, rm, rv, with_res ? res : NULL));
        assert_error(MT_ERR_UNSUPPORTED, "mt_batch_norm_act: cuDNN error in "
                                         "cudnnBatchNormalizationForwardTrainingEx");
        assert_tensor_close(rm, ((const double[]){0, 0, 0, 0, 0, 0, 0, 0}), 8, 0, 0);
        assert_tensor_close(rv, ((const double[]){1, 1, 1, 1, 1, 1, 1, 1}), 8, 0, 0);
    }
    /* a configuration the size queries call NOT_SUPPORTED runs on the own kernels instead,
       forward and backward */
    mt_tensor *yo = bn_act_with("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize=3000", x,
                                NULL, NULL, res);
    assert_non_null(yo);
    setenv("MTEMU_CUDNN_FAIL", "cudnnBatchNormalizationBackwardEx=5000", 1);
    assert_int_equal(mt_backward(mt_sum_all(yo), NULL), 0);
    unsetenv("MTEMU_CUDNN_FAIL");
    mt_tensor *gx = mt_grad(x), *gres = mt_grad(res);
    assert_true(gx && gres);
    mt_release(gx);
    mt_release(gres);
    mt_zero_grad(x);
    mt_zero_grad(res);
    /* a size query failing otherwise is an error, before anything ran */
    assert_null(
        bn_act_with("cudnnGetBatchNormalizationTrainingExReserveSpaceSize=4000", x, rm, rv, res));
    assert_error(MT_ERR_DEVICE, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
    /* not the Ex path: F32, NCHW F16, C = 6 */
    mt_tensor *x32 = mt_to_channels_last(random_tensor(MT_F32, 53, MT_SHAPE(2, 8, 3, 3)));
    assert_non_null(bn_act_with(fwd, x32, NULL, NULL, NULL));
    assert_non_null(
        bn_act_with(fwd, random_tensor(MT_F16, 54, MT_SHAPE(2, 8, 3, 3)), NULL, NULL, NULL));
    assert_non_null(
        bn_act_with(fwd, mt_to_channels_last(random_tensor(MT_F16, 55, MT_SHAPE(2, 6, 3, 3))), NULL,
                    NULL, NULL));
    /* without autograd no node keeps the reserve space (a leak would show under ASan); the
       running statistics move */
    assert_non_null(bn_act_with("", nhwc_f16(56), rm, rv, NULL));
    double *m = mt_test_values(rm);
    double moved = 0;
    for (int c = 0; c < 8; c++) moved += fabs(m[c]);
    free(m);
    assert_true(moved > 0);
    /* the backward of an Ex forward is BackwardEx */
    mt_tensor *y = bn_act_with("", x, rm, rv, res);
    assert_non_null(y);
    assert_true(mt_is_channels_last(y) && !mt_is_contiguous(y));
    mt_tensor *loss = mt_sum_all(mt_mul(y, y));
    setenv("MTEMU_CUDNN_FAIL", "cudnnBatchNormalizationBackwardEx=5000", 1);
    assert_int_not_equal(mt_backward(loss, NULL), 0);
    assert_error(MT_ERR_DEVICE, "cuDNN error in cudnnBatchNormalizationBackwardEx: "
                                "CUDNN_STATUS_EXECUTION_FAILED");
    unsetenv("MTEMU_CUDNN_FAIL");
    assert_null(mt_grad(x));
    assert_null(mt_grad(res));
    mt_scope_end();
}

/* The plain batch norm (no activation, no residual) in training on NHWC F16 with C a multiple
   of 4 runs through the Ex entry points too (bnOps BN: cuDNN's NHWC kernels, where the legacy
   plain calls run its NCHW ones on the strided data), forward and backward, for mt_batch_norm
   and mt_batch_norm_act with MT_ACT_NONE: a fault injected into the Ex call is the op's error
   and leaves the running statistics as they were, one injected into the legacy call changes
   nothing. NCHW F16, C = 6, and a configuration the Ex size queries decline take the legacy
   calls. */
static void test_batch_norm_cudnn_ex_plain(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    const char *fwd_ex = "cudnnBatchNormalizationForwardTrainingEx=3000",
               *bwd_ex = "cudnnBatchNormalizationBackwardEx=5000",
               *fwd = "cudnnBatchNormalizationForwardTraining=2000",
               *bwd = "cudnnBatchNormalizationBackward=5000";
    mt_tensor *x = nhwc_f16(61);
    mt_tensor *rm = mt_zeros(MT_SHAPE(8), MT_F32, d), *rv = mt_ones(MT_SHAPE(8), MT_F32, d);
    mt_set_requires_grad(x, true);
    int rc;
    assert_null(bn_train_with(fwd_ex, "", x, rm, rv, &rc));
    assert_error(MT_ERR_UNSUPPORTED, "mt_batch_norm: cuDNN error in "
                                     "cudnnBatchNormalizationForwardTrainingEx");
    assert_tensor_close(rm, ((const double[]){0, 0, 0, 0, 0, 0, 0, 0}), 8, 0, 0);
    assert_tensor_close(rv, ((const double[]){1, 1, 1, 1, 1, 1, 1, 1}), 8, 0, 0);
    setenv("MTEMU_CUDNN_FAIL", fwd_ex, 1);
    assert_null(mt_batch_norm_act(x, rm, rv, NULL, NULL, NULL, true, 0.1, 1e-5, MT_ACT_NONE));
    unsetenv("MTEMU_CUDNN_FAIL");
    assert_error(MT_ERR_UNSUPPORTED, "cudnnBatchNormalizationForwardTrainingEx");
    /* the legacy entry points are not called, forward or backward */
    mt_tensor *y = bn_train_with(fwd, bwd, x, rm, rv, &rc);
    assert_non_null(y);
    assert_true(mt_is_channels_last(y) && !mt_is_contiguous(y));
    assert_int_equal(rc, 0);
    mt_tensor *gx = mt_grad(x);
    assert_non_null(gx);
    assert_true(mt_is_channels_last(gx) && !mt_is_contiguous(gx));
    mt_release(gx);
    mt_zero_grad(x);
    double *m = mt_test_values(rm);
    double moved = 0;
    for (int c = 0; c < 8; c++) moved += fabs(m[c]);
    free(m);
    assert_true(moved > 0);
    /* the backward of an Ex forward is BackwardEx */
    assert_non_null(bn_train_with("", bwd_ex, x, rm, rv, &rc));
    assert_int_not_equal(rc, 0);
    assert_error(MT_ERR_DEVICE, "mt_batch_norm: cuDNN error in cudnnBatchNormalizationBackwardEx: "
                                "CUDNN_STATUS_EXECUTION_FAILED");
    assert_null(mt_grad(x));
    /* with weight and bias, gradients for all three (values: test_batch_norm_nhwc) */
    mt_tensor *w = mt_ones(MT_SHAPE(8), MT_F32, d), *b = mt_zeros(MT_SHAPE(8), MT_F32, d);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    setenv("MTEMU_CUDNN_FAIL", bwd, 1);
    y = mt_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(y, y)), NULL), 0);
    unsetenv("MTEMU_CUDNN_FAIL");
    mt_tensor *gw = mt_grad(w), *gb = mt_grad(b);
    assert_true(gw && gb);
    mt_release(gw);
    mt_release(gb);
    mt_zero_grad(x);
    /* not the Ex path: NCHW F16, C = 6 */
    assert_null(
        bn_train_with(fwd, "", random_tensor(MT_F16, 62, MT_SHAPE(2, 8, 3, 3)), NULL, NULL, &rc));
    assert_error(MT_ERR_DEVICE, "cudnnBatchNormalizationForwardTraining: CUDNN_STATUS_BAD_PARAM");
    mt_tensor *x6 = mt_to_channels_last(random_tensor(MT_F16, 63, MT_SHAPE(2, 6, 3, 3)));
    mt_set_requires_grad(x6, true);
    assert_null(bn_train_with(fwd, "", x6, NULL, NULL, &rc));
    assert_error(MT_ERR_DEVICE, "cudnnBatchNormalizationForwardTraining: CUDNN_STATUS_BAD_PARAM");
    assert_non_null(bn_train_with(fwd_ex, bwd_ex, x6, NULL, NULL, &rc));
    assert_int_equal(rc, 0);
    /* a configuration the size queries call NOT_SUPPORTED takes the legacy calls, forward and
       backward */
    y = bn_train_with("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize=3000", bwd, x, NULL,
                      NULL, &rc);
    assert_non_null(y);
    assert_int_not_equal(rc, 0);
    assert_error(MT_ERR_DEVICE, "cuDNN error in cudnnBatchNormalizationBackward: "
                                "CUDNN_STATUS_EXECUTION_FAILED");
    mt_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_layer_norm_reference),
        MT_TEST(test_layer_norm_gradcheck),
        MT_TEST(test_layer_norm_strided),
        MT_TEST(test_layer_norm_empty),
        MT_TEST(test_batch_norm_reference),
        MT_TEST(test_batch_norm_offset),
        MT_TEST(test_batch_norm_splits),
        MT_TEST(test_batch_norm_large_batch),
        MT_TEST(test_batch_norm_gradcheck),
        MT_TEST(test_batch_norm_act_residual_grad),
        MT_TEST(test_batch_norm_torch_edges),
        MT_TEST(test_layer_norm_huge_row),
        MT_TEST(test_batch_norm_act_nan),
        MT_TEST(test_norm_inf_makes_nan),
        MT_TEST(test_norm_autocast),
        MT_TEST(test_batch_norm_running_buffers),
        MT_TEST(test_norm_errors),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_batch_norm_cudnn_routing)
            : MT_TEST_SKIPPED(test_batch_norm_cudnn_routing,
                              "fault injection needs the emulated CUDA device"),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_batch_norm_cudnn_eval)
            : MT_TEST_SKIPPED(test_batch_norm_cudnn_eval,
                              "fault injection needs the emulated CUDA device"),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_batch_norm_cudnn_ex)
            : MT_TEST_SKIPPED(test_batch_norm_cudnn_ex,
                              "fault injection needs the emulated CUDA device"),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_batch_norm_cudnn_ex_plain)
            : MT_TEST_SKIPPED(test_batch_norm_cudnn_ex_plain,
                              "fault injection needs the emulated CUDA device"),
    };
    return MT_RUN_TESTS(tests);
}

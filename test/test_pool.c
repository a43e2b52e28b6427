/* Pooling: max, average (count_include_pad, ceil_mode) and adaptive average against direct
   loops written here, forward and gradient (max: to the first maximum of each window), NCHW
   and NHWC, F32, BF16, F64; FP64 gradchecks; ties and NaN; errors; the CUDA answer. */
#include "test_util.h"

typedef struct {
    int kind; /* 0 max, 1 avg, 2 adaptive */
    int64_t n, c, h, w;
    mt_pool2d_opts o;
    int64_t oh, ow; /* adaptive: the output size */
} pool_case;

static const pool_case cases[] = {
    {0, 2, 3, 7, 8, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 0, 0},
    {0,
     2,
     3,
     7,
     8,
     {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true},
     0,
     0},
    {0, 1, 2, 6, 6, {.kernel = {2, 2}}, 0, 0},
    {0,
     1,
     2,
     5,
     9,
     {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}, .ceil_mode = true},
     0,
     0},
    {1, 2, 3, 7, 8, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 0, 0},
    {1,
     2,
     3,
     7,
     8,
     {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .exclude_pad = true},
     0,
     0},
    {1,
     2,
     3,
     6,
     7,
     {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true},
     0,
     0},
    {1,
     2,
     3,
     6,
     7,
     {.kernel = {3, 3},
      .stride = {2, 2},
      .padding = {1, 1},
      .ceil_mode = true,
      .exclude_pad = true},
     0,
     0},
    {1, 1, 2, 5, 5, {.kernel = {2, 3}, .stride = {2, 1}}, 0, 0},
    {2, 2, 3, 7, 9, {.kernel = {0, 0}}, 3, 4},
    {2, 2, 3, 7, 9, {.kernel = {0, 0}}, 7, 9},
    {2, 1, 4, 5, 6, {.kernel = {0, 0}}, 1, 1},
    {2, 1, 2, 5, 6, {.kernel = {0, 0}}, 4, 5},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int64_t stride_of(const pool_case *k, int i) {
    return k->o.stride[i] ? k->o.stride[i] : k->o.kernel[i];
}

/* torch's output size, written out independently of the library */
static int64_t out_size(const pool_case *k, int i) {
    if (k->kind == 2) return i ? k->ow : k->oh;
    int64_t in = i ? k->w : k->h, kk = k->o.kernel[i], p = k->o.padding[i], s = stride_of(k, i);
    int64_t num = in + 2 * p - kk + (k->o.ceil_mode ? s - 1 : 0);
    int64_t out = num / s + 1;
    if (k->o.ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

static void fill(double *v, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (double)(s >> 8) / (double)(1u << 23) - 1.0;
    }
}

/* Direct pooling of contiguous NCHW doubles, and the input gradient from gy. */
static void reference(const pool_case *k, const double *x, double *y, const double *gy,
                      double *gx) {
    int64_t OH = out_size(k, 0), OW = out_size(k, 1);
    memset(gx, 0, sizeof(double) * (size_t)(k->n * k->c * k->h * k->w));
    for (int64_t p = 0; p < k->n * k->c; p++) {
        const double *xp = x + p * k->h * k->w;
        double *gp = gx + p * k->h * k->w;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0, h1, w0, w1;
                double div;
                if (k->kind == 2) {
                    h0 = oh * k->h / OH, h1 = ((oh + 1) * k->h + OH - 1) / OH;
                    w0 = ow * k->w / OW, w1 = ((ow + 1) * k->w + OW - 1) / OW;
                    div = (double)((h1 - h0) * (w1 - w0));
                } else {
                    h0 = oh * stride_of(k, 0) - k->o.padding[0];
                    w0 = ow * stride_of(k, 1) - k->o.padding[1];
                    h1 = h0 + k->o.kernel[0], w1 = w0 + k->o.kernel[1];
                    int64_t ph = h1 < k->h + k->o.padding[0] ? h1 : k->h + k->o.padding[0];
                    int64_t pw = w1 < k->w + k->o.padding[1] ? w1 : k->w + k->o.padding[1];
                    div = (double)((ph - h0) * (pw - w0));
                    h0 = h0 < 0 ? 0 : h0, w0 = w0 < 0 ? 0 : w0;
                    h1 = h1 > k->h ? k->h : h1, w1 = w1 > k->w ? k->w : w1;
                    if (k->o.exclude_pad) div = (double)((h1 - h0) * (w1 - w0));
                }
                int64_t yi = (p * OH + oh) * OW + ow, best = h0 * k->w + w0;
                double s = 0.0, m = -INFINITY;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t v = w0; v < w1; v++) {
                        double e = xp[h * k->w + v];
                        s += e;
                        if (e > m || isnan(e)) m = e, best = h * k->w + v;
                    }
                y[yi] = k->kind == 0 ? m : s / div;
                if (k->kind == 0)
                    gp[best] += gy[yi];
                else
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t v = w0; v < w1; v++) gp[h * k->w + v] += gy[yi] / div;
            }
    }
}

static mt_tensor *run(const pool_case *k, mt_tensor *x) {
    return k->kind == 0   ? mt_max_pool2d(x, &k->o)
           : k->kind == 1 ? mt_avg_pool2d(x, &k->o)
                          : mt_adaptive_avg_pool2d(x, k->oh, k->ow);
}

static void check_case(const pool_case *k, mt_dtype dt, bool cl, double tol) {
    int64_t nx = k->n * k->c * k->h * k->w, ny = k->n * k->c * out_size(k, 0) * out_size(k, 1);
    double *v = malloc(sizeof(double) * (size_t)nx), *g = malloc(sizeof(double) * (size_t)ny);
    fill(v, nx, (uint32_t)(k - cases) + 1);
    fill(g, ny, 77);
    mt_scope_begin();
    mt_tensor *leaf = mt_test_tensor(v, dt, MT_SHAPE(k->n, k->c, k->h, k->w));
    mt_set_requires_grad(leaf, true);
    mt_tensor *x = cl ? mt_to_channels_last(leaf) : leaf;
    mt_tensor *cot = mt_test_tensor(g, dt, MT_SHAPE(k->n, k->c, out_size(k, 0), out_size(k, 1)));
    if (cl) cot = mt_to_channels_last(cot); /* the NHWC backward paths (the scope owns both) */
    double *xv = mt_test_values(leaf), *gv = mt_test_values(cot);
    double *y = malloc(sizeof(double) * (size_t)ny), *gx = malloc(sizeof(double) * (size_t)nx);
    reference(k, xv, y, gv, gx);
    mt_tensor *out = run(k, x);
    assert_no_error();
    assert_int_equal(mt_dtype_of(out), dt);
    assert_shape(out, k->n, k->c, out_size(k, 0), out_size(k, 1));
    assert_true(cl ? mt_is_channels_last(out) : mt_is_contiguous(out));
    assert_tensor_close(out, y, ny, tol, tol);
    assert_int_equal(mt_backward(out, cot), 0);
    assert_tensor_close(mt_grad(leaf), gx, nx, tol, tol);
    mt_scope_end();
    free(v), free(g), free(xv), free(gv), free(y), free(gx);
}

static void test_pool_reference(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++)
        for (int cl = 0; cl < 2; cl++) {
            check_case(&cases[i], MT_F32, cl, 1e-6);
            check_case(&cases[i], MT_F64, cl, 1e-12);
            check_case(&cases[i], MT_BF16, cl, 1e-2); /* one rounding of each result */
            check_case(&cases[i], MT_F16, cl, 2e-3);
        }
}

/* The gradient of sum(pool(x)) arrives broadcast (no channels-last strides): the NHWC input
   gets the NCHW one's gradient, in every floating dtype (within one rounding of the low
   dtypes: the NHWC loops sum in F32, the plane loops in F64). */
static void test_pool_broadcast_grad(void **state) {
    (void)state;
    mt_dtype dts[] = {MT_F32, MT_BF16, MT_F16, MT_F64};
    double tols[] = {1e-6, 8e-3, 1e-3, 0};
    for (int i = 0; i < NCASES; i++)
        for (int d = 0; d < 4; d++) {
            const pool_case *k = &cases[i];
            int64_t nx = k->n * k->c * k->h * k->w;
            double *v = malloc(sizeof(double) * (size_t)nx);
            fill(v, nx, 5u + (uint32_t)i);
            mt_scope_begin();
            mt_tensor *g[2];
            for (int cl = 0; cl < 2; cl++) {
                mt_tensor *leaf = mt_test_tensor(v, dts[d], MT_SHAPE(k->n, k->c, k->h, k->w));
                mt_set_requires_grad(leaf, true);
                mt_tensor *x = cl ? mt_to_channels_last(leaf) : leaf;
                assert_int_equal(mt_backward(mt_sum_all(run(k, x)), NULL), 0);
                g[cl] = mt_grad(leaf);
            }
            double *want = mt_test_values(g[0]);
            assert_tensor_close(g[1], want, nx, tols[d], tols[d]);
            free(want);
            mt_scope_end();
            free(v);
        }
}

static mt_tensor *fn_pool(mt_tensor *const *in, void *ctx) {
    return run(ctx, in[0]);
}

static void test_pool_gradcheck(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) {
        const pool_case *k = &cases[i];
        double v[512];
        int64_t nx = k->n * k->c * k->h * k->w;
        assert_true(nx <= 512);
        fill(v, nx, 31u + (uint32_t)i);
        mt_tensor *x = mt_test_tensor(v, MT_F64, MT_SHAPE(k->n, k->c, k->h, k->w));
        mt_set_requires_grad(x, true);
        int rc = mt_gradcheck(fn_pool, &x, 1, (void *)k, NULL);
        if (rc) fail_msg("case %d: %s", i, mt_last_error());
        mt_release(x);
    }
}

/* Ties go to the first element of the window (torch's CPU rule); a NaN wins and propagates. */
static void test_max_pool_ties_and_nan(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1, 1, 4, 4), MT_F32, mt_test_device());
    mt_set_requires_grad(x, true);
    mt_tensor *y = mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}});
    assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    const double g[16] = {1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0};
    assert_tensor_close(mt_grad(x), g, 16, 0, 0);
    double v[16] = {0};
    v[5] = NAN;
    v[4] = 3;
    mt_tensor *xn = mt_test_tensor(v, MT_F32, MT_SHAPE(1, 1, 4, 4));
    mt_tensor *yn = mt_max_pool2d(xn, &(mt_pool2d_opts){.kernel = {2, 2}});
    assert_tensor_close(yn, ((const double[]){NAN, 0, 0, 0}), 4, 0, 0);
    mt_scope_end();
    assert_no_error();
}

/* Windows that overlap (stride < kernel), pad, overhang (ceil_mode) and a stride of 3, with
   C = 1 and odd sizes. */
static const pool_case tie_cases[] = {
    {0, 2, 3, 7, 9, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}}, 0, 0},
    {0,
     2,
     5,
     9,
     7,
     {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true},
     0,
     0},
    {0,
     1,
     1,
     6,
     5,
     {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}, .ceil_mode = true},
     0,
     0},
    {0, 3, 4, 5, 5, {.kernel = {3, 1}, .stride = {2, 1}}, 0, 0},
    {0,
     1,
     3,
     8,
     8,
     {.kernel = {4, 4}, .stride = {3, 3}, .padding = {2, 2}, .ceil_mode = true},
     0,
     0},
    /* one sample of 40 channels: the channels-last backward splits it into channel blocks */
    {0, 1, 40, 6, 5, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 0, 0},
};

/* Inputs full of ties (values in {-2, .., 2}), NaNs and -inf, in NCHW, NHWC and a transposed
   view (strides of neither format), every floating dtype: the gradient must land on the
   element torch picks (reference(): the first maximum in row-major window order, the last
   NaN; a window of -inf only: its first element), so a wrong argmax or index scheme (kept
   indices decoded in the wrong plane, layout or window) fails here. */
static void test_max_pool_indices(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F32, MT_BF16, MT_F16, MT_F64};
    int threads = mt_get_num_threads();
    mt_set_num_threads(4); /* more threads than samples: channel blocks on the CPU */
    for (int i = 0; i < (int)(sizeof tie_cases / sizeof tie_cases[0]); i++)
        for (int d = 0; d < 4; d++)
            for (int layout = 0; layout < 3; layout++) {
                const pool_case *k = &tie_cases[i];
                int64_t nx = k->n * k->c * k->h * k->w;
                int64_t ny = k->n * k->c * out_size(k, 0) * out_size(k, 1);
                double *v = malloc(sizeof(double) * (size_t)nx);
                double *g = malloc(sizeof(double) * (size_t)ny);
                double *y = malloc(sizeof(double) * (size_t)ny);
                double *gx = malloc(sizeof(double) * (size_t)nx);
                fill(v, nx, 101u + (uint32_t)i);
                for (int64_t j = 0; j < nx; j++)
                    v[j] = j % 17 == 3 ? NAN : j % 11 == 5 ? -INFINITY : round(2 * v[j]);
                for (int64_t j = 0; j < ny; j++) g[j] = (double)(j % 7 + 1); /* exact sums */
                reference(k, v, y, g, gx);
                mt_scope_begin();
                mt_tensor *leaf, *x;
                if (layout == 2) { /* stored [n, c, w, h], pooled through a transposed view */
                    double *t = malloc(sizeof(double) * (size_t)nx);
                    for (int64_t p = 0; p < k->n * k->c; p++)
                        for (int64_t h = 0; h < k->h; h++)
                            for (int64_t w = 0; w < k->w; w++)
                                t[(p * k->w + w) * k->h + h] = v[(p * k->h + h) * k->w + w];
                    leaf = mt_test_tensor(t, dts[d], MT_SHAPE(k->n, k->c, k->w, k->h));
                    free(t);
                    mt_set_requires_grad(leaf, true);
                    x = mt_transpose(leaf, 2, 3);
                } else {
                    leaf = mt_test_tensor(v, dts[d], MT_SHAPE(k->n, k->c, k->h, k->w));
                    mt_set_requires_grad(leaf, true);
                    x = layout == 1 ? mt_to_channels_last(leaf) : leaf;
                }
                mt_tensor *cot =
                    mt_test_tensor(g, dts[d], MT_SHAPE(k->n, k->c, out_size(k, 0), out_size(k, 1)));
                if (layout == 1) cot = mt_to_channels_last(cot);
                mt_tensor *out = mt_max_pool2d(x, &k->o);
                assert_no_error();
                assert_tensor_close(out, y, ny, 0, 0);
                assert_int_equal(mt_backward(out, cot), 0);
                mt_tensor *gl = mt_grad(leaf);
                if (layout == 2) gl = mt_transpose(gl, 2, 3);
                assert_tensor_close(gl, gx, nx, 0, 0);
                mt_scope_end();
                free(v), free(g), free(y), free(gx);
            }
    mt_set_num_threads(threads);
}

/* Bytes a max pooling keeps alive: the output, and (on a backend that keeps argmax indices)
   4 bytes per output element while a node is recorded; under no-grad, or for an input that
   needs no gradient, nothing but the output. */
static int64_t kept_bytes(bool grad_mode, bool requires_grad) {
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(2, 3, 8, 8), MT_F32, mt_test_device());
    mt_set_requires_grad(x, requires_grad);
    bool was = mt_set_grad_enabled(grad_mode);
    int64_t b0 = mt_live_bytes();
    mt_tensor *y = mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}});
    int64_t kept = mt_live_bytes() - b0;
    mt_set_grad_enabled(was);
    assert_non_null(y);
    if (grad_mode && requires_grad) assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
    mt_scope_end();
    return kept;
}

static void test_max_pool_no_grad_keeps_no_indices(void **state) {
    (void)state;
    int64_t before = mt_live_bytes();
    int64_t out = 2 * 3 * 4 * 4 * (int64_t)sizeof(float);
    int64_t nograd = kept_bytes(false, true), frozen = kept_bytes(true, false);
    int64_t training = kept_bytes(true, true);
    assert_int_equal(frozen, nograd);
    if (mt_test_device_is_cpu()) { /* the CPU backend keeps I32 indices (max_pool_indices) */
        assert_int_equal(nograd, out);
        assert_int_equal(training, out + 2 * 3 * 4 * 4 * (int64_t)sizeof(int32_t));
    } else { /* CUDA saves the input (an alias: no new bytes) and searches again */
        assert_int_equal(training, nograd);
    }
    assert_int_equal(mt_live_bytes(), before); /* the indices die with the node */
    assert_no_error();
}

static void test_pool_errors(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_zeros(MT_SHAPE(1, 2, 5, 5), MT_F32, d);
    assert_null(mt_max_pool2d(x, NULL));
    assert_error(MT_ERR_NULL, "mt_max_pool2d: arg 2: options are NULL");
    assert_null(mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {0, 2}}));
    assert_error(MT_ERR_INVALID, "mt_avg_pool2d: arg 2: kernel must be positive");
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}, .padding = {2, 0}}));
    assert_error(MT_ERR_INVALID, "padding [2, 0] must be at most half the kernel [2, 2]");
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {6, 2}}));
    assert_error(MT_ERR_SHAPE, "the output would be empty");
    /* kernels and strides at the edge of int64 (no overflow in the output's size) */
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {INT64_MAX, 2}}));
    assert_error(MT_ERR_SHAPE, "the output would be empty");
    assert_null(mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {2, INT64_MAX}, .stride = {1, 1}}));
    assert_error(MT_ERR_SHAPE, "the output would be empty");
    /* an empty batch seen through stride 0 (oneDNN divided by zero reordering it) */
    mt_tensor *none = mt_expand(mt_zeros(MT_SHAPE(1, 2, 4, 4), MT_F32, d), MT_SHAPE(0, 2, 4, 4));
    assert_shape(mt_avg_pool2d(none, &(mt_pool2d_opts){.kernel = {2, 2}}), 0, 2, 2, 2);
    assert_shape(mt_adaptive_avg_pool2d(none, 2, 2), 0, 2, 2, 2);
    assert_shape(mt_max_pool2d(none, &(mt_pool2d_opts){.kernel = {2, 2}}), 0, 2, 2, 2);
    /* a window whose area (the average's divisor with the padding) passes int64: a kernel
       near 2^63 by 2, over 5 rows and 2 columns of ones */
    mt_tensor *huge =
        mt_avg_pool2d(mt_ones(MT_SHAPE(1, 1, 5, 5), MT_F32, d),
                      &(mt_pool2d_opts){.kernel = {INT64_MAX, 2}, .padding = {INT64_MAX / 2, 0}});
    assert_shape(huge, 1, 1, 1, 2);
    const double tenth = 10.0 / (2.0 * (double)INT64_MAX);
    assert_tensor_close(huge, ((const double[]){tenth, tenth}), 2, 0, 1e-6);
    mt_tensor *y = mt_max_pool2d(
        x, &(mt_pool2d_opts){.kernel = {2, 2}, .stride = {INT64_MAX, 1}, .ceil_mode = true});
    assert_no_error();
    assert_shape(y, 1, 2, 1, 4); /* torch: ceil((5 - 2) / stride) + 1 = 2, the last starts past */
    y = mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {3, 3},
                                           .stride = {INT64_MAX, INT64_MAX},
                                           .padding = {1, 1},
                                           .ceil_mode = true});
    assert_no_error();
    assert_shape(y, 1, 2, 1, 1); /* ceil(4 / stride) + 1 = 2 windows, the second past */
    /* a kernel near 2^63 with padding half of it: 5 windows, each over all 5 rows of ones,
       divided by the whole kernel (the oneDNN path's padding arithmetic must not overflow) */
    y = mt_avg_pool2d(mt_ones(MT_SHAPE(1, 1, 5, 1), MT_F32, d),
                      &(mt_pool2d_opts){.kernel = {INT64_MAX, 1},
                                        .stride = {1, 1},
                                        .padding = {INT64_MAX / 2, 0}});
    assert_no_error();
    assert_shape(y, 1, 1, 5, 1);
    const double fifth = 5.0 / (double)INT64_MAX;
    assert_tensor_close(y, ((const double[]){fifth, fifth, fifth, fifth, fifth}), 5, 0, 1e-6);
    /* ceil_mode keeps a window that overhangs the input by less than a stride (torch: a 2x2
       input, kernel 3, stride 2 gives 1x1); without ceil_mode the output is empty */
    mt_tensor *x2 = mt_test_tensor((const double[]){1, 5, -2, 3}, MT_F32, MT_SHAPE(1, 1, 2, 2));
    const mt_pool2d_opts over = {.kernel = {3, 3}, .stride = {2, 2}, .ceil_mode = true};
    y = mt_max_pool2d(x2, &over);
    assert_shape(y, 1, 1, 1, 1);
    assert_tensor_close(y, (const double[]){5}, 1, 0, 0);
    y = mt_avg_pool2d(x2, &(mt_pool2d_opts){.kernel = {3, 3}, .stride = {2, 2}, .ceil_mode = true});
    assert_tensor_close(y, (const double[]){7.0 / 4}, 1, 1e-6, 0); /* over the window's overlap */
    assert_null(mt_max_pool2d(x2, &(mt_pool2d_opts){.kernel = {3, 3}, .stride = {2, 2}}));
    assert_error(MT_ERR_SHAPE, "the output would be empty");
    assert_null(mt_max_pool2d(
        x2, &(mt_pool2d_opts){.kernel = {4, 4}, .stride = {2, 2}, .ceil_mode = true}));
    assert_error(MT_ERR_SHAPE, "the output would be empty");
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}, .exclude_pad = true}));
    assert_error(MT_ERR_INVALID, "exclude_pad is for average pooling");
    assert_null(
        mt_avg_pool2d(mt_zeros(MT_SHAPE(2, 5, 5), MT_F32, d), &(mt_pool2d_opts){.kernel = {2, 2}}));
    assert_error(MT_ERR_SHAPE, "mt_avg_pool2d: arg 1: input must be 4-d [N, C, H, W]");
    assert_null(mt_adaptive_avg_pool2d(x, 0, 3));
    assert_error(MT_ERR_INVALID, "mt_adaptive_avg_pool2d: output size [0, 3] must be positive");
    assert_null(mt_adaptive_avg_pool2d(mt_zeros(MT_SHAPE(1, 2, 5, 5), MT_I32, d), 2, 2));
    assert_error(MT_ERR_DTYPE, "mt_adaptive_avg_pool2d: arg 1");
    assert_null(mt_max_pool2d(NULL, &(mt_pool2d_opts){.kernel = {2, 2}}));
    assert_null(mt_adaptive_avg_pool2d(NULL, 1, 1));
    assert_no_error();
    mt_scope_end();
}

/* The three poolings on the device under test, checked element by element. */
static void test_pool_device(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1, 2, 4, 4), MT_F32, mt_test_device());
    mt_tensor *y[3] = {mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}}), NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (i == 1) y[1] = mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}});
        if (i == 2) y[2] = mt_adaptive_avg_pool2d(x, 2, 2);
        assert_no_error();
        assert_on_test_device(y[i]);
        assert_tensor_close(y[i], ((const double[]){1, 1, 1, 1, 1, 1, 1, 1}), 8, 0, 0);
    }
    mt_scope_end();
}

/* On CUDA the forward goes through cuDNN where cuDNN's definition is torch's, else through the
   backend's own kernel: a fault injected into the fake cuDNN's cudnnPoolingForward shows which
   (a clear error naming the op and the call), and the own-kernel cases do not see it. */
static void test_pool_cudnn_routing(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1, 2, 7, 6), MT_F32, d);
    setenv("MTEMU_CUDNN_FAIL", "cudnnPoolingForward=3000", 1);
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {3, 3}, .stride = {2, 2}}));
    assert_error(MT_ERR_UNSUPPORTED,
                 "mt_max_pool2d: cuDNN error in cudnnPoolingForward: CUDNN_STATUS_NOT_SUPPORTED");
    assert_null(mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {3, 2}, .padding = {1, 1}}));
    assert_error(MT_ERR_UNSUPPORTED, "mt_avg_pool2d: cuDNN error in cudnnPoolingForward");
    assert_null(mt_adaptive_avg_pool2d(x, 7, 3)); /* even windows: an average pooling */
    assert_error(MT_ERR_UNSUPPORTED, "mt_adaptive_avg_pool2d: cuDNN error in cudnnPoolingForward");
    /* ceil_mode with a window past the padded input, uneven adaptive windows: own kernels */
    mt_tensor *y1 =
        mt_avg_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true});
    mt_tensor *y2 = mt_adaptive_avg_pool2d(x, 3, 4);
    unsetenv("MTEMU_CUDNN_FAIL");
    assert_non_null(y1);
    assert_non_null(y2);
    assert_shape(y1, 1, 2, 4, 3);
    double e[24];
    for (int i = 0; i < 24; i++) e[i] = 1.0;
    assert_tensor_close(y1, e, 24, 0, 0);
    assert_tensor_close(y2, e, 24, 0, 0);
    mt_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_pool_reference),
        MT_TEST(test_pool_broadcast_grad),
        MT_TEST(test_pool_gradcheck),
        MT_TEST(test_max_pool_ties_and_nan),
        MT_TEST(test_max_pool_indices),
        MT_TEST(test_max_pool_no_grad_keeps_no_indices),
        MT_TEST(test_pool_errors),
        MT_TEST(test_pool_device),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_pool_cudnn_routing)
            : MT_TEST_SKIPPED(test_pool_cudnn_routing,
                              "fault injection needs the emulated CUDA device"),
    };
    return MT_RUN_TESTS(tests);
}

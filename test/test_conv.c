/* mt_conv2d: forward and gradients against a direct convolution written here (NCHW and NHWC,
   F32, BF16, F16, F64, stride, padding, dilation, groups, depthwise), FP64 gradchecks, the
   output's memory format, autocast, error paths, and the CUDA answer until cuDNN lands. */
#include "test_util.h"

typedef struct {
    int64_t n, c, h, w, oc, kh, kw;
    mt_conv2d_opts o;
    bool bias;
} conv_case;

static const conv_case cases[] = {
    {2, 3, 7, 6, 4, 3, 3, {.padding = {1, 1}}, true},
    {1,
     4,
     9,
     8,
     6,
     3,
     2,
     {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2},
     true},
    {2, 6, 8, 8, 6, 3, 3, {.stride = {2, 2}, .padding = {1, 1}, .groups = 6}, false}, /* depthwise
                                                                                       */
    {2, 8, 5, 5, 16, 1, 1, {.groups = 0}, true},                                      /* 1x1 */
    {1, 2, 5, 7, 3, 5, 2, {.stride = {3, 2}, .padding = {2, 1}, .dilation = {1, 3}}, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int64_t one(int64_t v) {
    return v ? v : 1;
}
static int64_t out_size(const conv_case *k, int i) {
    int64_t in = i ? k->w : k->h, ker = i ? k->kw : k->kh;
    return (in + 2 * k->o.padding[i] - one(k->o.dilation[i]) * (ker - 1) - 1) /
               one(k->o.stride[i]) +
           1;
}

/* Deterministic values in [-1, 1). */
static void fill(double *v, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (double)(s >> 8) / (double)(1u << 23) - 1.0;
    }
}

/* The direct convolution on contiguous NCHW doubles: y = conv(x, w) + b, and with a
   cotangent gy the three gradients (any output pointer may be NULL). */
static void reference(const conv_case *k, const double *x, const double *w, const double *b,
                      double *y, const double *gy, double *gx, double *gw, double *gb) {
    int64_t OH = out_size(k, 0), OW = out_size(k, 1), g = one(k->o.groups);
    int64_t icg = k->c / g, ocg = k->oc / g;
    int64_t sh = one(k->o.stride[0]), sw = one(k->o.stride[1]);
    int64_t dh = one(k->o.dilation[0]), dw = one(k->o.dilation[1]);
    if (gx) memset(gx, 0, sizeof(double) * (size_t)(k->n * k->c * k->h * k->w));
    if (gw) memset(gw, 0, sizeof(double) * (size_t)(k->oc * icg * k->kh * k->kw));
    if (gb) memset(gb, 0, sizeof(double) * (size_t)k->oc);
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t oc = 0; oc < k->oc; oc++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * k->oc + oc) * OH + oh) * OW + ow;
                    double s = b ? b[oc] : 0.0, gv = gy ? gy[yi] : 0.0;
                    if (gb) gb[oc] += gv;
                    for (int64_t ic = 0; ic < icg; ic++)
                        for (int64_t a = 0; a < k->kh; a++)
                            for (int64_t c = 0; c < k->kw; c++) {
                                int64_t ih = oh * sh - k->o.padding[0] + a * dh;
                                int64_t iw = ow * sw - k->o.padding[1] + c * dw;
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                                int64_t ch = oc / ocg * icg + ic;
                                int64_t xi = ((n * k->c + ch) * k->h + ih) * k->w + iw;
                                int64_t wi = ((oc * icg + ic) * k->kh + a) * k->kw + c;
                                s += x[xi] * w[wi];
                                if (gx) gx[xi] += gv * w[wi];
                                if (gw) gw[wi] += gv * x[xi];
                            }
                    if (y) y[yi] = s;
                }
}

typedef struct {
    mt_tensor *x, *w, *b;
    int64_t nx, nw, ny;
} conv_inputs;

/* Inputs of case k in dtype dt (x channels-last when cl), leaves that require grad. */
static conv_inputs make_inputs(const conv_case *k, mt_dtype dt, bool cl, uint32_t seed) {
    conv_inputs in = {0};
    in.nx = k->n * k->c * k->h * k->w;
    in.nw = k->oc * (k->c / one(k->o.groups)) * k->kh * k->kw;
    in.ny = k->n * k->oc * out_size(k, 0) * out_size(k, 1);
    double *v = malloc(sizeof(double) * (size_t)(in.nx + in.nw + k->oc));
    fill(v, in.nx + in.nw + k->oc, seed);
    mt_tensor *x = mt_test_tensor(v, dt, MT_SHAPE(k->n, k->c, k->h, k->w));
    in.x = cl ? mt_to_channels_last(x) : mt_retain(x);
    mt_release(x);
    in.w = mt_test_tensor(v + in.nx, dt, MT_SHAPE(k->oc, k->c / one(k->o.groups), k->kh, k->kw));
    in.b = k->bias ? mt_test_tensor(v + in.nx + in.nw, dt, MT_SHAPE(k->oc)) : NULL;
    free(v);
    mt_set_requires_grad(in.x, true);
    mt_set_requires_grad(in.w, true);
    if (in.b) mt_set_requires_grad(in.b, true);
    return in;
}

static void release_inputs(conv_inputs *in) {
    mt_release(in->x);
    mt_release(in->w);
    mt_release(in->b);
}

/* Forward and the three gradients of case k against the reference computed from the values
   the tensors hold (low-precision inputs are exact there). */
static void check_case_seed(const conv_case *k, mt_dtype dt, bool cl, double tol, uint32_t seed) {
    conv_inputs in = make_inputs(k, dt, cl, seed);
    mt_scope_begin();
    double *x = mt_test_values(in.x), *w = mt_test_values(in.w);
    double *b = in.b ? mt_test_values(in.b) : NULL;
    double *y = malloc(sizeof(double) * (size_t)in.ny),
           *gy = malloc(sizeof(double) * (size_t)in.ny);
    double *gx = malloc(sizeof(double) * (size_t)in.nx),
           *gw = malloc(sizeof(double) * (size_t)in.nw);
    double gb[64];
    fill(gy, in.ny, 99);
    mt_tensor *cot = mt_test_tensor(gy, dt, MT_SHAPE(k->n, k->oc, out_size(k, 0), out_size(k, 1)));
    /* the cotangent as the op will see it (rounded to dt) */
    double *gyr = mt_test_values(cot);
    if (cl) cot = mt_to_channels_last(cot); /* the NHWC backward paths (the scope owns both) */
    reference(k, x, w, b, y, gyr, gx, gw, in.b ? gb : NULL);
    mt_tensor *out = mt_conv2d(in.x, in.w, in.b, &k->o);
    assert_no_error();
    assert_int_equal(mt_dtype_of(out), dt);
    assert_shape(out, k->n, k->oc, out_size(k, 0), out_size(k, 1));
    assert_true(cl ? mt_is_channels_last(out) : mt_is_contiguous(out));
    assert_tensor_close(out, y, in.ny, tol, tol);
    assert_int_equal(mt_backward(out, cot), 0);
    assert_tensor_close(mt_grad(in.x), gx, in.nx, tol, tol);
    assert_tensor_close(mt_grad(in.w), gw, in.nw, tol * 4, tol);
    if (in.b) assert_tensor_close(mt_grad(in.b), gb, k->oc, tol * 4, tol);
    mt_scope_end();
    free(x), free(w), free(b), free(y), free(gy), free(gx), free(gw), free(gyr);
    release_inputs(&in);
}

static void check_case(const conv_case *k, mt_dtype dt, bool cl, double tol) {
    check_case_seed(k, dt, cl, tol, (uint32_t)(k - cases) + 7u);
}

static void test_conv2d_reference_f32(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) {
        check_case(&cases[i], MT_F32, false, 1e-5);
        check_case(&cases[i], MT_F32, true, 1e-5);
    }
}

static void test_conv2d_reference_f64(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) {
        check_case(&cases[i], MT_F64, false, 1e-12);
        check_case(&cases[i], MT_F64, true, 1e-12);
    }
}

/* BF16/F16 operands are exact; FP32 accumulation leaves one rounding of the output (2^-8
   relative for BF16) plus the sums' cancellation, hence the absolute part. */
static void test_conv2d_reference_low(void **state) {
    (void)state;
    for (int i = 0; i < NCASES; i++) {
        check_case(&cases[i], MT_BF16, false, 2e-2);
        check_case(&cases[i], MT_BF16, true, 2e-2);
        check_case(&cases[i], MT_F16, false, 3e-3);
        check_case(&cases[i], MT_F16, true, 3e-3);
    }
}

typedef struct {
    const conv_case *k;
    bool cl;
} gc_ctx;

static mt_tensor *fn_conv(mt_tensor *const *in, void *vctx) {
    gc_ctx *c = vctx;
    mt_tensor *x = c->cl ? mt_to_channels_last(in[0]) : in[0];
    return mt_conv2d(x, in[1], c->k->bias ? in[2] : NULL, &c->k->o);
}

static void test_conv2d_gradcheck(void **state) {
    (void)state;
    /* every case once, NHWC for odd ones (each gradcheck runs the op twice per input element) */
    for (int i = 0; i < NCASES; i++) {
        bool cl = i % 2;
        conv_inputs in = make_inputs(&cases[i], MT_F64, false, 11u + (uint32_t)i);
        gc_ctx c = {&cases[i], cl};
        mt_tensor *args[3] = {in.x, in.w, in.b};
        int rc = mt_gradcheck(fn_conv, args, in.b ? 3 : 2, &c, NULL);
        if (rc) fail_msg("case %d%s: %s", i, cl ? " (NHWC)" : "", mt_last_error());
        release_inputs(&in);
    }
}

/* Strided inputs that are neither NCHW nor NHWC (a slice, a transposed weight) are copied
   once and give the same values; the stride-0 gradient of a sum reaches the kernels too. */
static void test_conv2d_strided_inputs(void **state) {
    (void)state;
    const conv_case *k = &cases[0];
    conv_inputs in = make_inputs(k, MT_F32, false, 3);
    mt_scope_begin();
    mt_tensor *wide = mt_cat((mt_tensor *[]){in.x, in.x}, 2, 3); /* [2, 3, 7, 12] */
    mt_tensor *xs = mt_slice(wide, 3, 0, 12, 2);                 /* every other column */
    mt_tensor *wt = mt_transpose(mt_contiguous(mt_transpose(in.w, 2, 3)), 2, 3);
    assert_false(mt_is_contiguous(xs) || mt_is_channels_last(xs));
    mt_tensor *ys = mt_conv2d(xs, wt, in.b, &k->o);
    mt_tensor *y = mt_conv2d(mt_contiguous(xs), in.w, in.b, &k->o);
    double *v = mt_test_values(y);
    assert_tensor_close(ys, v, mt_numel(y), 1e-6, 1e-6);
    free(v);
    assert_int_equal(mt_backward(mt_sum_all(ys), NULL), 0);
    double *gb = mt_test_values(mt_grad(in.b));
    double count = (double)(mt_numel(y) / k->oc);
    for (int i = 0; i < k->oc; i++) assert_true(fabs(gb[i] - count) < 1e-4);
    free(gb);
    mt_scope_end();
    assert_no_error();
    release_inputs(&in);
}

/* O1 BF16: conv2d runs in BF16 (rule LOWER); the FP32 parameters get FP32 gradients. */
static void test_conv2d_autocast(void **state) {
    (void)state;
    const conv_case *k = &cases[1];
    conv_inputs in = make_inputs(k, MT_F32, true, 5);
    mt_scope_begin();
    mt_autocast_begin(MT_BF16, MT_AMP_O1);
    mt_tensor *y = mt_conv2d(in.x, in.w, in.b, &k->o);
    mt_autocast_end();
    assert_no_error();
    assert_int_equal(mt_dtype_of(y), MT_BF16);
    assert_true(mt_is_channels_last(y));
    mt_tensor *ref =
        mt_conv2d(mt_cast(in.x, MT_BF16), mt_cast(in.w, MT_BF16), mt_cast(in.b, MT_BF16), &k->o);
    double *v = mt_test_values(ref);
    assert_tensor_close(y, v, mt_numel(y), 0, 0);
    free(v);
    assert_int_equal(mt_backward(mt_sum_all(mt_cast(y, MT_F32)), NULL), 0);
    assert_int_equal(mt_dtype_of(mt_grad(in.w)), MT_F32);
    assert_int_equal(mt_dtype_of(mt_grad(in.x)), MT_F32);
    assert_int_equal(mt_dtype_of(mt_grad(in.b)), MT_F32);
    mt_scope_end();
    assert_no_error();
    release_inputs(&in);
}

static void test_conv2d_errors(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_zeros(MT_SHAPE(2, 4, 5, 5), MT_F32, d);
    mt_tensor *w = mt_zeros(MT_SHAPE(6, 4, 3, 3), MT_F32, d);
    assert_null(mt_conv2d(mt_zeros(MT_SHAPE(4, 5, 5), MT_F32, d), w, NULL, NULL));
    assert_error(MT_ERR_SHAPE,
                 "mt_conv2d: arg 1: input must be 4-d [N, C, H, W], got shape [4, 5, 5]");
    assert_null(mt_conv2d(x, mt_zeros(MT_SHAPE(6, 4, 3), MT_F32, d), NULL, NULL));
    assert_error(MT_ERR_SHAPE, "arg 2: weight must be 4-d");
    assert_null(mt_conv2d(x, mt_zeros(MT_SHAPE(6, 3, 3, 3), MT_F32, d), NULL, NULL));
    assert_error(MT_ERR_SHAPE, "expects 3 input channels (groups 1), input [2, 4, 5, 5] has 4");
    assert_null(mt_conv2d(x, mt_zeros(MT_SHAPE(6, 1, 3, 3), MT_F32, d), NULL,
                          &(mt_conv2d_opts){.groups = 3}));
    assert_error(MT_ERR_SHAPE, "groups 3 must divide in_channels 4 and out_channels 6");
    assert_null(mt_conv2d(x, w, mt_zeros(MT_SHAPE(5), MT_F32, d), NULL));
    assert_error(MT_ERR_SHAPE, "arg 3: bias of shape [5] does not fit weight [6, 4, 3, 3]");
    assert_null(mt_conv2d(x, mt_zeros(MT_SHAPE(6, 4, 7, 3), MT_F32, d), NULL, NULL));
    assert_error(MT_ERR_SHAPE, "is larger than the padded input");
    assert_null(mt_conv2d(x, w, NULL, &(mt_conv2d_opts){.dilation = {3, 1}}));
    assert_error(MT_ERR_SHAPE, "(dilation 3) is larger than the padded input");
    assert_null(mt_conv2d(x, w, NULL, &(mt_conv2d_opts){.stride = {1, -1}}));
    assert_error(MT_ERR_INVALID, "stride, padding and dilation must not be negative");
    assert_null(mt_conv2d(x, w, NULL, &(mt_conv2d_opts){.groups = -2}));
    assert_error(MT_ERR_INVALID, "groups must be positive, got -2");
    assert_null(mt_conv2d(mt_zeros(MT_SHAPE(2, 4, 5, 5), MT_I64, d), w, NULL, NULL));
    assert_error(MT_ERR_DTYPE, "mt_conv2d: arg 1");
    assert_null(mt_conv2d(NULL, w, NULL, NULL));
    assert_null(mt_conv2d(x, NULL, NULL, NULL));
    assert_no_error();
    /* a failed call leaves nothing behind: the fixture checks live tensors and bytes */
    mt_scope_end();
}

/* Strides, paddings and dilations at the edge of int64: an overflowing geometry is an error
   naming it; a stride past 32 bits where one window covers the dim is torch's 1-wide output
   (the libraries get an equivalent small stride), forward and backward equal to the first
   window of the stride-1 convolution. */
static void test_conv2d_huge_geometry(void **state) {
    (void)state;
    mt_scope_begin();
    uint64_t rng = 11;
    mt_tensor *x = mt_test_uniform(&rng, MT_F32, MT_SHAPE(2, 4, 5, 5), 0);
    mt_tensor *w = mt_test_uniform(&rng, MT_F32, MT_SHAPE(6, 4, 3, 3), 0);
    mt_tensor *b = mt_test_uniform(&rng, MT_F32, MT_SHAPE(6), 0);
    assert_null(mt_conv2d(x, w, NULL, &(mt_conv2d_opts){.padding = {INT64_MAX / 2, 0}}));
    assert_error(MT_ERR_SHAPE, "padding [4611686018427387903, 0] overflows int64");
    assert_null(mt_conv2d(x, w, NULL, &(mt_conv2d_opts){.dilation = {1, INT64_MAX / 2 + 7}}));
    assert_error(MT_ERR_SHAPE, "with dilation [1, 4611686018427387910] or input");
    /* a 2-wide kernel at dilation INT64_MAX spans exactly one past INT64_MAX */
    mt_tensor *w2 = mt_test_uniform(&rng, MT_F32, MT_SHAPE(6, 4, 2, 2), 0);
    assert_null(mt_conv2d(x, w2, NULL, &(mt_conv2d_opts){.dilation = {INT64_MAX, 1}}));
    assert_error(MT_ERR_SHAPE, "with dilation [9223372036854775807, 1] or input");
    /* 1x1 kernels ignore the dilation; the output keeps the input's extent */
    mt_tensor *w1 = mt_test_uniform(&rng, MT_F32, MT_SHAPE(6, 4, 1, 1), 0);
    mt_tensor *y1 = mt_conv2d(x, w1, NULL, &(mt_conv2d_opts){.dilation = {INT64_MAX, 1}});
    mt_tensor *r1 = mt_conv2d(x, w1, NULL, NULL);
    assert_no_error();
    double *v1 = mt_test_values(r1);
    assert_tensor_close(y1, v1, mt_numel(r1), 0, 0);
    free(v1);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        mt_tensor *bb = with_bias ? b : NULL;
        mt_set_requires_grad(x, true);
        mt_tensor *y = mt_conv2d(x, w, bb, &(mt_conv2d_opts){.stride = {INT64_MAX, 1LL << 40}});
        assert_no_error();
        assert_shape(y, 2, 6, 1, 1);
        mt_tensor *full = mt_conv2d(x, w, bb, NULL);
        mt_tensor *first = mt_slice(mt_slice(full, 2, 0, 1, 1), 3, 0, 1, 1);
        double *want = mt_test_values(first);
        assert_tensor_close(y, want, 12, 1e-6, 1e-6);
        free(want);
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        double *gx = mt_test_values(mt_grad(x));
        mt_zero_grad(x);
        assert_int_equal(mt_backward(mt_sum_all(first), NULL), 0);
        assert_tensor_close(mt_grad(x), gx, mt_numel(x), 1e-6, 1e-6);
        free(gx);
        mt_zero_grad(x);
        mt_set_requires_grad(x, false);
    }
    mt_scope_end();
}

/* No input channels: the output is the bias broadcast (a sum over nothing), the input and
   weight gradients are empty and the bias gradient sums the cotangent. */
static void test_conv2d_no_input_channels(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_zeros(MT_SHAPE(2, 0, 5, 5), MT_F32, d);
    mt_tensor *w = mt_zeros(MT_SHAPE(6, 0, 3, 3), MT_F32, d);
    mt_tensor *b = mt_test_tensor((const double[]){1, -2, 3, 0.5, 0, 7}, MT_F32, MT_SHAPE(6));
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    for (int cl = 0; cl < 2; cl++) {
        mt_tensor *xx = cl ? mt_to_channels_last(x) : x;
        mt_tensor *y = mt_conv2d(xx, w, b, &(mt_conv2d_opts){.padding = {1, 0}});
        assert_no_error();
        assert_shape(y, 2, 6, 5, 3);
        double want[2 * 6 * 5 * 3];
        for (int i = 0; i < 2 * 6 * 5 * 3; i++)
            want[i] = ((const double[]){1, -2, 3, 0.5, 0, 7})[i / 15 % 6];
        assert_tensor_close(y, want, 2 * 6 * 5 * 3, 0, 0);
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        const double gb[6] = {30, 30, 30, 30, 30, 30};
        assert_tensor_close(mt_grad(b), gb, 6, 0, 0);
        assert_int_equal(mt_numel(mt_grad(x)), 0);
        assert_int_equal(mt_numel(mt_grad(w)), 0);
        mt_zero_grad(b);
    }
    const double zeros[2 * 6 * 3 * 3] = {0};
    assert_tensor_close(mt_conv2d(x, w, NULL, NULL), zeros, 2 * 6 * 3 * 3, 0, 0);
    mt_scope_end();
}

/* Out of memory (an output or a layout buffer over the limit) is an error, and nothing leaks
   (the fixture checks). */
static void test_conv2d_pool_oom(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_tensor *z = mt_zeros(MT_SHAPE(2, 8, 32, 32), MT_F32, d), *x = mt_to_channels_last(z);
    mt_release(z);
    mt_tensor *w = mt_zeros(MT_SHAPE(8, 8, 3, 3), MT_F32, d);
    mt_debug_set_alloc_limit(4096);
    assert_null(mt_conv2d(x, w, NULL, NULL));
    assert_error(MT_ERR_OOM, "mt_conv2d");
    assert_null(mt_max_pool2d(x, &(mt_pool2d_opts){.kernel = {2, 2}}));
    assert_error(MT_ERR_OOM, "mt_max_pool2d");
    mt_debug_set_alloc_limit(0);
    mt_tensor *y = mt_conv2d(x, w, NULL, NULL);
    assert_non_null(y);
    mt_release(y);
    mt_release(w);
    mt_release(x);
}

/* A small convolution on the device under test, checked element by element. */
static void test_conv2d_device(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1, 2, 4, 4), MT_F32, d);
    mt_tensor *w = mt_ones(MT_SHAPE(3, 2, 3, 3), MT_F32, d);
    mt_tensor *y = mt_conv2d(x, w, NULL, NULL);
    assert_no_error();
    assert_on_test_device(y);
    double e[12];
    for (int i = 0; i < 12; i++) e[i] = 18.0;
    assert_tensor_close(y, e, 12, 0, 0);
    mt_scope_end();
}

/* torch.nn.Conv2d's init: W and b within 1/sqrt(fan_in), spread over it; forward = mt_conv2d.
 */
static void test_conv2d_layer(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_manual_seed(3);
    mt_conv2d_layer l;
    mt_conv2d_opts o = {.stride = {2, 2}, .padding = {1, 1}, .groups = 2};
    assert_int_equal(mt_conv2d_layer_init(&l, 4, 6, 3, 3, &o, true, MT_F32, d), 0);
    assert_shape(l.weight, 6, 2, 3, 3);
    assert_shape(l.bias, 6);
    assert_true(mt_requires_grad(l.weight) && mt_requires_grad(l.bias));
    double bound = 1.0 / sqrt(2.0 * 3 * 3), lo = 1, hi = -1;
    double *w = mt_test_values(l.weight);
    for (int i = 0; i < 108; i++) {
        assert_true(fabs(w[i]) <= bound);
        lo = fmin(lo, w[i]), hi = fmax(hi, w[i]);
    }
    assert_true(lo < -0.8 * bound && hi > 0.8 * bound); /* drawn over the whole range */
    free(w);
    double *b = mt_test_values(l.bias);
    for (int i = 0; i < 6; i++) assert_true(fabs(b[i]) <= bound);
    free(b);
    mt_scope_begin();
    mt_tensor *x = mt_randn(MT_SHAPE(2, 4, 7, 7), MT_F32, d);
    mt_tensor *y = mt_conv2d_layer_forward(&l, x), *r = mt_conv2d(x, l.weight, l.bias, &o);
    assert_shape(y, 2, 6, 4, 4);
    double *rv = mt_test_values(r);
    assert_tensor_close(y, rv, mt_numel(r), 0, 0);
    free(rv);
    mt_scope_end();
    mt_conv2d_layer_free(&l);
    assert_null(l.weight);
    mt_tensor *x1 = mt_zeros(MT_SHAPE(1, 4, 3, 3), MT_F32, d);
    assert_null(mt_conv2d_layer_forward(&l, x1));
    assert_error(MT_ERR_STATE, "layer is not initialised");
    mt_release(x1);
    assert_int_equal(
        mt_conv2d_layer_init(&l, 4, 6, 3, 3, &(mt_conv2d_opts){.groups = 3}, true, MT_F32, d),
        MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "groups 3 must be positive and divide in 4 and out 6");
    assert_int_equal(mt_conv2d_layer_init(&l, 4, 6, 0, 3, NULL, true, MT_F32, d), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "kernel [0, 3]");
    assert_int_equal(mt_conv2d_layer_init(&l, 4, 6, 1, 1, NULL, false, MT_I64, d), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "parameters must be floating");
    assert_int_equal(mt_conv2d_layer_init(NULL, 4, 6, 1, 1, NULL, false, MT_F32, d), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "layer is NULL");
    /* a fan-in past int64 (4 * 2^32 * 2^32): too large to allocate, with no overflow on the
       way (the UBSan build checks) */
    assert_int_equal(mt_conv2d_layer_init(&l, 4, 4, 1LL << 32, 1LL << 32, NULL, true, MT_F32, d),
                     MT_ERR_OOM);
    assert_error(MT_ERR_OOM, "too large to allocate");
    assert_int_equal(mt_conv2d_layer_init(&l, 4, 6, 1, 1, NULL, false, MT_F32, d), 0);
    assert_null(l.bias);
    mt_conv2d_layer_free(&l);
}

/* ---- the CUDA backend's cuDNN paths (on the CPU these run the same checks on oneDNN) */

/* Geometries no other test uses, so that their first call chooses an algorithm. */
static const conv_case fresh[] = {
    {2, 3, 6, 5, 4, 2, 2, {.stride = {1, 2}, .padding = {1, 0}}, true},
    {1, 4, 5, 6, 4, 3, 1, {.padding = {1, 0}, .groups = 4}, true},
    {1, 2, 4, 5, 3, 2, 3, {.dilation = {2, 1}}, false},
};

/* MT_CUDNN_FIND=1: an exhaustive search per direction on a CUDA device (each waits for the
   device, so it is counted as a host sync), then the cached choice; the results are the
   reference's either way. */
static void test_conv2d_cudnn_find(void **state) {
    (void)state;
    assert_int_equal(setenv("MT_CUDNN_FIND", "1", 1), 0);
    int64_t s0 = mt_host_sync_count();
    check_case_seed(&fresh[0], MT_F32, true, 1e-5, 21);
    int64_t first = mt_host_sync_count() - s0;
    s0 = mt_host_sync_count();
    check_case_seed(&fresh[0], MT_F32, true, 1e-5, 22);
    int64_t again = mt_host_sync_count() - s0;
    assert_int_equal(unsetenv("MT_CUDNN_FIND"), 0);
    assert_int_equal(first - again, mt_test_device_is_cpu() ? 0 : 3);
}

/* A training step's convolutions never wait for the device, the algorithm choice included. */
static void test_conv2d_no_host_sync(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    const conv_case *k = &fresh[1];
    conv_inputs in = make_inputs(k, MT_F32, true, 5);
    mt_scope_begin();
    mt_tensor *gy = mt_ones(MT_SHAPE(k->n, k->oc, out_size(k, 0), out_size(k, 1)), MT_F32, d);
    int64_t s0 = mt_host_sync_count();
    for (int i = 0; i < 2; i++) {
        mt_tensor *y = mt_conv2d(in.x, in.w, in.b, &k->o);
        assert_non_null(y);
        assert_int_equal(mt_backward(y, gy), 0);
    }
    assert_int_equal(mt_host_sync_count(), s0);
    mt_scope_end();
    release_inputs(&in);
}

/* Faults injected into the emulator's fake cuDNN (MTEMU_CUDNN_FAIL) become clear errors naming
   the op, the cuDNN call and its status; the failed call returns nothing and leaks nothing. */
static void test_conv2d_cudnn_errors(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1, 2, 4, 4), MT_F32, d);
    mt_tensor *w = mt_ones(MT_SHAPE(3, 2, 3, 3), MT_F32, d);
    mt_tensor *b = mt_ones(MT_SHAPE(3), MT_F32, d);
    mt_set_requires_grad(x, true);
    setenv("MTEMU_CUDNN_FAIL", "cudnnConvolutionForward=3000", 1);
    assert_null(mt_conv2d(x, w, b, NULL));
    assert_error(MT_ERR_UNSUPPORTED,
                 "mt_conv2d: cuDNN error in cudnnConvolutionForward: CUDNN_STATUS_NOT_SUPPORTED");
    setenv("MTEMU_CUDNN_FAIL", "cudnnConvolutionForward=4004", 1);
    assert_null(mt_conv2d(x, w, b, NULL));
    assert_error(MT_ERR_OOM, "mt_conv2d: cuDNN error in cudnnConvolutionForward: "
                             "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED");
    /* the choice of a new geometry */
    mt_tensor *x2 = mt_ones(MT_SHAPE(1, 2, 5, 5), MT_F32, d);
    mt_set_requires_grad(x2, true);
    setenv("MTEMU_CUDNN_FAIL", "cudnnGetConvolutionForwardAlgorithm_v7=2000", 1);
    assert_null(mt_conv2d(x2, w, NULL, NULL));
    assert_error(MT_ERR_DEVICE, "cudnnGetConvolution*Algorithm_v7: CUDNN_STATUS_BAD_PARAM");
    /* a failed backward leaves no gradient */
    unsetenv("MTEMU_CUDNN_FAIL");
    mt_tensor *y = mt_conv2d(x, w, NULL, NULL);
    assert_non_null(y);
    setenv("MTEMU_CUDNN_FAIL", "cudnnConvolutionBackwardData=5000", 1);
    assert_int_not_equal(mt_backward(mt_sum_all(y), NULL), 0);
    assert_error(MT_ERR_DEVICE, "cuDNN error in cudnnConvolutionBackwardData: "
                                "CUDNN_STATUS_EXECUTION_FAILED");
    assert_null(mt_grad(x));
    unsetenv("MTEMU_CUDNN_FAIL");
    /* and everything works again */
    mt_tensor *y2 = mt_conv2d(x2, w, NULL, NULL);
    assert_non_null(y2);
    assert_int_equal(mt_backward(mt_sum_all(y2), NULL), 0);
    assert_non_null(mt_grad(x2));
    mt_scope_end();
}

/* The dilated geometry in every dtype and both layouts on fresh shapes (the algorithm choice
   for low precision and F64 on a device). */
static void test_conv2d_fresh_dtypes(void **state) {
    (void)state;
    check_case_seed(&fresh[2], MT_F64, false, 1e-12, 31);
    check_case_seed(&fresh[2], MT_F64, true, 1e-12, 32);
    check_case_seed(&fresh[2], MT_F32, true, 1e-5, 33);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_conv2d_reference_f32),
        MT_TEST(test_conv2d_reference_f64),
        MT_TEST(test_conv2d_reference_low),
        MT_TEST(test_conv2d_gradcheck),
        MT_TEST(test_conv2d_strided_inputs),
        MT_TEST(test_conv2d_autocast),
        MT_TEST(test_conv2d_layer),
        MT_TEST(test_conv2d_pool_oom),
        MT_TEST(test_conv2d_errors),
        MT_TEST(test_conv2d_huge_geometry),
        MT_TEST(test_conv2d_no_input_channels),
        MT_TEST(test_conv2d_device),
        MT_TEST(test_conv2d_cudnn_find),
        MT_TEST(test_conv2d_no_host_sync),
        MT_TEST(test_conv2d_fresh_dtypes),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_conv2d_cudnn_errors)
            : MT_TEST_SKIPPED(test_conv2d_cudnn_errors,
                              "fault injection needs the emulated CUDA device"),
    };
    return MT_RUN_TESTS(tests);
}

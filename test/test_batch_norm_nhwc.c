/* Batch norm on channels-last input: the same values as on NCHW input (outputs, running
   statistics, saved statistics through the gradients, every gradient) for F64/F32/F16/BF16,
   training and eval, with and without affine parameters, the fused residual add and relu;
   shapes with more rows than one accumulation block and than one thread's range, and whose
   channels take several blocks (splits) on CUDA; inputs whose mean is far from zero (the
   shifted sums); an FP64 gradient check through a channels-last input; F16 shapes that take
   cuDNN's fused NHWC path on CUDA. Both backends have channels-last kernels: the output and
   the input gradient stay channels-last, no NCHW copy. */
#include "test_util.h"

#define S4(a, b, c, d) ((const int64_t[]){a, b, c, d})

static uint64_t rng_state = 0x510e527fade682d1ULL;

static mt_tensor *make(mt_dtype dt, int nd, const int64_t *shape, double offset) {
    return mt_test_uniform(&rng_state, dt, nd, shape, offset);
}

typedef struct {
    bool training, affine, residual, relu;
} bn_opts;

/* One run in the given layout: y and the gradients of x, weight, bias, residual (values). */
typedef struct {
    double *y, *gx, *gw, *gb, *gr, *rm, *rv;
} bn_result;

static void free_result(bn_result *r) {
    free(r->y), free(r->gx), free(r->gw), free(r->gb), free(r->gr), free(r->rm), free(r->rv);
}

static double *grad_values(mt_tensor *t, bool cl) {
    mt_tensor *g = mt_grad(t);
    assert_non_null(g);
    double *v = mt_test_values(g);
    if (cl && mt_ndim(g) == 4) /* the gradient keeps the format */
        assert_true(mt_is_channels_last(g) && !mt_is_contiguous(g));
    mt_release(g);
    return v;
}

static bn_result run(mt_tensor *x0, mt_tensor *res0, mt_tensor *w0, mt_tensor *b0, mt_tensor *cot0,
                     const bn_opts *o, bool cl) {
    bn_result r = {0};
    mt_dtype acc = mt_dtype_of(x0) == MT_F64 ? MT_F64 : MT_F32;
    int64_t C = mt_dim(x0, 1);
    /* fresh leaves in either layout (the inputs never require grad themselves) */
    mt_tensor *x = cl ? mt_to_channels_last(x0) : mt_clone(x0);
    mt_tensor *res = o->residual ? (cl ? mt_to_channels_last(res0) : mt_clone(res0)) : NULL;
    mt_tensor *cot = cl ? mt_to_channels_last(cot0) : mt_clone(cot0);
    mt_tensor *w = o->affine ? mt_clone(w0) : NULL, *b = o->affine ? mt_clone(b0) : NULL;
    mt_tensor *rm = mt_zeros(MT_SHAPE(C), acc, mt_test_device());
    mt_tensor *rv = mt_ones(MT_SHAPE(C), acc, mt_test_device());
    assert_no_error();
    mt_set_requires_grad(x, true);
    if (res) mt_set_requires_grad(res, true);
    if (w) mt_set_requires_grad(w, true);
    if (b) mt_set_requires_grad(b, true);
    mt_tensor *y = mt_batch_norm_act(x, rm, rv, w, b, res, o->training, 0.1, 1e-5,
                                     o->relu ? MT_ACT_RELU : MT_ACT_NONE);
    assert_non_null(y);
    if (cl) assert_true(mt_is_channels_last(y) && !mt_is_contiguous(y));
    r.y = mt_test_values(y);
    r.rm = mt_test_values(rm);
    r.rv = mt_test_values(rv);
    assert_int_equal(mt_backward(y, cot), 0);
    r.gx = grad_values(x, cl);
    if (res) r.gr = grad_values(res, cl);
    if (w) r.gw = grad_values(w, cl);
    if (b) r.gb = grad_values(b, cl);
    mt_release(y);
    mt_release(x);
    mt_release(res);
    mt_release(cot);
    mt_release(w);
    mt_release(b);
    mt_release(rm);
    mt_release(rv);
    return r;
}

static void close_or_fail(const char *what, const double *a, const double *e, int64_t n,
                          double atol, double rtol) {
    if (!a && !e) return;
    assert_true(a && e);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(a[i] - e[i]) <= atol + rtol * fabs(e[i])))
            fail_msg("%s element %lld: NHWC %.9g, NCHW %.9g", what, (long long)i, a[i], e[i]);
}

static void compare(mt_dtype dt, const int64_t *shape, const bn_opts *o, double offset) {
    int64_t C = shape[1], n = shape[0] * shape[1] * shape[2] * shape[3];
    mt_tensor *x = make(dt, 4, shape, offset), *res = make(dt, 4, shape, 0);
    mt_tensor *cot = make(dt, 4, shape, 0);
    mt_dtype acc = dt == MT_F64 ? MT_F64 : MT_F32;
    mt_tensor *w = make(acc, MT_SHAPE(C), 1.0), *b = make(acc, MT_SHAPE(C), 0);
    bn_result nchw = run(x, res, w, b, cot, o, false), nhwc = run(x, res, w, b, cot, o, true);
    /* the two layouts sum in different orders: equal within the dtype's rounding */
    double tol = dt == MT_F64 ? 1e-11 : dt == MT_F32 ? 2e-5 : dt == MT_F16 ? 4e-3 : 3e-2;
    close_or_fail("y", nhwc.y, nchw.y, n, tol, tol);
    close_or_fail("gx", nhwc.gx, nchw.gx, n, tol, tol);
    close_or_fail("gres", nhwc.gr, nchw.gr, n, tol, tol);
    double ptol = dt == MT_F64 ? 1e-10 : 1e-4 * (double)(n / C); /* sums over n / C values */
    close_or_fail("gw", nhwc.gw, nchw.gw, C, ptol, 1e-4);
    close_or_fail("gb", nhwc.gb, nchw.gb, C, ptol, 1e-4);
    close_or_fail("running_mean", nhwc.rm, nchw.rm, C, 1e-5, 1e-5);
    close_or_fail("running_var", nhwc.rv, nchw.rv, C, 1e-5, 1e-4);
    free_result(&nchw);
    free_result(&nhwc);
    mt_release(x);
    mt_release(res);
    mt_release(cot);
    mt_release(w);
    mt_release(b);
}

static void test_nhwc_matches_nchw(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    const bn_opts opts[] = {
        {true, true, false, false},  {true, false, false, false}, {true, true, true, true},
        {false, true, false, false}, {false, true, true, true},
    };
    for (int d = 0; d < 4; d++)
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
            compare(dts[d], S4(2, 5, 3, 4), &opts[k], 0.0);
            compare(dts[d], S4(4, 37, 9, 9), &opts[k], 0.0); /* 324 rows: blocks, parts */
        }
}

/* Channels that take several blocks on CUDA in both layouts: NCHW runs shorter and longer
   than a block's 256 values, splits ending inside a run; forward and every gradient. */
static void test_nhwc_splits(void **state) {
    (void)state;
    const bn_opts opts[] = {{true, true, true, true}, {true, false, false, false}};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        compare(MT_F32, S4(160, 2, 7, 8), &opts[k], 0.5);
        compare(MT_F32, S4(8, 2, 32, 33), &opts[k], 0.0);
        compare(MT_BF16, S4(160, 2, 7, 8), &opts[k], 0.0);
    }
}

/* F16 with C a multiple of 4: on CUDA the training cases run through cuDNN's Ex calls
   (persistent NHWC batch norm: the ReLU mask, or under the plain one whatever cuDNN keeps, in
   the reserve space) on NHWC input, the own kernels (fused) or cuDNN's legacy calls (plain)
   on NCHW input; both agree, gradients of the weights and the residual included. */
static void test_nhwc_cudnn_shapes(void **state) {
    (void)state;
    const bn_opts opts[] = {
        {true, true, true, true},    {true, false, false, true},  {true, true, false, true},
        {true, false, true, true},   {false, true, false, false}, {true, true, false, false},
        {true, false, false, false},
    };
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        compare(MT_F16, S4(2, 8, 3, 4), &opts[k], 0.0);
        compare(MT_F16, S4(3, 12, 5, 5), &opts[k], 2.0);
    }
}

/* |mean| >> std: the shifted sums keep the variance (both layouts) */
static void test_nhwc_large_mean(void **state) {
    (void)state;
    bn_opts o = {true, true, false, false};
    compare(MT_F32, S4(3, 8, 10, 10), &o, 1000.0);
    compare(MT_F64, S4(3, 8, 10, 10), &o, 1e6);
}

typedef struct {
    bool relu;
} grad_ctx;

/* the input goes through a channels-last view, so the channels-last kernels run */
static mt_tensor *bn_cl_fn(mt_tensor *const *in, void *vctx) {
    grad_ctx *g = vctx;
    mt_tensor *x = mt_to_channels_last(in[0]), *r = mt_to_channels_last(in[3]);
    mt_tensor *y = mt_batch_norm_act(x, NULL, NULL, in[1], in[2], r, true, 0.1, 1e-5,
                                     g->relu ? MT_ACT_RELU : MT_ACT_NONE);
    mt_release(x);
    mt_release(r);
    return y;
}

static void test_nhwc_gradcheck(void **state) {
    (void)state;
    for (int relu = 0; relu < 2; relu++) {
        mt_tensor *in[4] = {make(MT_F64, MT_SHAPE(2, 3, 2, 3), 0), make(MT_F64, MT_SHAPE(3), 1),
                            make(MT_F64, MT_SHAPE(3), 0), make(MT_F64, MT_SHAPE(2, 3, 2, 3), 0)};
        for (int i = 0; i < 4; i++) mt_set_requires_grad(in[i], true);
        grad_ctx g = {relu != 0};
        if (mt_gradcheck(bn_cl_fn, in, 4, &g, NULL)) fail_msg("%s", mt_last_error());
        for (int i = 0; i < 4; i++) mt_release(in[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_nhwc_matches_nchw), MT_TEST(test_nhwc_large_mean), MT_TEST(test_nhwc_splits),
        MT_TEST(test_nhwc_cudnn_shapes), MT_TEST(test_nhwc_gradcheck),
    };
    MT_RUN_TESTS(tests);
}

/* mt_linear_act: the fused linear + activation against plain loops in F64 and against the
   unfused composition (mt_relu / mt_gelu / mt_gelu_tanh of mt_linear) in every dtype and
   layout (3-D and 1-D inputs, transposed W, a batch of rows that does not flatten, K == 0,
   several GEMM panels), FP64 gradient checks, gradients equal to the unfused ones, autocast,
   and the error paths. Golden values from PyTorch are in test_golden (linear_act.txt). */
#include "test_util.h"

/* ---- deterministic inputs */
static uint64_t rng_state = 0x3c6ef372fe94f82bULL;

#define numel_of mt_test_numel

/* a tensor of dtype dt with values in [-1, 1) */
static mt_tensor *make(mt_dtype dt, int nd, const int64_t *shape) {
    return mt_test_uniform(&rng_state, dt, nd, shape, 0.0);
}

static const mt_activation acts[] = {MT_ACT_NONE, MT_ACT_RELU, MT_ACT_GELU, MT_ACT_GELU_TANH};
#define N_ACTS 4

static double act_ref(mt_activation act, double v) {
    switch (act) {
    case MT_ACT_RELU:
        return v > 0 ? v : 0;
    case MT_ACT_GELU:
        return 0.5 * v * erfc(-v / sqrt(2.0));
    case MT_ACT_GELU_TANH:
        return 0.5 * v * (1 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    default:
        return v;
    }
}

static mt_tensor *unfused(mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_activation act) {
    mt_tensor *y = mt_linear(x, w, b);
    mt_tensor *r = act == MT_ACT_RELU        ? mt_relu(y)
                   : act == MT_ACT_GELU      ? mt_gelu(y)
                   : act == MT_ACT_GELU_TANH ? mt_gelu_tanh(y)
                                             : mt_retain(y);
    mt_release(y);
    return r;
}

static void tol_for(mt_dtype dt, double *atol, double *rtol) {
    *atol = dt == MT_F64 ? 1e-12 : dt == MT_F32 ? 1e-5 : dt == MT_F16 ? 4e-3 : 3e-2;
    *rtol = dt == MT_F64 ? 1e-12 : dt == MT_F32 ? 1e-5 : dt == MT_F16 ? 2e-3 : 1.6e-2;
}

/* x is made [xs] (or, with permuted, [xs1, xs0, ..] transposed back to [xs], so its rows do
   not flatten); w [out, in] or its transpose's view. offset (2-D x only): x, w and the bias
   are views from row (element) 1 of a tensor one longer, so their data are only as aligned
   as one row (element): a GPU library may not assume 16 or 256 bytes. */
typedef struct {
    int nx;
    int64_t xs[4];
    int64_t out;
    bool bias, transposed_w, permuted_x, offset;
} lin_case;

/* t's view from index 1 along dim 0 (an extra first row or element), or t itself. */
static mt_tensor *from_second(mt_tensor *t, bool offset) {
    return offset ? mt_narrow(t, 0, 1, mt_shape(t)[0] - 1) : mt_retain(t);
}

static void check_case(mt_dtype dt, mt_activation act, const lin_case *lc) {
    int64_t in = lc->xs[lc->nx - 1];
    mt_tensor *xraw, *x;
    if (lc->permuted_x) { /* [a, b, in] made as [b, a, in] and transposed: rows do not merge */
        xraw = make(dt, MT_SHAPE(lc->xs[1], lc->xs[0], in));
        x = mt_transpose(xraw, 0, 1);
    } else if (lc->offset) {
        xraw = make(dt, MT_SHAPE(lc->xs[0] + 1, in));
        x = from_second(xraw, true);
    } else {
        xraw = make(dt, lc->nx, lc->xs);
        x = mt_retain(xraw);
    }
    int64_t extra = lc->offset ? 1 : 0;
    mt_tensor *wraw = lc->transposed_w ? make(dt, MT_SHAPE(in, lc->out))
                                       : make(dt, MT_SHAPE(lc->out + extra, in));
    mt_tensor *w = lc->transposed_w ? mt_transpose(wraw, 0, 1) : from_second(wraw, lc->offset);
    mt_tensor *braw = lc->bias ? make(dt, MT_SHAPE(lc->out + extra)) : NULL;
    mt_tensor *b = braw ? from_second(braw, lc->offset) : NULL;
    double *xv = mt_test_values(x), *wv = mt_test_values(w), *bv = b ? mt_test_values(b) : NULL;
    int64_t rows = numel_of(lc->nx, lc->xs) / (in ? in : 1), out = lc->out;
    if (in == 0) rows = numel_of(lc->nx - 1, lc->xs);
    double *ref = malloc((size_t)(rows * out + 1) * sizeof *ref);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = bv ? bv[o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += xv[r * in + i] * wv[o * in + i];
            ref[r * out + o] = act_ref(act, s);
        }
    mt_tensor *y = mt_linear_act(x, w, b, act);
    assert_no_error();
    assert_on_test_device(y);
    int64_t ys[MT_MAX_DIMS];
    memcpy(ys, lc->xs, (size_t)lc->nx * sizeof *ys);
    ys[lc->nx - 1] = out;
    mt_test_assert_shape(y, lc->nx, ys, __FILE__, __LINE__);
    assert_int_equal(mt_dtype_of(y), dt);
    double atol, rtol;
    tol_for(dt, &atol, &rtol);
    assert_tensor_close(y, ref, rows * out, atol * 4, rtol);
    /* the unfused ops: within the dtype's rounding (the fused op rounds once) */
    mt_tensor *u = unfused(x, w, b, act);
    double *uv = mt_test_values(u);
    assert_tensor_close(y, uv, rows * out, atol * 4, rtol);
    free(uv);
    mt_release(u);
    mt_release(y);
    mt_release(x);
    mt_release(xraw);
    mt_release(wraw);
    mt_release(w);
    mt_release(b);
    mt_release(braw);
    free(xv);
    free(wv);
    free(bv);
    free(ref);
}

static const lin_case cases[] = {
    {2, {4, 6}, 5, true, false, false, false},      {2, {4, 6}, 5, false, false, false, false},
    {3, {2, 3, 6}, 5, true, false, false, false},   {1, {6}, 5, true, false, false, false},
    {2, {3, 6}, 5, true, true, false, false},       /* W itself transposed */
    {3, {3, 4, 6}, 5, true, false, true, false},    /* rows that do not flatten: copied */
    {2, {70, 300}, 200, true, false, false, false}, /* several GEMM panels and tiles */
    {2, {3, 0}, 4, true, false, false, false},      /* K == 0: act(bias) */
    {2, {0, 5}, 4, true, false, false, false},      /* no rows */
};

static void test_reference(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (int d = 0; d < 4; d++)
        for (int a = 0; a < N_ACTS; a++)
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
                check_case(dts[d], acts[a], &cases[c]);
}

/* Operands at offsets that break the 16- and 256-byte alignment GPU libraries assume by
   default: views from row 1 (F16 x at 12 bytes, the bias at 2). On cuda:0 the fused GEMM must
   ask cuBLASLt for an algorithm that fits the real alignment, and a bias under 16 bytes takes
   the unfused path (the emulated cuBLASLt refuses a pointer its algorithm cannot take). */
static const lin_case offset_cases[] = {
    {2, {5, 6}, 7, true, false, false, true},
    {2, {4, 8}, 8, true, false, false, true}, /* rows of 8 */
    {2, {3, 6}, 5, false, false, false, true},
};

static void test_offset_operands(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (int d = 0; d < 4; d++)
        for (int a = 0; a < N_ACTS; a++)
            for (size_t c = 0; c < sizeof offset_cases / sizeof offset_cases[0]; c++)
                check_case(dts[d], acts[a], &offset_cases[c]);
}

#ifdef MT_TEST_CUDA_EMU
int mt_cuda_lt_plans_clear(int device); /* a test hook of src/cuda/lt_plan_cache.c */
#endif

/* The device's cached cuBLASLt plans dropped, so that the heuristic is asked again (its
   answers, algorithm or none, are cached per shape and alignment). */
static void lt_plans_clear(void) {
#ifdef MT_TEST_CUDA_EMU
    assert_true(mt_cuda_lt_plans_clear(mt_test_device().index) >= 0);
#endif
}

/* cuBLASLt may find no algorithm for a shape or an alignment (its heuristic answers
   NOT_SUPPORTED): the fused op then takes cuBLAS and kernels, with the same results.
   MTEMU_CUBLASLT_NO_ALGO=1 makes the emulated heuristic find none. */
static void test_no_cublaslt_algo(void **state) {
    (void)state;
    lt_plans_clear(); /* plans of earlier tests would skip the heuristic */
    assert_int_equal(setenv("MTEMU_CUBLASLT_NO_ALGO", "1", 1), 0);
    const mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16};
    for (int d = 0; d < 3; d++)
        for (int a = 0; a < N_ACTS; a++)
            for (size_t c = 0; c < 5; c++) check_case(dts[d], acts[a], &cases[c]);
    assert_int_equal(unsetenv("MTEMU_CUBLASLT_NO_ALGO"), 0);
    lt_plans_clear(); /* "no algorithm" is cached too: not for the tests after this one */
}

/* ---- gradients */
typedef struct {
    bool bias;
    mt_activation act;
} act_ctx;

static mt_tensor *fn_linear_act(mt_tensor *const *in, void *vctx) {
    act_ctx *c = vctx;
    return mt_linear_act(in[0], in[1], c->bias ? in[2] : NULL, c->act);
}

static mt_tensor *make_grad(int nd, const int64_t *shape) {
    mt_tensor *t = make(MT_F64, nd, shape);
    mt_set_requires_grad(t, true);
    return t;
}

static void gradcheck_case(int nx, const int64_t *xs, int64_t out, bool bias, mt_activation act) {
    int64_t in_f = xs[nx - 1];
    mt_tensor *in[3] = {make_grad(nx, xs), make_grad(MT_SHAPE(out, in_f)),
                        bias ? make_grad(MT_SHAPE(out)) : NULL};
    act_ctx c = {bias, act};
    int rc = mt_gradcheck(fn_linear_act, in, bias ? 3 : 2, &c, NULL);
    if (rc) fail_msg("gradcheck (act %d): %s", (int)act, mt_last_error());
    for (int i = 0; i < 3; i++) mt_release(in[i]);
}

static void test_gradcheck(void **state) {
    (void)state;
    for (int a = 0; a < N_ACTS; a++) {
        gradcheck_case(MT_SHAPE(3, 4), 5, true, acts[a]);
        gradcheck_case(MT_SHAPE(3, 4), 5, false, acts[a]);
        gradcheck_case(MT_SHAPE(2, 3, 4), 5, true, acts[a]); /* dW over all rows */
        gradcheck_case(MT_SHAPE(4), 3, true, acts[a]);       /* 1-D input */
    }
}

/* Gradients of every input equal those of the unfused ops (F32, a non-trivial cotangent). */
static void test_grads_match_unfused(void **state) {
    (void)state;
    for (int a = 0; a < N_ACTS; a++) {
        mt_tensor *x = make(MT_F32, MT_SHAPE(2, 5, 7)), *w = make(MT_F32, MT_SHAPE(6, 7));
        mt_tensor *b = make(MT_F32, MT_SHAPE(6)), *cot = make(MT_F32, MT_SHAPE(2, 5, 6));
        mt_tensor *leaves[3] = {x, w, b};
        double *g[2][3];
        for (int fused = 0; fused < 2; fused++) {
            for (int i = 0; i < 3; i++) { /* fresh leaves: no gradient from the other pass */
                mt_tensor *d = mt_detach(leaves[i]);
                mt_release(leaves[i]);
                leaves[i] = d;
                mt_set_requires_grad(d, true);
            }
            x = leaves[0], w = leaves[1], b = leaves[2];
            mt_tensor *y = fused ? mt_linear_act(x, w, b, acts[a]) : unfused(x, w, b, acts[a]);
            assert_non_null(y);
            if (fused) assert_string_equal(mt_grad_fn_name(y), "linear_act");
            assert_int_equal(mt_backward(y, cot), 0);
            for (int i = 0; i < 3; i++) {
                mt_tensor *gi = mt_grad(leaves[i]);
                assert_non_null(gi);
                g[fused][i] = mt_test_values(gi);
                mt_release(gi);
            }
            mt_release(y);
        }
        for (int i = 0; i < 3; i++) {
            int64_t n = mt_numel(leaves[i]);
            for (int64_t k = 0; k < n; k++)
                if (fabs(g[0][i][k] - g[1][i][k]) > 1e-5 + 1e-5 * fabs(g[0][i][k]))
                    fail_msg("act %d input %d element %lld: fused %g, unfused %g", (int)acts[a], i,
                             (long long)k, g[1][i][k], g[0][i][k]);
            free(g[0][i]);
            free(g[1][i]);
        }
        mt_release(x);
        mt_release(w);
        mt_release(b);
        mt_release(cot);
    }
}

/* Under autocast the GEMM runs low (LOWER, like mt_linear) and FP32 parameters get FP32
   gradients; the result is the unfused op's within low-precision rounding. */
static void test_autocast(void **state) {
    (void)state;
    const mt_dtype lows[] = {MT_F16, MT_BF16};
    for (int l = 0; l < 2; l++) {
        mt_tensor *x = make(MT_F32, MT_SHAPE(8, 16)), *w = make(MT_F32, MT_SHAPE(12, 16));
        mt_tensor *b = make(MT_F32, MT_SHAPE(12));
        mt_set_requires_grad(w, true);
        mt_set_requires_grad(b, true);
        mt_autocast_begin(lows[l], MT_AMP_O1);
        mt_tensor *y = mt_linear_act(x, w, b, MT_ACT_GELU);
        mt_tensor *u = unfused(x, w, b, MT_ACT_GELU);
        mt_autocast_end();
        assert_non_null(y);
        assert_int_equal(mt_dtype_of(y), lows[l]);
        double *uv = mt_test_values(u);
        assert_tensor_close(y, uv, 8 * 12, 3e-2, 2e-2);
        free(uv);
        mt_tensor *loss = mt_sum_all(y);
        assert_int_equal(mt_backward(loss, NULL), 0);
        mt_tensor *gw = mt_grad(w), *gb = mt_grad(b);
        assert_non_null(gw);
        assert_non_null(gb);
        assert_int_equal(mt_dtype_of(gw), MT_F32);
        assert_int_equal(mt_dtype_of(gb), MT_F32);
        mt_release(gw);
        mt_release(gb);
        mt_release(loss);
        mt_release(u);
        mt_release(y);
        mt_release(x);
        mt_release(w);
        mt_release(b);
    }
}

/* An in-place change of the saved output before backward is reported (relu saves y). */
static void test_saved_output_version(void **state) {
    (void)state;
    mt_tensor *x = make(MT_F32, MT_SHAPE(3, 4)), *w = make(MT_F32, MT_SHAPE(5, 4));
    mt_set_requires_grad(w, true);
    mt_tensor *y = mt_linear_act(x, w, NULL, MT_ACT_RELU);
    assert_non_null(y);
    mt_set_grad_enabled(false);
    assert_int_equal(mt_mul_scalar_inplace(y, 2.0), 0);
    mt_set_grad_enabled(true);
    mt_tensor *loss = mt_sum_all(y);
    assert_true(mt_backward(loss, NULL) < 0);
    assert_error(MT_ERR_STATE, "saved by mt_linear_act for backward was modified in place");
    mt_release(loss);
    mt_release(y);
    mt_release(x);
    mt_release(w);
}

/* The layer's activation: NONE after init (plain mt_linear), else the fused op. */
static void test_layer_act(void **state) {
    (void)state;
    mt_linear_layer l;
    assert_int_equal(mt_linear_layer_init(&l, 6, 4, true, MT_F32, mt_test_device()), 0);
    assert_int_equal(l.act, MT_ACT_NONE);
    mt_tensor *x = make(MT_F32, MT_SHAPE(3, 6));
    mt_tensor *y0 = mt_linear_layer_forward(&l, x);
    assert_string_equal(mt_grad_fn_name(y0), "linear");
    l.act = MT_ACT_RELU;
    mt_tensor *y1 = mt_linear_layer_forward(&l, x);
    assert_non_null(y1);
    assert_string_equal(mt_grad_fn_name(y1), "linear_act");
    double *v0 = mt_test_values(y0);
    for (int i = 0; i < 12; i++) v0[i] = v0[i] > 0 ? v0[i] : 0;
    assert_tensor_close(y1, v0, 12, 1e-6, 1e-6);
    free(v0);
    mt_release(y0);
    mt_release(y1);
    mt_release(x);
    mt_linear_layer_free(&l);
}

/* Leading dims with a 0 that do not merge (x [3, 0, 1]): an empty result, as mt_linear
   gives, and zero gradients (the fused path read an unset header: UBSan, a garbage GEMM). */
static void test_empty_rows(void **state) {
    (void)state;
    for (int act = MT_ACT_NONE; act <= MT_ACT_GELU_TANH; act++) {
        mt_scope_begin();
        mt_tensor *x = mt_zeros(MT_SHAPE(3, 0, 1), MT_F32, mt_test_device());
        mt_tensor *w = mt_ones(MT_SHAPE(3, 1), MT_F32, mt_test_device());
        mt_tensor *b = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
        mt_set_requires_grad(w, true);
        mt_set_requires_grad(b, true);
        mt_tensor *y = mt_linear_act(x, w, b, (mt_activation)act);
        assert_no_error();
        assert_shape(y, 3, 0, 3);
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        assert_tensor_close(mt_grad(w), ((const double[]){0, 0, 0}), 3, 0, 0);
        assert_tensor_close(mt_grad(b), ((const double[]){0, 0, 0}), 3, 0, 0);
        mt_scope_end();
    }
}

static void test_errors(void **state) {
    (void)state;
    mt_tensor *x = make(MT_F32, MT_SHAPE(3, 4)), *w = make(MT_F32, MT_SHAPE(5, 4));
    mt_tensor *bad_w = make(MT_F32, MT_SHAPE(5, 6)), *b = make(MT_F32, MT_SHAPE(4));
    assert_null(mt_linear_act(NULL, w, NULL, MT_ACT_RELU)); /* NULL propagates, no error */
    assert_no_error();
    assert_null(mt_linear_act(x, w, NULL, (mt_activation)7));
    assert_error(MT_ERR_INVALID, "mt_linear_act: arg 4: activation 7 is not");
    assert_null(mt_linear_act(x, bad_w, NULL, MT_ACT_RELU));
    assert_error(MT_ERR_SHAPE, "mt_linear_act: arg 2: weight [5, 6] cannot multiply input [3, 4]");
    assert_null(mt_linear_act(x, w, b, MT_ACT_GELU));
    assert_error(MT_ERR_SHAPE,
                 "mt_linear_act: arg 3: bias of shape [4] does not fit weight [5, 4]");
    mt_tensor *xi = mt_zeros(MT_SHAPE(3, 4), MT_I64, mt_test_device());
    assert_null(mt_linear_act(xi, w, NULL, MT_ACT_RELU));
    assert_error(MT_ERR_DTYPE, "mt_linear_act: arg 1");
    /* batch norm's fused activation takes only NONE and RELU */
    mt_tensor *xb = make(MT_F32, MT_SHAPE(2, 3, 4));
    assert_null(mt_batch_norm_act(xb, NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, MT_ACT_GELU));
    assert_error(MT_ERR_INVALID, "activation 2 is not MT_ACT_NONE or MT_ACT_RELU");
    mt_release(xb);
    mt_release(xi);
    mt_release(x);
    mt_release(w);
    mt_release(bad_w);
    mt_release(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_reference),
        MT_TEST(test_offset_operands),
        mt_test_emulated_device()
            ? (struct CMUnitTest)MT_TEST(test_no_cublaslt_algo)
            : MT_TEST_SKIPPED(test_no_cublaslt_algo,
                              "cuBLASLt's heuristic is emptied only on the emulated "
                              "CUDA device"),
        MT_TEST(test_gradcheck),
        MT_TEST(test_grads_match_unfused),
        MT_TEST(test_autocast),
        MT_TEST(test_saved_output_version),
        MT_TEST(test_layer_act),
        MT_TEST(test_empty_rows),
        MT_TEST(test_errors),
    };
    MT_RUN_TESTS(tests);
}

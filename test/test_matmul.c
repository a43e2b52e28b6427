/* matmul and linear: every 1-D/2-D/batched/broadcast case against triple loops in this
   file, transposed and strided (non-contiguous) operands, F16/BF16 against an F64 reference,
   the low-precision panel path (large shapes, long K), FP64 gradient checks, autocast and
   error paths. */
#include "test_util.h"

/* ---- deterministic inputs */
static uint64_t rng_state = 0x6a09e667f3bcc909ULL;

#define numel_of mt_test_numel

/* a tensor of dtype dt with values in [-1, 1) */
static mt_tensor *make(mt_dtype dt, int nd, const int64_t *shape) {
    return mt_test_uniform(&rng_state, dt, nd, shape, 0.0);
}

static mt_tensor *make_grad(int nd, const int64_t *shape) {
    mt_tensor *t = make(MT_F64, nd, shape);
    mt_set_requires_grad(t, true);
    return t;
}

/* ---- reference: torch.matmul on contiguous doubles, written as plain loops */
typedef struct {
    int nd;
    int64_t shape[MT_MAX_DIMS];
    double *v; /* malloc'd */
} ref_t;

static ref_t ref_matmul(const double *a, int na, const int64_t *sa, const double *b, int nbd,
                        const int64_t *sb) {
    /* operands as [batch.., M, K] and [batch.., K, N] */
    int64_t M = na == 1 ? 1 : sa[na - 2], K = sa[na - 1], N = nbd == 1 ? 1 : sb[nbd - 1];
    int ab = na > 2 ? na - 2 : 0, bb = nbd > 2 ? nbd - 2 : 0, nb = ab > bb ? ab : bb;
    int64_t batch[MT_MAX_DIMS], count = 1;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - ab), ib = i - (nb - bb);
        int64_t da = ia < 0 ? 1 : sa[ia], db = ib < 0 ? 1 : sb[ib];
        batch[i] = da == 1 ? db : da;
        count *= batch[i];
    }
    ref_t r = {0};
    for (int i = 0; i < nb; i++) r.shape[r.nd++] = batch[i];
    if (na > 1) r.shape[r.nd++] = M;
    if (nbd > 1) r.shape[r.nd++] = N;
    int64_t total = count * M * N;
    r.v = calloc((size_t)(total > 0 ? total : 1), sizeof(double));
    for (int64_t bi = 0; bi < count; bi++) {
        /* offsets of this batch entry in a and b (broadcast dims repeat) */
        int64_t rem = bi, ao = 0, bo = 0, astride = M * K, bstride = K * N;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t idx = rem % batch[i];
            rem /= batch[i];
            int ia = i - (nb - ab), ib = i - (nb - bb);
            if (ia >= 0) {
                if (sa[ia] != 1) ao += idx * astride;
                astride *= sa[ia];
            }
            if (ib >= 0) {
                if (sb[ib] != 1) bo += idx * bstride;
                bstride *= sb[ib];
            }
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += a[ao + m * K + k] * b[bo + k * N + n];
                r.v[bi * M * N + m * N + n] = s;
            }
    }
    return r;
}

/* Checks mt_matmul(a, b) (any layout, any dtype) against the reference computed from the
   operands' own (already rounded) values. */
static void check_matmul(mt_tensor *a, mt_tensor *b, double atol, double rtol) {
    double *av = mt_test_values(a), *bv = mt_test_values(b);
    ref_t r = ref_matmul(av, mt_ndim(a), mt_shape(a), bv, mt_ndim(b), mt_shape(b));
    mt_tensor *y = mt_matmul(a, b);
    assert_no_error();
    assert_non_null(y);
    assert_int_equal(mt_dtype_of(y), mt_dtype_of(a));
    mt_test_assert_shape(y, r.nd, r.shape, __FILE__, __LINE__);
    assert_tensor_close(y, r.v, numel_of(r.nd, r.shape), atol, rtol);
    mt_release(y);
    free(r.v);
    free(av);
    free(bv);
}

static void tol_for(mt_dtype dt, double *atol, double *rtol) {
    switch (dt) {
    case MT_F64:
        *atol = 1e-12, *rtol = 1e-12;
        break;
    case MT_F32:
        *atol = 1e-5, *rtol = 1e-5;
        break;
    case MT_F16:
        *atol = 2e-3, *rtol = 1e-3;
        break; /* output rounded once: <= 2^-11 rel */
    default:
        *atol = 2e-2, *rtol = 8e-3;
        break; /* bf16: <= 2^-9 rel */
    }
}

typedef struct {
    int na;
    int64_t sa[4];
    int nb;
    int64_t sb[4];
} case_t;

static const case_t cases[] = {
    {1, {3}, 1, {3}},                /* dot -> 0-d */
    {2, {2, 3}, 1, {3}},             /* matrix-vector */
    {1, {3}, 2, {3, 4}},             /* vector-matrix */
    {2, {2, 3}, 2, {3, 4}},          /* mm */
    {3, {2, 2, 3}, 2, {3, 4}},       /* batch @ matrix (folds into one GEMM) */
    {2, {2, 3}, 3, {4, 3, 5}},       /* matrix @ batch */
    {1, {3}, 3, {2, 3, 4}},          /* vector @ batch */
    {3, {4, 2, 3}, 1, {3}},          /* batch @ vector */
    {4, {2, 1, 2, 3}, 3, {3, 3, 4}}, /* broadcast both ways */
    {3, {5, 2, 3}, 3, {5, 3, 4}},    /* bmm */
    {3, {1, 2, 3}, 3, {4, 3, 2}},    /* size-1 batch broadcast */
    {2, {1, 1}, 2, {1, 1}},          /* 1 x 1 */
    {2, {2, 0}, 2, {0, 3}},          /* K = 0: zeros */
    {2, {0, 3}, 2, {3, 2}},          /* M = 0: empty */
    {3, {0, 2, 3}, 2, {3, 2}},       /* empty batch */
};

static void test_cases_all_dtypes(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (size_t d = 0; d < 4; d++) {
        double atol, rtol;
        tol_for(dts[d], &atol, &rtol);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            mt_tensor *a = make(dts[d], cases[i].na, cases[i].sa);
            mt_tensor *b = make(dts[d], cases[i].nb, cases[i].sb);
            check_matmul(a, b, atol, rtol);
            mt_release(a);
            mt_release(b);
        }
    }
}

static void test_k_zero_gives_zeros(void **state) {
    (void)state;
    mt_tensor *a = mt_empty(MT_SHAPE(3, 0), MT_F16, mt_test_device()),
              *b = mt_empty(MT_SHAPE(0, 2), MT_F16, mt_test_device());
    mt_tensor *y = mt_matmul(a, b);
    double z[6] = {0};
    assert_shape(y, 3, 2);
    assert_tensor_close(y, z, 6, 0, 0);
    mt_release(y);
    mt_release(a);
    mt_release(b);
}

/* Transposed (column-major), strided (neither stride 1) and expanded (stride 0) operands. */
static void test_noncontiguous(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (size_t d = 0; d < 4; d++) {
        double atol, rtol;
        tol_for(dts[d], &atol, &rtol);
        mt_dtype dt = dts[d];
        /* a^T @ b, a @ b^T, a^T @ b^T */
        mt_tensor *at = make(dt, MT_SHAPE(5, 4)), *b = make(dt, MT_SHAPE(5, 3));
        mt_tensor *bt = make(dt, MT_SHAPE(3, 5)), *a = make(dt, MT_SHAPE(4, 5));
        mt_tensor *a_t = mt_transpose(at, 0, 1), *b_t = mt_transpose(bt, 0, 1);
        assert_false(mt_is_contiguous(a_t));
        check_matmul(a_t, b, atol, rtol);
        check_matmul(a, b_t, atol, rtol);
        check_matmul(a_t, b_t, atol, rtol);
        /* every other row and column: no BLAS layout, copies or panels */
        mt_tensor *big = make(dt, MT_SHAPE(8, 10));
        mt_tensor *s1 = mt_slice(big, 0, 0, 8, 2), *s2 = s1 ? mt_slice(s1, 1, 0, 10, 2) : NULL;
        assert_shape(s2, 4, 5);
        check_matmul(s2, b, atol, rtol);
        mt_tensor *s2t = mt_transpose(s2, 0, 1);
        check_matmul(s2t, a, atol, rtol); /* [5, 4] @ [4, 5] */
        /* batched: transposed batch of a, b expanded over the batch (stride 0) */
        mt_tensor *ab = make(dt, MT_SHAPE(3, 5, 4)), *abt = mt_transpose(ab, 1, 2);
        mt_tensor *bx = mt_expand(b, MT_SHAPE(3, 5, 3));
        check_matmul(abt, bx, atol, rtol);
        /* a batch that does not fold (every other batch entry), b shared */
        mt_tensor *ab2 = make(dt, MT_SHAPE(6, 4, 5)), *ab2s = mt_slice(ab2, 0, 0, 6, 2);
        check_matmul(ab2s, b, atol, rtol);
        /* a 1-D operand with stride 2 */
        mt_tensor *v = make(dt, MT_SHAPE(10)), *vs = mt_slice(v, 0, 0, 10, 2);
        check_matmul(a, vs, atol, rtol);
        check_matmul(vs, b, atol, rtol);
        mt_tensor *rel[] = {at,  b,  bt,  a,  a_t, b_t,  big, s1, s2,
                            s2t, ab, abt, bx, ab2, ab2s, v,   vs};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) mt_release(rel[i]);
        assert_no_error();
    }
}

/* Batches of small matrices (spread over threads) in every dtype. */
static void test_many_small_batches(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (size_t d = 0; d < 4; d++) {
        double atol, rtol;
        tol_for(dts[d], &atol, &rtol);
        mt_tensor *a = make(dts[d], MT_SHAPE(300, 8, 8)), *b = make(dts[d], MT_SHAPE(300, 8, 8));
        check_matmul(a, b, atol, rtol);
        mt_tensor *bt = mt_transpose(b, 1, 2);
        check_matmul(a, bt, atol, rtol);
        mt_release(a);
        mt_release(b);
        mt_release(bt);
        /* a batch of matrices large enough to be split over threads one by one */
        mt_tensor *p = make(dts[d], MT_SHAPE(3, 70, 300)), *q = make(dts[d], MT_SHAPE(3, 300, 90));
        check_matmul(p, q, atol, rtol);
        mt_release(p);
        mt_release(q);
    }
}

/* Every element of the [M, N] low-precision y within one rounding of the output (2^-11
   relative for F16, 2^-8 for BF16) plus `acc` of its F64 reference y64. */
static void assert_rounded_once(const char *what, mt_dtype dt, int64_t M, int64_t K, int64_t N,
                                mt_tensor *y, mt_tensor *y64, double acc) {
    double *yv = mt_test_values(y), *rv = mt_test_values(y64);
    double rel = dt == MT_F16 ? 0x1p-11 : 0x1p-8;
    for (int64_t i = 0; i < M * N; i++) {
        double err = fabs(yv[i] - rv[i]);
        if (err > rel * fabs(rv[i]) + acc + 1e-7)
            fail_msg("%s%s %lldx%lldx%lld element %lld: %.8g vs %.8g", what, mt_dtype_name(dt),
                     (long long)M, (long long)K, (long long)N, (long long)i, yv[i], rv[i]);
    }
    free(yv);
    free(rv);
}

/* Low precision over several FP32 panels in M, N and K, against an F64 reference with an
   error bound of one rounding of the output plus FP32 accumulation. */
static void check_low_vs_f64(mt_dtype dt, int64_t M, int64_t K, int64_t N, bool transpose_b) {
    mt_tensor *a = make(dt, MT_SHAPE(M, K));
    mt_tensor *braw = transpose_b ? make(dt, MT_SHAPE(N, K)) : make(dt, MT_SHAPE(K, N));
    mt_tensor *b = transpose_b ? mt_transpose(braw, 0, 1) : mt_retain(braw);
    mt_tensor *a64 = mt_cast(a, MT_F64), *b64 = mt_cast(b, MT_F64);
    mt_tensor *y = mt_matmul(a, b), *y64 = mt_matmul(a64, b64);
    assert_no_error();
    assert_int_equal(mt_dtype_of(y), dt);
    /* FP32 accumulation of terms of magnitude <= 1 */
    assert_rounded_once("", dt, M, K, N, y, y64, (double)K * 0x1p-23);
    mt_tensor *rel_[] = {a, braw, b, a64, b64, y, y64};
    for (size_t i = 0; i < 7; i++) mt_release(rel_[i]);
}

static void test_low_precision_panels(void **state) {
    (void)state;
    check_low_vs_f64(MT_F16, 300, 700, 530, false);
    check_low_vs_f64(MT_BF16, 300, 700, 530, true);
    check_low_vs_f64(MT_F16, 3, 5000, 2, false); /* K split into blocks */
    check_low_vs_f64(MT_BF16, 2, 4500, 700, true);
    check_low_vs_f64(MT_F16, 1500, 40, 1500, true);   /* output tile bounded */
    check_low_vs_f64(MT_BF16, 1200, 300, 100, false); /* a shared in panels, b split */
    check_low_vs_f64(MT_F16, 1, 3000, 900, true);     /* one row: split along N */
}

/* The same bound for mt_linear (with a bias: on CUDA the cuBLASLt GEMM with the BIAS
   epilogue, whose split-K partial sums must not be reduced in FP16/BF16 either). */
static void check_linear_low_vs_f64(mt_dtype dt, int64_t M, int64_t K, int64_t N) {
    mt_tensor *x = make(dt, MT_SHAPE(M, K)), *w = make(dt, MT_SHAPE(N, K)),
              *b = make(dt, MT_SHAPE(N));
    mt_tensor *x64 = mt_cast(x, MT_F64), *w64 = mt_cast(w, MT_F64), *b64 = mt_cast(b, MT_F64);
    mt_tensor *y = mt_linear(x, w, b), *y64 = mt_linear(x64, w64, b64);
    assert_no_error();
    assert_int_equal(mt_dtype_of(y), dt);
    /* FP32 accumulation, the bias included */
    assert_rounded_once("linear ", dt, M, K, N, y, y64, (double)(K + 1) * 0x1p-23);
    mt_tensor *rel_[] = {x, w, b, x64, w64, b64, y, y64};
    for (size_t i = 0; i < 8; i++) mt_release(rel_[i]);
}

static void test_low_precision_linear(void **state) {
    (void)state;
    check_linear_low_vs_f64(MT_F16, 200, 700, 130);
    check_linear_low_vs_f64(MT_BF16, 130, 600, 200);
}

static void test_long_dot_f16(void **state) {
    (void)state;
    int64_t K = 6000;
    mt_tensor *a = make(MT_F16, MT_SHAPE(K)), *b = make(MT_F16, MT_SHAPE(K));
    double *av = mt_test_values(a), *bv = mt_test_values(b), s = 0;
    for (int64_t i = 0; i < K; i++) s += av[i] * bv[i];
    mt_tensor *y = mt_matmul(a, b);
    assert_int_equal(mt_ndim(y), 0);
    assert_tensor_close(y, &s, 1, 1e-3, 2e-3);
    mt_release(y);
    mt_release(a);
    mt_release(b);
    free(av);
    free(bv);
}

/* Weight gradients summed over many batch entries, in F16/BF16, where the operand layout
   keeps the batch from merging into one contraction (a transposed sequence-first input) or
   only part of the batch is summed (a broadcast operand): the sum is accumulated in F32 and
   rounded once. Rounded after each entry it stops growing at 2048 (F16) or 256 (BF16). */
static void test_low_precision_batch_reduced_grads(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    const mt_dtype dts[2] = {MT_F16, MT_BF16};
    for (int d = 0; d < 2; d++) {
        mt_dtype dt = dts[d];
        mt_scope_begin();
        /* the whole batch summed: x [2, 4096, 3] seen as [4096, 2, 3] */
        mt_tensor *x = mt_transpose(mt_ones(MT_SHAPE(2, 4096, 3), dt, dev), 0, 1);
        mt_tensor *w = mt_ones(MT_SHAPE(5, 3), dt, dev);
        mt_set_requires_grad(w, true);
        mt_tensor *y = mt_linear(x, w, NULL);
        assert_int_equal(mt_backward(y, mt_ones_like(y)), 0);
        double full[15];
        for (int i = 0; i < 15; i++) full[i] = 8192;
        assert_tensor_close(mt_grad(w), full, 15, 0, 0);
        mt_tensor *m = mt_ones(MT_SHAPE(3, 2), dt, dev);
        mt_set_requires_grad(m, true);
        y = mt_matmul(x, m);
        assert_int_equal(mt_backward(y, mt_ones_like(y)), 0);
        assert_tensor_close(mt_grad(m), full, 6, 0, 0);
        /* part of the batch summed: b [2, 1, 1] broadcast over a [4096, 2, 1, 1] */
        mt_tensor *a = mt_ones(MT_SHAPE(4096, 2, 1, 1), dt, dev);
        mt_tensor *b = mt_ones(MT_SHAPE(2, 1, 1), dt, dev);
        mt_set_requires_grad(b, true);
        y = mt_matmul(a, b);
        assert_int_equal(mt_backward(y, mt_ones_like(y)), 0);
        double part[2] = {4096, 4096};
        assert_tensor_close(mt_grad(b), part, 2, 0, 0);
        mt_scope_end();
    }
}

/* ---- linear against loops */
static void check_linear(mt_dtype dt, int nx, const int64_t *xs, int64_t out, bool bias,
                         bool transposed_w) {
    int64_t in = xs[nx - 1];
    mt_tensor *x = make(dt, nx, xs);
    mt_tensor *wraw = transposed_w ? make(dt, MT_SHAPE(in, out)) : make(dt, MT_SHAPE(out, in));
    mt_tensor *w = transposed_w ? mt_transpose(wraw, 0, 1) : mt_retain(wraw);
    mt_tensor *b = bias ? make(dt, MT_SHAPE(out)) : NULL;
    double *xv = mt_test_values(x), *wv = mt_test_values(w), *bv = b ? mt_test_values(b) : NULL;
    int64_t rows = numel_of(nx, xs) / in;
    double *ref = malloc((size_t)(rows * out) * sizeof *ref);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = bv ? bv[o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += xv[r * in + i] * wv[o * in + i];
            ref[r * out + o] = s;
        }
    mt_tensor *y = mt_linear(x, w, b);
    assert_no_error();
    int64_t ys[MT_MAX_DIMS];
    memcpy(ys, xs, (size_t)nx * sizeof *ys);
    ys[nx - 1] = out;
    mt_test_assert_shape(y, nx, ys, __FILE__, __LINE__);
    assert_int_equal(mt_dtype_of(y), dt);
    double atol, rtol;
    tol_for(dt, &atol, &rtol);
    assert_tensor_close(y, ref, rows * out, atol * 4, rtol);
    mt_release(y);
    mt_release(x);
    mt_release(wraw);
    mt_release(w);
    mt_release(b);
    free(xv);
    free(wv);
    free(bv);
    free(ref);
}

static void test_linear_reference(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    for (size_t d = 0; d < 4; d++) {
        check_linear(dts[d], MT_SHAPE(4, 6), 5, true, false);
        check_linear(dts[d], MT_SHAPE(4, 6), 5, false, false);
        check_linear(dts[d], MT_SHAPE(2, 3, 6), 5, true, false);
        check_linear(dts[d], MT_SHAPE(6), 5, true, false);
        check_linear(dts[d], MT_SHAPE(3, 6), 5, true, true);       /* W itself transposed */
        check_linear(dts[d], MT_SHAPE(70, 300), 200, true, false); /* several panels */
    }
}

/* ---- gradients in F64 */
typedef struct {
    bool ta; /* transpose input 0 (last two dims) inside fn */
} mm_ctx;

static mt_tensor *fn_matmul(mt_tensor *const *in, void *vctx) {
    mm_ctx *c = vctx;
    mt_tensor *a = in[0];
    if (c && c->ta) a = mt_transpose(a, -1, -2);
    return mt_matmul(a, in[1]);
}

static void gradcheck_mm(int na, const int64_t *sa, int nb, const int64_t *sb, bool ta) {
    mt_tensor *in[2] = {make_grad(na, sa), make_grad(nb, sb)};
    mm_ctx c = {ta};
    int rc = mt_gradcheck(fn_matmul, in, 2, &c, NULL);
    if (rc) fail_msg("gradcheck: %s", mt_last_error());
    mt_release(in[0]);
    mt_release(in[1]);
}

static void test_matmul_gradcheck(void **state) {
    (void)state;
    gradcheck_mm(MT_SHAPE(3, 4), MT_SHAPE(4, 2), false);
    gradcheck_mm(MT_SHAPE(4, 3), MT_SHAPE(4, 2), true);           /* transposed a */
    gradcheck_mm(MT_SHAPE(4), MT_SHAPE(4), false);                /* dot */
    gradcheck_mm(MT_SHAPE(4), MT_SHAPE(4, 3), false);             /* vector @ matrix */
    gradcheck_mm(MT_SHAPE(3, 4), MT_SHAPE(4), false);             /* matrix @ vector */
    gradcheck_mm(MT_SHAPE(4), MT_SHAPE(2, 4, 3), false);          /* vector @ batch */
    gradcheck_mm(MT_SHAPE(2, 3, 4), MT_SHAPE(4), false);          /* batch @ vector */
    gradcheck_mm(MT_SHAPE(2, 3, 4), MT_SHAPE(4, 2), false);       /* dB sums over the batch */
    gradcheck_mm(MT_SHAPE(3, 4), MT_SHAPE(2, 4, 2), false);       /* dA sums over the batch */
    gradcheck_mm(MT_SHAPE(2, 1, 3, 4), MT_SHAPE(3, 4, 2), false); /* both broadcast */
    gradcheck_mm(MT_SHAPE(2, 4, 3), MT_SHAPE(2, 4, 2), true);     /* bmm, transposed a */
}

typedef struct {
    bool bias;
} lin_ctx;

static mt_tensor *fn_linear(mt_tensor *const *in, void *vctx) {
    lin_ctx *c = vctx;
    return mt_linear(in[0], in[1], c->bias ? in[2] : NULL);
}

static void gradcheck_linear(int nx, const int64_t *xs, int64_t out, bool bias) {
    int64_t in_f = xs[nx - 1];
    mt_tensor *in[3] = {make_grad(nx, xs), make_grad(MT_SHAPE(out, in_f)),
                        bias ? make_grad(MT_SHAPE(out)) : NULL};
    lin_ctx c = {bias};
    int rc = mt_gradcheck(fn_linear, in, bias ? 3 : 2, &c, NULL);
    if (rc) fail_msg("gradcheck: %s", mt_last_error());
    for (int i = 0; i < 3; i++) mt_release(in[i]);
}

static void test_linear_gradcheck(void **state) {
    (void)state;
    gradcheck_linear(MT_SHAPE(3, 4), 5, true);
    gradcheck_linear(MT_SHAPE(3, 4), 5, false);
    gradcheck_linear(MT_SHAPE(2, 3, 4), 5, true); /* 3-D input: dW over all rows */
    gradcheck_linear(MT_SHAPE(4), 3, true);       /* 1-D input */
}

/* Gradients of a non-contiguous upstream gradient and of only some inputs. */
static void test_linear_grad_values(void **state) {
    (void)state;
    /* y = x W^T + b; loss = sum(y * c): dW = c^T x, db = sum_rows c, dx = c W */
    mt_tensor *x = make(MT_F32, MT_SHAPE(2, 3, 4)), *w = make(MT_F32, MT_SHAPE(5, 4));
    mt_tensor *b = make(MT_F32, MT_SHAPE(5)), *cc = make(MT_F32, MT_SHAPE(2, 3, 5));
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_tensor *y = mt_linear(x, w, b);
    assert_string_equal(mt_grad_fn_name(y), "linear");
    assert_int_equal(mt_backward(y, cc), 0);
    double *xv = mt_test_values(x), *cv = mt_test_values(cc);
    double dw[20] = {0}, db[5] = {0};
    for (int r = 0; r < 6; r++)
        for (int o = 0; o < 5; o++) {
            db[o] += cv[r * 5 + o];
            for (int i = 0; i < 4; i++) dw[o * 4 + i] += cv[r * 5 + o] * xv[r * 4 + i];
        }
    mt_tensor *gw = mt_grad(w), *gb = mt_grad(b), *gx = mt_grad(x);
    assert_null(gx);
    assert_shape(gw, 5, 4);
    assert_shape(gb, 5);
    assert_tensor_close(gw, dw, 20, 1e-5, 1e-5);
    assert_tensor_close(gb, db, 5, 1e-5, 1e-5);
    mt_tensor *rel[] = {x, w, b, cc, y, gw, gb};
    for (size_t i = 0; i < 7; i++) mt_release(rel[i]);
    free(xv);
    free(cv);
}

/* ---- autocast */
static void test_autocast_matmul(void **state) {
    (void)state;
    const mt_dtype lows[] = {MT_F16, MT_BF16};
    for (int l = 0; l < 2; l++) {
        mt_tensor *a = make(MT_F32, MT_SHAPE(4, 3)), *w = make(MT_F32, MT_SHAPE(3, 5));
        mt_set_requires_grad(w, true);
        mt_autocast_begin(lows[l], MT_AMP_O1);
        mt_tensor *y = mt_matmul(a, w);
        assert_non_null(y);
        assert_int_equal(mt_dtype_of(y), lows[l]);
        mt_tensor *loss = mt_sum_all(y);
        mt_autocast_end();
        assert_int_equal(mt_backward(loss, NULL), 0);
        mt_tensor *g = mt_grad(w);
        assert_non_null(g);
        assert_int_equal(mt_dtype_of(g), MT_F32);
        /* d sum(a @ w) / dw[k, n] = sum_m a[m, k] (a rounded to the low dtype) */
        mt_tensor *al = mt_cast(a, lows[l]);
        double *av = mt_test_values(al), ref[15];
        for (int k = 0; k < 3; k++)
            for (int n = 0; n < 5; n++) {
                ref[k * 5 + n] = 0;
                for (int m = 0; m < 4; m++) ref[k * 5 + n] += av[m * 3 + k];
            }
        assert_tensor_close(g, ref, 15, 1e-2, 1e-2);
        free(av);
        mt_tensor *rel[] = {a, w, y, loss, g, al};
        for (size_t i = 0; i < 6; i++) mt_release(rel[i]);
    }
    assert_no_error();
}

static void test_autocast_linear(void **state) {
    (void)state;
    mt_tensor *x = make(MT_F32, MT_SHAPE(6, 4)), *w = make(MT_F32, MT_SHAPE(3, 4));
    mt_tensor *b = make(MT_F32, MT_SHAPE(3));
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *y = mt_linear(x, w, b);
    assert_int_equal(mt_dtype_of(y), MT_F16);
    mt_tensor *loss = mt_sum_all(y);
    mt_autocast_end();
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_tensor *gw = mt_grad(w), *gb = mt_grad(b);
    assert_int_equal(mt_dtype_of(gw), MT_F32);
    assert_int_equal(mt_dtype_of(gb), MT_F32);
    double ones6[3] = {6, 6, 6};
    assert_tensor_close(gb, ones6, 3, 0, 0);
    mt_tensor *rel[] = {x, w, b, y, loss, gw, gb};
    for (size_t i = 0; i < 7; i++) mt_release(rel[i]);
    /* outside the region the same call computes in F32 */
    assert_int_equal(mt_autocast_compute_dtype("matmul", MT_F32), MT_F32);
    assert_no_error();
}

/* F64 beats F32 beats the low dtypes by promotion, outside autocast. */
static void test_promotion(void **state) {
    (void)state;
    mt_tensor *a = make(MT_F32, MT_SHAPE(2, 3)), *b = make(MT_F64, MT_SHAPE(3, 2));
    mt_tensor *h = make(MT_F16, MT_SHAPE(3, 2));
    mt_tensor *y = mt_matmul(a, b), *z = mt_matmul(a, h);
    assert_int_equal(mt_dtype_of(y), MT_F64);
    assert_int_equal(mt_dtype_of(z), MT_F32);
    mt_tensor *rel[] = {a, b, h, y, z};
    for (size_t i = 0; i < 5; i++) mt_release(rel[i]);
}

/* ---- errors */
static void test_errors(void **state) {
    (void)state;
    mt_tensor *a = make(MT_F32, MT_SHAPE(3, 4)), *b = make(MT_F32, MT_SHAPE(5, 6));
    assert_null(mt_matmul(a, b));
    assert_error(MT_ERR_SHAPE, "mt_matmul: arg 2: shape [5, 6] cannot multiply [3, 4]");
    assert_null(mt_matmul(NULL, b));
    assert_int_equal(mt_last_status(), MT_OK);
    assert_null(mt_matmul(a, NULL));
    assert_int_equal(mt_last_status(), MT_OK);

    mt_tensor *s = mt_scalar(2.0, MT_F32, mt_test_device());
    assert_null(mt_matmul(s, a));
    assert_error(MT_ERR_SHAPE, "mt_matmul: arg 1: expected a tensor with at least 1 dim");
    assert_null(mt_matmul(a, s));
    assert_error(MT_ERR_SHAPE, "mt_matmul: arg 2");

    mt_tensor *i64 = mt_zeros(MT_SHAPE(4, 2), MT_I64, mt_test_device());
    assert_null(mt_matmul(a, i64));
    assert_error(MT_ERR_DTYPE, "mt_matmul: arg 2: dtype i64");

    mt_tensor *p = make(MT_F32, MT_SHAPE(2, 3, 4)), *q = make(MT_F32, MT_SHAPE(3, 4, 5));
    assert_null(mt_matmul(p, q));
    assert_error(MT_ERR_SHAPE, "batch dims of [2, 3, 4] and [3, 4, 5] do not broadcast");
    mt_tensor *v = make(MT_F32, MT_SHAPE(5));
    assert_null(mt_matmul(a, v));
    assert_error(MT_ERR_SHAPE, "mt_matmul: arg 2: shape [5] cannot multiply [3, 4]");

    /* linear */
    mt_tensor *w = make(MT_F32, MT_SHAPE(2, 4)), *bias = make(MT_F32, MT_SHAPE(3));
    assert_null(mt_linear(a, b, NULL));
    assert_error(MT_ERR_SHAPE, "mt_linear: arg 2: weight [5, 6] cannot multiply input [3, 4]");
    assert_null(mt_linear(a, v, NULL));
    assert_error(MT_ERR_SHAPE, "mt_linear: arg 2: weight must be 2-D");
    assert_null(mt_linear(a, w, bias));
    assert_error(MT_ERR_SHAPE, "mt_linear: arg 3: bias of shape [3] does not fit weight [2, 4]");
    assert_null(mt_linear(s, w, NULL));
    assert_error(MT_ERR_SHAPE, "mt_linear: arg 1: input must have at least 1 dim");
    assert_null(mt_linear(a, i64, NULL));
    assert_error(MT_ERR_DTYPE, "mt_linear: arg 2: dtype i64");
    mt_tensor *ib = mt_zeros(MT_SHAPE(2), MT_I32, mt_test_device());
    assert_null(mt_linear(a, w, ib));
    assert_error(MT_ERR_DTYPE, "mt_linear: arg 3");
    assert_null(mt_linear(NULL, w, NULL));
    assert_null(mt_linear(a, NULL, NULL));
    assert_int_equal(mt_last_status(), MT_OK);

    mt_tensor *rel[] = {a, b, s, i64, p, q, v, w, bias, ib};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) mt_release(rel[i]);
}

static void test_out_of_memory(void **state) {
    (void)state;
    mt_tensor *a = make(MT_F32, MT_SHAPE(64, 64)), *b = make(MT_F32, MT_SHAPE(64, 64));
    mt_debug_set_alloc_limit(1024);
    assert_null(mt_matmul(a, b));
    mt_debug_set_alloc_limit(0);
    assert_error(MT_ERR_OOM, "mt_matmul");
    /* the output fits, the FP32 panels of the CPU's low-precision path do not (a GPU runs
       F16 operands on tensor cores directly: no panels, and the product succeeds) */
    mt_tensor *h = make(MT_F16, MT_SHAPE(300, 700)), *k = make(MT_F16, MT_SHAPE(700, 530));
    mt_debug_set_alloc_limit(400000);
    mt_tensor *hk = mt_matmul(h, k);
    mt_debug_set_alloc_limit(0);
    if (mt_device_of(h).type == MT_DEVICE_CPU) {
        assert_null(hk);
        assert_error(MT_ERR_OOM, "panels");
    } else {
        assert_non_null(hk);
        mt_release(hk);
    }
    /* a weight gradient that cannot be allocated fails the backward cleanly */
    mt_tensor *w = make(MT_F32, MT_SHAPE(64, 64));
    mt_set_requires_grad(w, true);
    mt_tensor *y = mt_linear(a, w, NULL);
    mt_tensor *g = mt_ones_like(y);
    mt_debug_set_alloc_limit(1024);
    assert_true(mt_backward(y, g) < 0);
    mt_debug_set_alloc_limit(0);
    assert_error(MT_ERR_OOM, "mt_linear");
    mt_tensor *rel[] = {a, b, h, k, w, y, g};
    for (size_t i = 0; i < 7; i++) mt_release(rel[i]);
}

/* Inside a scope the results belong to the scope; the tape survives mt_scope_end. */
static void test_scope_and_tape(void **state) {
    (void)state;
    mt_tensor *w = make(MT_F64, MT_SHAPE(3, 2));
    mt_set_requires_grad(w, true);
    mt_tensor *x = make(MT_F64, MT_SHAPE(4, 3)), *loss;
    mt_scope_begin();
    mt_tensor *y = mt_matmul(x, w);
    loss = mt_retain(mt_sum_all(y));
    mt_scope_end();
    mt_release(x);
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_tensor *g = mt_grad(w);
    assert_shape(g, 3, 2);
    mt_release(g);
    mt_release(loss);
    mt_release(w);
}

/* Zero-size operands as torch: [3,5]@[5,0] is a [3,0] result, a [0,5] linear weight gives
   [3,0], and the backward of [3,0]@[0,4] (K = 0: the product is all zeros) gives zero-size
   and zero gradients. A fresh zero-size tensor counts as contiguous. */
static void test_zero_size_operands(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_tensor *a = mt_ones(MT_SHAPE(3, 5), MT_F32, dev), *b = mt_ones(MT_SHAPE(5, 0), MT_F32, dev);
    assert_true(mt_is_contiguous(b));
    mt_tensor *c = mt_matmul(a, b);
    assert_shape(c, 3, 0);
    mt_tensor *w = mt_ones(MT_SHAPE(0, 5), MT_F32, dev);
    mt_tensor *l = mt_linear(a, w, NULL);
    assert_shape(l, 3, 0);
    mt_tensor *x = mt_ones(MT_SHAPE(3, 0), MT_F32, dev), *y = mt_ones(MT_SHAPE(0, 4), MT_F32, dev);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(y, true);
    mt_tensor *z = mt_matmul(x, y), *s = mt_sum_all(z);
    assert_tensor_close(z, ((const double[12]){0}), 12, 0, 0);
    assert_int_equal(mt_backward(s, NULL), 0);
    mt_tensor *gx = mt_grad(x), *gy = mt_grad(y);
    assert_shape(gx, 3, 0);
    assert_shape(gy, 0, 4);
    assert_no_error();
    mt_tensor *rel[] = {a, b, c, w, l, x, y, z, s, gx, gy};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) mt_release(rel[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_cases_all_dtypes),
        MT_TEST(test_k_zero_gives_zeros),
        MT_TEST(test_noncontiguous),
        MT_TEST(test_many_small_batches),
        MT_TEST(test_low_precision_panels),
        MT_TEST(test_low_precision_linear),
        MT_TEST(test_long_dot_f16),
        MT_TEST(test_low_precision_batch_reduced_grads),
        MT_TEST(test_linear_reference),
        MT_TEST(test_matmul_gradcheck),
        MT_TEST(test_linear_gradcheck),
        MT_TEST(test_linear_grad_values),
        MT_TEST(test_autocast_matmul),
        MT_TEST(test_autocast_linear),
        MT_TEST(test_promotion),
        MT_TEST(test_errors),
        MT_TEST(test_out_of_memory),
        MT_TEST(test_zero_size_operands),
        MT_TEST(test_scope_and_tape),
    };
    return MT_RUN_TESTS(tests);
}

/* The cache of cuBLASLt plans behind the fused linear on CUDA (src/cuda/lt_plan_cache.c), on
   the emulated device: built only in emulated builds, where the fake cuBLASLt counts its
   calls (test/cuda_emu/mtemu_cublaslt_counts.h). Repeated calls give the bits of the first
   (uncached) call and ask the heuristic once per distinct key; operands of other alignments
   get their own plan; "no algorithm" is cached and still falls back; the least recently used
   plan is evicted past the capacity (a plain matmul's new shape evicts nothing: it takes
   cuBLAS); every cuBLASLt object of a dropped plan is destroyed; a failed create caches
   nothing and leaks nothing. */
#include <pthread.h>
#include "mtemu_cublaslt_counts.h"
#include "test_util.h"

/* Test hooks of the CUDA backend (src/cuda/cuda_impl.h, which needs the toolkit's headers). */
int mt_cuda_lt_plans_clear(int device);
int mt_cuda_lt_plans_count(int device);
#define PLAN_CAP 64 /* MT_LT_PLAN_CAP */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static mt_tensor *make(mt_dtype dt, int nd, const int64_t *shape) {
    return mt_test_uniform(&rng_state, dt, nd, shape, 0.0);
}

static int dev(void) {
    return mt_test_device().index;
}

static mtemu_cublaslt_counts counts(void) {
    mtemu_cublaslt_counts c;
    mtemu_cublaslt_counts_get(&c);
    return c;
}

static void clear_plans(void) {
    assert_true(mt_cuda_lt_plans_clear(dev()) >= 0);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 0);
    assert_int_equal(counts().live, 0); /* every object of every plan destroyed */
}

/* y = act(x @ w^T + b) for x [rows, in]; its values (exact doubles of the dtype's bits). */
static double *run(mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_activation act) {
    mt_tensor *y = mt_linear_act(x, w, b, act);
    assert_no_error();
    assert_on_test_device(y);
    double *v = mt_test_values(y);
    mt_release(y);
    return v;
}

/* Repeated calls: the bits of the first call, made with a fresh plan; no heuristic, no
   create after the first; the per-call cuBLASLt calls shown for the report. */
static void test_repeat_bit_identical(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F16, MT_BF16, MT_F32};
    const mt_activation acts[] = {MT_ACT_NONE, MT_ACT_RELU, MT_ACT_GELU_TANH};
    for (int d = 0; d < 3; d++)
        for (int a = 0; a < 3; a++) {
            clear_plans();
            mt_tensor *x = make(dts[d], MT_SHAPE(16, 32)), *w = make(dts[d], MT_SHAPE(24, 32));
            mt_tensor *b = make(dts[d], MT_SHAPE(24));
            mtemu_cublaslt_counts c0 = counts();
            double *first = run(x, w, b, acts[a]);
            mtemu_cublaslt_counts c1 = counts();
            assert_int_equal(c1.heuristics - c0.heuristics, 1);
            assert_int_equal(c1.matmuls - c0.matmuls, 1);
            assert_int_equal(mt_cuda_lt_plans_count(dev()), 1);
            for (int rep = 0; rep < 4; rep++) {
                double *again = run(x, w, b, acts[a]);
                assert_memory_equal(again, first, 16 * 24 * sizeof *first);
                free(again);
            }
            mtemu_cublaslt_counts c2 = counts();
            assert_int_equal(c2.heuristics, c1.heuristics);
            assert_int_equal(c2.creates, c1.creates);
            assert_int_equal(c2.matmuls - c1.matmuls, 4);
            assert_int_equal(c2.sets - c1.sets, 4); /* the bias pointer, per call */
            if (d == 0 && a == 1)
                print_message("# F16 RELU+bias per call, cuBLASLt calls: first (miss) %lld "
                              "creates, %lld sets, %lld heuristics, %lld matmuls; cached %lld "
                              "creates, %lld sets, %lld heuristics, %lld matmuls\n",
                              (long long)(c1.creates - c0.creates), (long long)(c1.sets - c0.sets),
                              (long long)(c1.heuristics - c0.heuristics),
                              (long long)(c1.matmuls - c0.matmuls),
                              (long long)(c2.creates - c1.creates) / 4,
                              (long long)(c2.sets - c1.sets) / 4,
                              (long long)(c2.heuristics - c1.heuristics) / 4,
                              (long long)(c2.matmuls - c1.matmuls) / 4);
            mt_cuda_lt_plans_clear(dev()); /* the same call again, uncached */
            double *fresh = run(x, w, b, acts[a]);
            assert_memory_equal(fresh, first, 16 * 24 * sizeof *first);
            assert_int_equal(counts().heuristics - c2.heuristics, 1);
            free(fresh);
            free(first);
            mt_release(x);
            mt_release(w);
            mt_release(b);
        }
}

/* Operands only as aligned as one row (views from row 1) get a plan of their own, whose
   algorithm assumes no more; the aligned operands' plan is still used for them. */
static void test_alignment_keys(void **state) {
    (void)state;
    clear_plans();
    mt_tensor *xraw = make(MT_F16, MT_SHAPE(9, 6)), *w = make(MT_F16, MT_SHAPE(8, 6));
    mt_tensor *b = make(MT_F16, MT_SHAPE(8));
    mt_tensor *x = mt_narrow(xraw, 0, 1, 8), *xa = mt_narrow(xraw, 0, 0, 8); /* 12 bytes off */
    mtemu_cublaslt_counts c0 = counts();
    double *ya = run(xa, w, b, MT_ACT_RELU);
    double *ys = run(x, w, b, MT_ACT_RELU);
    assert_int_equal(counts().heuristics - c0.heuristics, 2);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 2);
    for (int rep = 0; rep < 2; rep++) { /* each its own plan again: no new heuristic */
        double *va = run(xa, w, b, MT_ACT_RELU), *vs = run(x, w, b, MT_ACT_RELU);
        assert_memory_equal(va, ya, 8 * 8 * sizeof *va);
        assert_memory_equal(vs, ys, 8 * 8 * sizeof *vs);
        free(va);
        free(vs);
    }
    assert_int_equal(counts().heuristics - c0.heuristics, 2);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 2);
    /* the sliced rows are the aligned ones' rows 1..8 */
    double *ref = run(xraw, w, b, MT_ACT_RELU);
    assert_memory_equal(ys, ref + 8, 8 * 8 * sizeof *ys);
    free(ref);
    free(ya);
    free(ys);
    mt_release(x);
    mt_release(xa);
    mt_release(xraw);
    mt_release(w);
    mt_release(b);
}

/* cuBLASLt without an algorithm: the fallback's results, the heuristic asked once, nothing
   run on cuBLASLt, and no cuBLASLt object kept for the plan. */
static void test_no_algo_cached(void **state) {
    (void)state;
    clear_plans();
    mt_tensor *x = make(MT_F32, MT_SHAPE(5, 7)), *w = make(MT_F32, MT_SHAPE(3, 7));
    mt_tensor *b = make(MT_F32, MT_SHAPE(3));
    double *with_lt = run(x, w, b, MT_ACT_RELU);
    clear_plans();
    assert_int_equal(setenv("MTEMU_CUBLASLT_NO_ALGO", "1", 1), 0);
    mtemu_cublaslt_counts c0 = counts();
    for (int rep = 0; rep < 3; rep++) {
        double *v = run(x, w, b, MT_ACT_RELU);
        for (int i = 0; i < 15; i++) assert_true(fabs(v[i] - with_lt[i]) <= 1e-5);
        free(v);
    }
    mtemu_cublaslt_counts c1 = counts();
    assert_int_equal(unsetenv("MTEMU_CUBLASLT_NO_ALGO"), 0);
    assert_int_equal(c1.heuristics - c0.heuristics, 1);
    assert_int_equal(c1.matmuls, c0.matmuls);
    assert_int_equal(c1.live, 0);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 1);
    clear_plans();
    free(with_lt);
    mt_release(x);
    mt_release(w);
    mt_release(b);
}

/* Past the capacity the least recently used plan goes (its objects destroyed): the count
   stays at the capacity, the first key is asked again, a recent one is not. */
/* c = a @ b for a [3, 5], b [5, 2] in F32 against the product in double. */
static void check_plain_matmul(void) {
    mt_tensor *a = make(MT_F32, MT_SHAPE(3, 5)), *b = make(MT_F32, MT_SHAPE(5, 2));
    mt_tensor *c = mt_matmul(a, b);
    assert_no_error();
    double *va = mt_test_values(a), *vb = mt_test_values(b), *vc = mt_test_values(c);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double ref = 0;
            for (int k = 0; k < 5; k++) ref += va[i * 5 + k] * vb[k * 2 + j];
            if (fabs(vc[i * 2 + j] - ref) > 1e-6 * (1 + fabs(ref)))
                fail_msg("c[%d][%d] = %g, expected %g", i, j, vc[i * 2 + j], ref);
        }
    free(va);
    free(vb);
    free(vc);
    mt_release(a);
    mt_release(b);
    mt_release(c);
}

static void test_eviction(void **state) {
    (void)state;
    clear_plans();
    const int n = PLAN_CAP + 6;
    mt_tensor *x = make(MT_F16, MT_SHAPE(4, n)), *w = make(MT_F16, MT_SHAPE(2, n));
    mtemu_cublaslt_counts c0 = counts();
    for (int k = 1; k <= n; k++) { /* K = k: a key each */
        mt_tensor *xk = mt_narrow(x, 1, 0, k), *wk = mt_narrow(w, 1, 0, k);
        mt_tensor *y = mt_linear_act(xk, wk, NULL, MT_ACT_NONE);
        assert_no_error();
        mt_release(y);
        if (k == PLAN_CAP + 2) { /* K = 1 and 2 evicted by now; K = 3 used again: kept */
            mt_tensor *x3 = mt_narrow(x, 1, 0, 3), *w3 = mt_narrow(w, 1, 0, 3);
            mt_release(mt_linear_act(x3, w3, NULL, MT_ACT_NONE));
            mt_release(x3);
            mt_release(w3);
        }
        mt_release(xk);
        mt_release(wk);
    }
    mtemu_cublaslt_counts c1 = counts();
    assert_int_equal(c1.heuristics - c0.heuristics, n);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), PLAN_CAP);
    assert_int_equal(c1.live, 5 * PLAN_CAP); /* desc, 3 layouts and a preference each */
    const int64_t again[] = {3, n, 1}, asked[] = {0, 0, 1};
    for (int i = 0; i < 3; i++) {
        mt_tensor *xk = mt_narrow(x, 1, 0, again[i]), *wk = mt_narrow(w, 1, 0, again[i]);
        int64_t h = counts().heuristics;
        mt_release(mt_linear_act(xk, wk, NULL, MT_ACT_NONE));
        assert_no_error();
        assert_int_equal(counts().heuristics - h, asked[i]);
        mt_release(xk);
        mt_release(wk);
    }
    assert_int_equal(mt_cuda_lt_plans_count(dev()), PLAN_CAP);
    /* a plain matmul of a new shape in the full cache evicts nothing and asks nothing: it
       takes cublasGemmEx; in an empty cache it makes its plan */
    for (int round = 0; round < 2; round++) {
        int64_t h = counts().heuristics, m = counts().matmuls;
        check_plain_matmul();
        assert_int_equal(counts().heuristics - h, round);
        assert_int_equal(counts().matmuls - m, round);
        assert_int_equal(mt_cuda_lt_plans_count(dev()), round ? 1 : PLAN_CAP);
        if (round == 0) clear_plans();
    }
    clear_plans();
    mt_release(x);
    mt_release(w);
}

/* The sum of x's gradient from y = linear_act(x, w, b) with a ones cotangent (fused or not). */
static double *grad_x(mt_tensor *x, mt_tensor *w, mt_tensor *b, bool fused) {
    mt_tensor *xl = mt_detach(x);
    mt_set_requires_grad(xl, true);
    mt_tensor *y;
    if (fused) {
        y = mt_linear_act(xl, w, b, MT_ACT_GELU_TANH);
    } else {
        mt_tensor *z = mt_linear(xl, w, b);
        y = mt_gelu_tanh(z);
        mt_release(z);
    }
    assert_non_null(y);
    mt_tensor *ones = mt_ones_like(y);
    assert_int_equal(mt_backward(y, ones), 0);
    mt_tensor *g = mt_grad(xl);
    assert_non_null(g);
    double *v = mt_test_values(g);
    mt_release(g);
    mt_release(ones);
    mt_release(y);
    mt_release(xl);
    return v;
}

/* One plan, other bias and output buffers: each call writes its own result from its own bias
   (the bias pointer is set per call, not cached; D is an argument of the matmul). GELU_TANH
   is not fused into cuBLASLt's GELU epilogue (measured up to 4 FP16 ulps off mixtape's
   formula on an H200): F32 takes the BIAS epilogue, then mixtape's gelu_tanh kernel. So
   training, which keeps the pre-activation, makes the pre-activation the matmul's D and
   shares the plan of inference (no aux matrix): one pointer set per call either way. */
static void test_pointers_per_call(void **state) {
    (void)state;
    clear_plans();
    mt_tensor *w = make(MT_F32, MT_SHAPE(16, 8)), *x[2], *b[2];
    for (int i = 0; i < 2; i++) {
        x[i] = make(MT_F32, MT_SHAPE(4, 8));
        b[i] = make(MT_F32, MT_SHAPE(16));
    }
    double *fused[2];
    mtemu_cublaslt_counts c0 = counts();
    for (int i = 0; i < 2; i++) fused[i] = grad_x(x[i], w, b[i], true);
    mtemu_cublaslt_counts c1 = counts();
    /* two plans: the forward's (bias epilogue) and the backward's plain dx = dy @ w; the
       second call hits both */
    assert_int_equal(c1.heuristics - c0.heuristics, 2);
    assert_int_equal(c1.matmuls - c0.matmuls, 4);
    for (int i = 0; i < 2; i++) {
        double *ref = grad_x(x[i], w, b[i], false);
        for (int k = 0; k < 4 * 8; k++)
            if (fabs(fused[i][k] - ref[k]) > 1e-5 + 1e-5 * fabs(ref[k]))
                fail_msg("call %d element %d: fused %g, unfused %g", i, k, fused[i][k], ref[k]);
        free(ref);
        free(fused[i]);
    }
    /* a miss (11 sets: 5 on the descriptor; 6 on the preference: the workspace limit, four
       alignments and the reduction schemes), a hit (the bias pointer), a hit with grad (the
       same plan, the pre-activation as D: the bias pointer again; the backward's plain
       matmul a miss of its own, 9 sets: transposes, epilogue and the 6 preferences), then
       that again (only the bias pointer: the backward's plan has no bias) */
    clear_plans();
    int64_t sets[5], h = counts().heuristics;
    sets[0] = counts().sets;
    mt_release(mt_linear_act(x[0], w, b[0], MT_ACT_GELU_TANH)); /* no grad: no pre-activation */
    sets[1] = counts().sets;
    mt_release(mt_linear_act(x[0], w, b[0], MT_ACT_GELU_TANH));
    sets[2] = counts().sets;
    free(grad_x(x[0], w, b[0], true));
    sets[3] = counts().sets;
    free(grad_x(x[0], w, b[0], true));
    sets[4] = counts().sets;
    assert_no_error();
    assert_int_equal(counts().heuristics - h, 2);
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 2);
    assert_int_equal(sets[1] - sets[0], 11);
    assert_int_equal(sets[2] - sets[1], 1);
    assert_int_equal(sets[3] - sets[2], 1 + 9);
    assert_int_equal(sets[4] - sets[3], 1);
    print_message("# F32 GELU_TANH+bias with its pre-activation (training) cached: %lld sets "
                  "per call\n",
                  (long long)(sets[4] - sets[3]));
    clear_plans();
    for (int i = 0; i < 2; i++) {
        mt_release(x[i]);
        mt_release(b[i]);
    }
    mt_release(w);
}

/* A cuBLASLt call that fails while a plan is made (MTEMU_CUBLASLT_FAIL): a clear error naming
   the op (ALLOC_FAILED as out of memory), no result, nothing cached and no cuBLASLt object
   left; the next call makes the plan. A failure on a cached plan keeps the plan. */
static void test_failures(void **state) {
    (void)state;
    clear_plans();
    mt_tensor *x = make(MT_F16, MT_SHAPE(4, 8)), *w = make(MT_F16, MT_SHAPE(8, 8));
    mt_tensor *b = make(MT_F16, MT_SHAPE(8));
    static const char *const fails[] = {
        "cublasLtMatmulDescCreate=3",
        "cublasLtMatrixLayoutCreate=3",
        "cublasLtMatmulDescSetAttribute=3",
        "cublasLtMatmulPreferenceCreate=3",
        "cublasLtMatmulPreferenceSetAttribute=3",
        "cublasLtMatmulAlgoGetHeuristic=14",
    };
    for (size_t i = 0; i < sizeof fails / sizeof fails[0]; i++) {
        assert_int_equal(setenv("MTEMU_CUBLASLT_FAIL", fails[i], 1), 0);
        assert_null(mt_linear_act(x, w, b, MT_ACT_RELU));
        bool oom = strstr(fails[i], "=3") != NULL;
        assert_error(oom ? MT_ERR_OOM : MT_ERR_DEVICE,
                     oom ? "mt_linear: cuBLAS error CUBLAS_STATUS_ALLOC_FAILED"
                         : "mt_linear: cuBLAS error CUBLAS_STATUS_INTERNAL_ERROR");
        assert_int_equal(mt_cuda_lt_plans_count(dev()), 0);
        assert_int_equal(counts().live, 0);
    }
    assert_int_equal(setenv("MTEMU_CUBLASLT_FAIL", "cublasLtMatmul=14", 1), 0);
    assert_null(mt_linear_act(x, w, b, MT_ACT_RELU));
    assert_error(MT_ERR_DEVICE, "mt_linear: cuBLAS error CUBLAS_STATUS_INTERNAL_ERROR");
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 1); /* made before the matmul failed */
    assert_int_equal(unsetenv("MTEMU_CUBLASLT_FAIL"), 0);
    int64_t h = counts().heuristics;
    double *v = run(x, w, b, MT_ACT_RELU);
    assert_int_equal(counts().heuristics, h);
    free(v);
    clear_plans();
    mt_release(x);
    mt_release(w);
    mt_release(b);
}

/* Threads share a device's cache: four threads, two of them with the same shapes (one key),
   run their linears at once, over and over. Every result has the bits of the single-threaded
   run, and each distinct key was created and asked of the heuristic exactly once (the lock
   covers look-up, create and the queued matmul). Under ThreadSanitizer (tools/run_tests.sh's
   tsan build) this is also the cache's race test. */
typedef struct {
    mt_tensor *x, *w, *b;
    const float *want;
    int64_t n;
    int reps, failed;
} lt_thread_job;

static void *lt_thread_main(void *arg) {
    lt_thread_job *j = arg;
    float *got = malloc((size_t)j->n * sizeof *got);
    for (int r = 0; got && r < j->reps && !j->failed; r++) {
        mt_tensor *y = mt_linear_act(j->x, j->w, j->b, MT_ACT_RELU);
        if (!y || mt_copy_to_host(y, got, (size_t)j->n * sizeof *got) != 0 ||
            memcmp(got, j->want, (size_t)j->n * sizeof *got) != 0)
            j->failed = 1;
        mt_release(y);
    }
    if (!got) j->failed = 1;
    free(got);
    return NULL;
}

static void test_threads_share_plans(void **state) {
    (void)state;
    enum { THREADS = 4 };
    const int64_t rows[THREADS] = {16, 8, 12, 16}, in[THREADS] = {32, 48, 40, 32},
                  out[THREADS] = {24, 16, 20, 24}; /* threads 0 and 3: one key */
    lt_thread_job jobs[THREADS];
    float *want[THREADS];
    for (int k = 0; k < THREADS; k++) {
        mt_tensor *x = make(MT_F32, MT_SHAPE(rows[k], in[k]));
        mt_tensor *w = make(MT_F32, MT_SHAPE(out[k], in[k])), *b = make(MT_F32, MT_SHAPE(out[k]));
        int64_t n = rows[k] * out[k];
        want[k] = malloc((size_t)n * sizeof *want[k]);
        assert_non_null(want[k]);
        mt_tensor *y = mt_linear_act(x, w, b, MT_ACT_RELU);
        assert_no_error();
        assert_int_equal(mt_copy_to_host(y, want[k], (size_t)n * sizeof *want[k]), 0);
        mt_release(y);
        jobs[k] = (lt_thread_job){x, w, b, want[k], n, 25, 0};
    }
    clear_plans();
    mtemu_cublaslt_counts c0 = counts();
    pthread_t th[THREADS];
    for (int k = 0; k < THREADS; k++)
        assert_int_equal(pthread_create(&th[k], NULL, lt_thread_main, &jobs[k]), 0);
    for (int k = 0; k < THREADS; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < THREADS; k++)
        if (jobs[k].failed) fail_msg("thread %d: a result differs from the single-threaded one", k);
    mtemu_cublaslt_counts c1 = counts();
    assert_int_equal(mt_cuda_lt_plans_count(dev()), 3);
    assert_int_equal(c1.heuristics - c0.heuristics, 3);
    assert_int_equal(c1.matmuls - c0.matmuls, THREADS * 25);
    clear_plans();
    for (int k = 0; k < THREADS; k++) {
        free(want[k]);
        mt_release(jobs[k].x);
        mt_release(jobs[k].w);
        mt_release(jobs[k].b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_repeat_bit_identical), MT_TEST(test_alignment_keys),
        MT_TEST(test_no_algo_cached),       MT_TEST(test_eviction),
        MT_TEST(test_pointers_per_call),    MT_TEST(test_failures),
        MT_TEST(test_threads_share_plans),
    };
    MT_RUN_TESTS(tests);
}

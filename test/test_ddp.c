/* mt_ddp, run as every rank of the job (mpirun -np 2 from test/meson.build, and alone as a
   world of one): a W-rank run on batches of B equals a one-rank run on batches of W*B (SGD
   and AdamW, FP32 and O1 with the GradScaler, with a step that overflows on one rank only),
   bucket counts and overlap, no_sync, unused parameters, and errors. */
#include "dist_test_util.h"

#define IN  8
#define HID 16
#define OUT 4
#define B   4 /* rows per rank */
#define NP  4

typedef struct {
    mt_tensor *p[NP]; /* w1 [HID, IN], b1, w2 [OUT, HID], b2 */
} model;

static const int64_t shapes[NP][2] = {{HID, IN}, {HID, 0}, {OUT, HID}, {OUT, 0}};

static void model_init(model *m, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int k = 0; k < NP; k++) {
        int ndim = shapes[k][1] ? 2 : 1;
        int64_t n = shapes[k][0] * (ndim == 2 ? shapes[k][1] : 1);
        double v[HID * IN];
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.8;
        }
        m->p[k] = mt_from_data(v, MT_F64, ndim, shapes[k], MT_CPU);
        mt_tensor *f = mt_cast(m->p[k], MT_F32);
        mt_release(m->p[k]);
        m->p[k] = f;
        mt_set_requires_grad(f, true);
    }
}

static void model_free(model *m) {
    for (int k = 0; k < NP; k++) mt_release(m->p[k]);
}

/* rows [from, from + rows) of step's global batch; `overflow` puts a value FP16 cannot hold
   into the first row of the last rank's share */
static mt_tensor *batch_loss(model *m, int step, int from, int rows, bool overflow) {
    double x[64 * IN], y[64 * OUT];
    int W = mt_dist_world_size();
    for (int r = 0; r < rows; r++) {
        int g = from + r;
        for (int i = 0; i < IN; i++) x[r * IN + i] = sin(step * 7.0 + g * 3.0 + i);
        for (int o = 0; o < OUT; o++) y[r * OUT + o] = cos(step * 5.0 + g * 2.0 + o);
        if (overflow && g == (W - 1) * B) x[r * IN] = 1e6;
    }
    mt_tensor *xt = mt_cast(mt_from_data(x, MT_F64, MT_SHAPE(rows, IN), MT_CPU), MT_F32);
    mt_tensor *yt = mt_cast(mt_from_data(y, MT_F64, MT_SHAPE(rows, OUT), MT_CPU), MT_F32);
    mt_tensor *h = mt_tanh(mt_linear(xt, m->p[0], m->p[1]));
    return mt_mse_loss(mt_linear(h, m->p[2], m->p[3]), yt);
}

typedef struct {
    bool adamw, amp, o2; /* o2: FP16 parameters (mt_amp_decorate) with FP32 masters */
    int overflow_step;   /* -1: none */
    mt_ddp_progress progress;
    double bucket_mb; /* 0: the default (one bucket) */
} config;

/* Trains `steps` steps on rows [from, from + rows) of each global batch; with ddp, the
   gradients are averaged over the ranks before the step. Returns the skipped steps. */
static int64_t train(model *m, const config *c, int from, int rows, mt_ddp *ddp, int steps) {
    mt_optimizer *o =
        c->adamw
            ? mt_adamw_new(m->p, NP, &(mt_adam_opts){.lr = MT_SET(0.01), .multi_precision = c->o2})
            : mt_sgd_new(m->p, NP, &(mt_sgd_opts){.lr = MT_SET(0.1), .multi_precision = c->o2});
    mt_grad_scaler *s =
        c->amp ? mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024}) : NULL;
    if (s && ddp) assert_int_equal(mt_grad_scaler_set_dist(s, true), 0);
    for (int step = 0; step < steps; step++) {
        mt_scope_begin();
        mt_optimizer_zero_grad(o);
        if (c->amp) mt_autocast_begin(MT_F16, c->o2 ? MT_AMP_O2 : MT_AMP_O1);
        mt_tensor *loss = batch_loss(m, step, from, rows, step == c->overflow_step);
        if (c->amp) mt_autocast_end();
        assert_int_equal(mt_backward(s ? mt_grad_scaler_scale(s, loss) : loss, NULL), 0);
        if (ddp) assert_int_equal(mt_ddp_wait(ddp), 0);
        assert_int_equal(s ? mt_grad_scaler_minimize(s, o) : mt_optimizer_step(o), 0);
        mt_scope_end();
    }
    int64_t skipped = s ? mt_grad_scaler_skipped_steps(s) : 0;
    mt_grad_scaler_free(s);
    mt_optimizer_free(o);
    return skipped;
}

/* Every rank holds exactly the same values of t. */
static void assert_same_on_every_rank(mt_tensor *t) {
    mt_tensor *all = mt_all_gather(t);
    assert_non_null(all);
    int64_t n = mt_numel(t);
    double *v = mt_test_values(all);
    for (int r = 1; r < mt_dist_world_size(); r++)
        for (int64_t i = 0; i < n; i++) assert_true(v[r * n + i] == v[i]);
    free(v);
    mt_release(all);
}

static void check_equivalence(const config *c, double tol) {
    int W = mt_dist_world_size(), me = mt_dist_rank();
    model ref, dp;
    model_init(&ref, 1);
    model_init(&dp, 1 + (uint64_t)me); /* different on each rank: mt_ddp_new takes rank 0's */
    if (c->o2) {
        assert_int_equal(mt_amp_decorate(ref.p, NP, MT_F16, NULL), 0);
        assert_int_equal(mt_amp_decorate(dp.p, NP, MT_F16, NULL), 0);
    }
    mt_ddp *ddp =
        mt_ddp_new(dp.p, NP, &(mt_ddp_opts){.progress = c->progress, .bucket_mb = c->bucket_mb});
    assert_non_null(ddp);
    int64_t ref_skipped = train(&ref, c, 0, W * B, NULL, 4);
    int64_t dp_skipped = train(&dp, c, me * B, B, ddp, 4);
    assert_true(dp_skipped == ref_skipped);
    if (c->overflow_step >= 0) assert_true(dp_skipped == 1);
    for (int k = 0; k < NP; k++) {
        double *want = mt_test_values(ref.p[k]);
        assert_tensor_close(dp.p[k], want, mt_numel(ref.p[k]), tol, tol);
        free(want);
        assert_same_on_every_rank(dp.p[k]);
    }
    mt_ddp_free(ddp);
    model_free(&ref);
    model_free(&dp);
}

static void test_sgd_fp32(void **state) {
    (void)state;
    check_equivalence(&(config){.overflow_step = -1}, 1e-5);
}
static void test_adamw_fp32(void **state) {
    (void)state;
    check_equivalence(&(config){.adamw = true, .overflow_step = -1}, 1e-5);
}
/* O1: FP16 GEMM outputs are rounded per rank's share instead of once: FP16 tolerance */
static void test_sgd_amp_o1_one_rank_overflows(void **state) {
    (void)state;
    check_equivalence(&(config){.amp = true, .overflow_step = 1}, 2e-3);
}
static void test_adamw_amp_o1_one_rank_overflows(void **state) {
    (void)state;
    check_equivalence(&(config){.adamw = true, .amp = true, .overflow_step = 2}, 2e-3);
}

/* The communication thread reduces the same values as the hooks; with 2 buckets. */
static void test_sgd_fp32_progress_thread(void **state) {
    (void)state;
    check_equivalence(&(config){.overflow_step = -1,
                                .progress = MT_DDP_PROGRESS_THREAD,
                                .bucket_mb = 600.0 / (1024 * 1024)},
                      1e-5);
}
static void test_adamw_amp_o1_progress_thread_overflows(void **state) {
    (void)state;
    check_equivalence(
        &(config){
            .adamw = true, .amp = true, .overflow_step = 2, .progress = MT_DDP_PROGRESS_THREAD},
        2e-3);
}

static double clock_s(void) { /* the clock of mt_ddp_stats' times */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One step of the 3-layer model under opts; *t0 and *t1 are read before backward and after
   mt_ddp_wait. */
static mt_ddp_stats traced_step(const mt_ddp_opts *opts, double *t0, double *t1) {
    model m;
    model_init(&m, 3);
    mt_ddp *ddp = mt_ddp_new(m.p, NP, opts);
    assert_non_null(ddp);
    mt_scope_begin();
    mt_tensor *loss = batch_loss(&m, 0, mt_dist_rank() * B, B, false);
    *t0 = clock_s();
    assert_int_equal(mt_backward(loss, NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0);
    *t1 = clock_s();
    mt_scope_end();
    mt_ddp_stats st;
    assert_int_equal(mt_ddp_stats_get(ddp, &st), 0);
    mt_ddp_free(ddp);
    model_free(&m);
    return st;
}

/* What the trace says that does not depend on timing: with overlap on, every bucket is
   started (hooks) or handed over (thread) from a gradient hook; with hook progress bucket 0
   (b2, whose gradient linear 2's backward makes) starts before the last hook (w1's or b1's)
   returns; the times are ordered within the step; a completion seen before backward's end
   counts as done in backward (a world of one completes at the start: all of them). When a
   bucket completes among two ranks is up to MPI and the machine, so it is only bounded. */
static void check_trace(mt_ddp_progress progress) {
    bool one = mt_dist_world_size() == 1;
    double t0, t1;
    mt_ddp_stats st =
        traced_step(&(mt_ddp_opts){.per_parameter = true, .progress = progress}, &t0, &t1);
    assert_int_equal(st.buckets, NP);
    assert_int_equal(st.started_in_backward, NP);
    assert_true(t0 <= st.first_grad_time && st.first_grad_time <= st.last_grad_time);
    assert_true(st.last_grad_time <= st.wait_begin_time && st.wait_begin_time <= t1);
    assert_true(st.first_grad_time <= st.first_start_time);
    if (progress == MT_DDP_PROGRESS_HOOKS || one)
        assert_true(st.first_start_time < st.last_grad_time);
    assert_true(st.first_start_time <= st.first_done_time && st.first_done_time <= t1);
    assert_true(st.first_done_time <= st.last_done_time && st.last_done_time <= t1);
    assert_true(st.done_in_backward >= 0 && st.done_in_backward <= NP);
    if (one) assert_int_equal(st.done_in_backward, NP);
    if (st.done_in_backward == NP) assert_true(st.last_done_time <= st.last_grad_time);
    /* overlap off: everything starts in mt_ddp_wait, nothing completes during backward */
    st = traced_step(
        &(mt_ddp_opts){.per_parameter = true, .no_overlap = true, .progress = progress}, &t0, &t1);
    assert_int_equal(st.started_in_backward, 0);
    assert_int_equal(st.done_in_backward, 0);
    assert_true(st.wait_begin_time <= st.first_start_time && st.first_done_time <= t1);
}

static void test_trace_progress_hooks(void **state) {
    (void)state;
    check_trace(MT_DDP_PROGRESS_HOOKS);
}
static void test_trace_progress_thread(void **state) {
    (void)state;
    check_trace(MT_DDP_PROGRESS_THREAD);
}

static mt_ddp_stats one_step(const mt_ddp_opts *opts) {
    double t0, t1;
    return traced_step(opts, &t0, &t1);
}

static void test_bucket_counts_and_overlap(void **state) {
    (void)state;
    mt_ddp_stats st = one_step(NULL); /* 25 MiB: everything in one bucket */
    assert_int_equal(st.buckets, 1);
    assert_int_equal(st.allreduce_calls, 1);
    assert_int_equal(st.started_in_backward, 1);
    assert_int_equal(st.steps, 1);
    /* 600 bytes: b2 + w2 + b1 (336 bytes) fill one bucket, w1 (512) another */
    st = one_step(&(mt_ddp_opts){.bucket_mb = 600.0 / (1024 * 1024)});
    assert_int_equal(st.buckets, 2);
    assert_int_equal(st.allreduce_calls, 2);
    assert_int_equal(st.started_in_backward, 2);
    /* no limit (beyond a size_t, or infinite): one bucket, not a size that wrapped to 0 */
    st = one_step(&(mt_ddp_opts){.bucket_mb = 1e30});
    assert_int_equal(st.buckets, 1);
    st = one_step(&(mt_ddp_opts){.bucket_mb = INFINITY});
    assert_int_equal(st.buckets, 1);
    st = one_step(&(mt_ddp_opts){.per_parameter = true});
    assert_int_equal(st.buckets, NP);
    assert_int_equal(st.allreduce_calls, NP);
    st = one_step(&(mt_ddp_opts){.per_parameter = true, .no_overlap = true});
    assert_int_equal(st.allreduce_calls, NP);
    assert_int_equal(st.started_in_backward, 0);
}

/* Parameters of two dtypes in turn (O2's FP16 weights among FP32 norm parameters): one open
   bucket per dtype, so two buckets, not one per dtype change; every gradient is averaged. */
static void test_buckets_per_dtype(void **state) {
    (void)state;
    enum { N = 5 };
    mt_tensor *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = mt_full(MT_SHAPE(3 + i), i % 2 ? MT_F32 : MT_F16, MT_CPU, 0.5);
        mt_set_requires_grad(p[i], true);
    }
    for (int per_param = 0; per_param < 2; per_param++) {
        mt_ddp *ddp = mt_ddp_new(p, N, &(mt_ddp_opts){.per_parameter = per_param});
        assert_non_null(ddp);
        mt_scope_begin();
        mt_tensor *loss = mt_scalar(0.0, MT_F32, MT_CPU);
        for (int i = 0; i < N; i++)
            loss = mt_add(loss, mt_mul_scalar(mt_sum_all(mt_cast(p[i], MT_F32)), i + 1.0));
        assert_int_equal(mt_backward(loss, NULL), 0);
        assert_int_equal(mt_ddp_wait(ddp), 0);
        for (int i = 0; i < N; i++) {
            double want[8];
            for (int k = 0; k < 3 + i; k++) want[k] = i + 1.0;
            assert_tensor_close(mt_grad(p[i]), want, 3 + i, 0, 0);
        }
        mt_scope_end();
        mt_ddp_stats st;
        assert_int_equal(mt_ddp_stats_get(ddp, &st), 0);
        assert_int_equal(st.buckets, per_param ? N : 2);
        assert_int_equal(st.allreduce_calls, per_param ? N : 2);
        mt_ddp_free(ddp);
        for (int i = 0; i < N; i++) mt_set_grad(p[i], NULL);
    }
    for (int i = 0; i < N; i++) mt_release(p[i]);
}

/* Two micro-batches, the first under no_sync: the gradients equal the average over the
   ranks of the accumulated sums, i.e. one big batch's two halves summed. */
static void test_no_sync_accumulates(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    model m, ref;
    model_init(&m, 5);
    model_init(&ref, 5);
    mt_ddp *ddp = mt_ddp_new(m.p, NP, NULL);
    assert_non_null(ddp);
    mt_scope_begin();
    assert_int_equal(mt_ddp_set_no_sync(ddp, true), 0);
    assert_int_equal(mt_backward(batch_loss(&m, 0, me * B, B, false), NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0); /* nothing to do */
    mt_ddp_stats st;
    assert_int_equal(mt_ddp_stats_get(ddp, &st), 0);
    assert_int_equal(st.steps, 0);
    assert_int_equal(mt_ddp_set_no_sync(ddp, false), 0);
    assert_int_equal(mt_backward(batch_loss(&m, 1, me * B, B, false), NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0);
    assert_int_equal(mt_ddp_stats_get(ddp, &st), 0);
    assert_int_equal(st.steps, 1);
    assert_int_equal(st.allreduce_calls, 1);
    assert_int_equal(mt_backward(batch_loss(&ref, 0, 0, W * B, false), NULL), 0);
    assert_int_equal(mt_backward(batch_loss(&ref, 1, 0, W * B, false), NULL), 0);
    for (int k = 0; k < NP; k++) {
        double *want = mt_test_values(mt_grad(ref.p[k]));
        assert_tensor_close(mt_grad(m.p[k]), want, mt_numel(m.p[k]), 1e-6, 1e-5);
        free(want);
    }
    mt_scope_end();
    mt_ddp_free(ddp);
    model_free(&m);
    model_free(&ref);
}

/* A gradient accumulated under no_sync reaches the average even when the synced step that
   follows does not touch its parameter (p[1] below), or when no backward follows at all
   (mt_ddp_wait right after no_sync is switched off): a parameter that no hook marked ready
   takes part with the gradient it holds, as torch's reducer does, not with zeros. */
static void test_no_sync_gradient_of_unreached_parameter(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    mt_tensor *p[2] = {mt_full(MT_SHAPE(3), MT_F32, MT_CPU, 1.0),
                       mt_full(MT_SHAPE(2), MT_F32, MT_CPU, 1.0)};
    for (int k = 0; k < 2; k++) mt_set_requires_grad(p[k], true);
    mt_ddp *ddp = mt_ddp_new(p, 2, NULL);
    assert_non_null(ddp);
    double mean_rank = (W + 1) / 2.0; /* the average of me + 1 over the ranks */
    for (int follow = 0; follow < 2; follow++) {
        mt_scope_begin();
        assert_int_equal(mt_ddp_set_no_sync(ddp, true), 0);
        mt_tensor *loss = mt_add(mt_sum_all(mt_mul_scalar(p[0], me + 1.0)),
                                 mt_sum_all(mt_mul_scalar(p[1], 2.0 * (me + 1))));
        assert_int_equal(mt_backward(loss, NULL), 0);
        assert_int_equal(mt_ddp_set_no_sync(ddp, false), 0);
        if (follow) /* a synced micro-batch that uses p[0] alone */
            assert_int_equal(mt_backward(mt_sum_all(mt_mul_scalar(p[0], 3.0)), NULL), 0);
        assert_int_equal(mt_ddp_wait(ddp), 0);
        double g0 = mean_rank + (follow ? 3.0 : 0.0);
        double want0[3] = {g0, g0, g0}, want1[2] = {2 * mean_rank, 2 * mean_rank};
        assert_tensor_close(mt_grad(p[0]), want0, 3, 0, 1e-6);
        assert_tensor_close(mt_grad(p[1]), want1, 2, 0, 1e-6);
        mt_scope_end();
        for (int k = 0; k < 2; k++) mt_set_grad(p[k], NULL);
    }
    mt_ddp_free(ddp);
    mt_release(p[0]);
    mt_release(p[1]);
}

/* A parameter only rank 1 uses: the others take part with zeros, nobody hangs, and every
   rank ends with the same average. */
static void test_unused_parameter(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    mt_tensor *p[2] = {mt_full(MT_SHAPE(3), MT_F32, MT_CPU, 1.0),
                       mt_full(MT_SHAPE(2), MT_F32, MT_CPU, 1.0)};
    for (int k = 0; k < 2; k++) mt_set_requires_grad(p[k], true);
    mt_ddp *ddp = mt_ddp_new(p, 2, &(mt_ddp_opts){.per_parameter = true});
    assert_non_null(ddp);
    mt_scope_begin();
    mt_tensor *loss = mt_sum_all(mt_mul_scalar(p[0], 3.0));
    if (me == 1) loss = mt_add(loss, mt_sum_all(mt_mul_scalar(p[1], 2.0)));
    assert_int_equal(mt_backward(loss, NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0);
    double g0[3] = {3, 3, 3}, g1[2] = {W > 1 ? 2.0 / W : 0, W > 1 ? 2.0 / W : 0};
    assert_tensor_close(mt_grad(p[0]), g0, 3, 0, 0);
    assert_tensor_close(mt_grad(p[1]), g1, 2, 0, 0);
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(p[0]);
    mt_release(p[1]);
}

/* A second backward before mt_ddp_wait (accumulation without no_sync) is refused. */
static void test_ready_twice_refused(void **state) {
    (void)state;
    mt_tensor *p = mt_full(MT_SHAPE(2), MT_F32, MT_CPU, 1.0);
    mt_set_requires_grad(p, true);
    mt_ddp *ddp = mt_ddp_new(&p, 1, NULL);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(p), NULL), 0);
    assert_int_equal(mt_backward(mt_sum_all(p), NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "was ready twice before mt_ddp_wait");
    mt_clear_error();
    assert_int_equal(mt_ddp_wait(ddp), 0); /* the step still completes on every rank */
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(p);
}

static void test_argument_errors(void **state) {
    (void)state;
    mt_tensor *c = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU); /* does not require grad */
    assert_null(mt_ddp_new(&c, 1, NULL));
    assert_error(MT_ERR_STATE, "parameter 0 must be a leaf that requires grad");
    assert_null(mt_ddp_new(NULL, 1, NULL));
    assert_error(MT_ERR_NULL, "params is NULL");
    mt_set_requires_grad(c, true);
    assert_null(mt_ddp_new(&c, 1, &(mt_ddp_opts){.bucket_mb = -1}));
    assert_error(MT_ERR_INVALID, "bucket_mb -1 must be >= 0");
    assert_null(mt_ddp_new(&c, 1, &(mt_ddp_opts){.progress = (mt_ddp_progress)7}));
    assert_error(MT_ERR_INVALID, "progress 7 is not an mt_ddp_progress");
    assert_int_equal(mt_ddp_wait(NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_ddp_wait: arg 1");
    if (mt_cuda_available()) {
        mt_tensor *g = mt_zeros(MT_SHAPE(2), MT_F32, MT_CUDA(0));
        mt_set_requires_grad(g, true);
        mt_tensor *mixed[2] = {c, g}; /* one device per rank */
        assert_null(mt_ddp_new(mixed, 2, NULL));
        assert_error(MT_ERR_DEVICE, "parameter 1 is on cuda:0, parameter 0 on cpu");
        mt_release(g);
    }
    mt_release(c);
}

/* Every allocation of mt_ddp_new failed in turn (mt_debug_fail_nth_alloc), with either
   progress mode: each failure is MT_ERR_OOM naming mt_ddp_new, leaks nothing and leaves no
   gradient hook behind (a backward after it runs no hook of the freed mt_ddp: ASan would see
   that), and the parameters keep their values. A world of one only: a rank that fails alone
   would leave its peers waiting in the collective. */
static void test_new_out_of_memory(void **state) {
    (void)state;
    for (int progress = 0; progress < 2; progress++) {
        model m;
        model_init(&m, 9);
        mt_scope_begin();
        double before[NP][HID * IN];
        for (int k = 0; k < NP; k++)
            assert_int_equal(mt_copy_to_host(mt_cast(m.p[k], MT_F64), before[k], sizeof before[k]),
                             0);
        int64_t failures = 0, n = 1;
        for (;; n++) {
            int64_t tensors = mt_live_tensors(), bytes = mt_live_bytes();
            mt_debug_fail_nth_alloc(n);
            mt_ddp *d = mt_ddp_new(m.p, NP, &(mt_ddp_opts){.progress = (mt_ddp_progress)progress});
            bool never_reached = mt_debug_fail_nth_alloc(0);
            if (d) {
                mt_ddp_free(d);
                if (never_reached) break;
                continue; /* recovered from the failure by itself */
            }
            failures++;
            assert_error(MT_ERR_OOM, "mt_ddp_new");
            assert_int_equal(mt_live_tensors(), tensors);
            assert_int_equal(mt_live_bytes(), bytes);
            assert_int_equal(mt_backward(batch_loss(&m, 0, 0, B, false), NULL), 0);
            for (int k = 0; k < NP; k++) {
                double now[HID * IN];
                mt_zero_grad(m.p[k]);
                assert_int_equal(mt_copy_to_host(mt_cast(m.p[k], MT_F64), now, sizeof now), 0);
                assert_memory_equal(now, before[k], (size_t)mt_numel(m.p[k]) * sizeof *now);
            }
        }
        mt_scope_end();
        printf("# mt_ddp_new (progress %d): %lld allocations, %lld failed cleanly\n", progress,
               (long long)(n - 1), (long long)failures);
        assert_true(failures > 0);
        model_free(&m);
    }
}

/* One data-parallel step whose gradients mt_ddp_wait must make or replace: w1's gradient is
   a transposed (not contiguous) tensor set beforehand, and b2 gets none (the loss leaves it
   out). */
static void wait_step_prepare(model *m) {
    for (int k = 0; k < NP; k++) mt_zero_grad(m->p[k]);
    mt_tensor *t = mt_transpose(mt_zeros(MT_SHAPE(IN, HID), MT_F32, MT_CPU), 0, 1);
    assert_int_equal(mt_set_grad(m->p[0], t), 0);
    int me = mt_dist_rank();
    mt_tensor *x = mt_full(MT_SHAPE(B, IN), MT_F32, MT_CPU, 0.25 * (me + 1));
    mt_tensor *h = mt_tanh(mt_linear(x, m->p[0], m->p[1]));
    mt_tensor *y = mt_full(MT_SHAPE(B, OUT), MT_F32, MT_CPU, 0.5);
    assert_int_equal(mt_backward(mt_mse_loss(mt_linear(h, m->p[2], NULL), y), NULL), 0);
}

/* The gradients' values as F64; NAN first marks a missing one. */
static void grads_read(model *m, double g[NP][HID * IN]) {
    for (int k = 0; k < NP; k++) {
        mt_tensor *gk = mt_grad(m->p[k]);
        g[k][0] = NAN;
        if (gk) assert_int_equal(mt_copy_to_host(mt_cast(gk, MT_F64), g[k], sizeof g[k]), 0);
    }
}

/* Every allocation of mt_ddp_wait failed in turn on the last rank (mt_debug_fail_nth_alloc):
   each failure is MT_ERR_OOM naming mt_ddp_wait, changes no gradient bit for bit (the one it
   would make stays missing, the one it would replace stays) and leaks nothing; calling
   mt_ddp_wait again finishes the step, which ends exactly like the step of a twin that never
   failed. CPU buckets allocate only after their all-reduces, so the failing rank's retry
   needs no peer: the other ranks' waits succeed at once. */
static void wait_walk(mt_ddp_progress progress) {
    int me = mt_dist_rank(), last = mt_dist_world_size() - 1;
    model m;
    model_init(&m, 10);
    /* 300 bytes: 2 buckets */
    mt_ddp *d = mt_ddp_new(m.p, NP, &(mt_ddp_opts){.bucket_mb = 300e-6, .progress = progress});
    assert_non_null(d);
    static double twin[NP][HID * IN], before[NP][HID * IN], after[NP][HID * IN];
    mt_scope_begin();
    wait_step_prepare(&m);
    grads_read(&m, before);
    assert_int_equal(mt_ddp_wait(d), 0);
    grads_read(&m, twin);
    mt_scope_end();
    /* b2 had no gradient: zeros after. In a world of one the average is the local gradient:
       w1's, copied into its bucket from a transposed tensor by the hook, comes back to the bit */
    for (int k = 0; k < NP; k++) {
        if (isnan(before[k][0]))
            for (int64_t i = 0; i < mt_numel(m.p[k]); i++) assert_true(twin[k][i] == 0.0);
        else if (mt_dist_world_size() == 1)
            assert_memory_equal(twin[k], before[k], (size_t)mt_numel(m.p[k]) * sizeof(double));
    }
    int64_t failures = 0, n = 1;
    for (bool done = false; !done; n++) {
        mt_scope_begin();
        wait_step_prepare(&m);
        grads_read(&m, before);
        int64_t tensors = mt_live_tensors(), bytes = mt_live_bytes();
        if (me == last) mt_debug_fail_nth_alloc(n);
        int rc = mt_ddp_wait(d);
        bool never_reached = mt_debug_fail_nth_alloc(0);
        if (rc != 0) {
            failures++;
            assert_oom_left_nothing("mt_ddp_wait", tensors, bytes);
            grads_read(&m, after);
            for (int k = 0; k < NP; k++) {
                if (isnan(before[k][0])) {
                    assert_true(isnan(after[k][0]));
                    continue;
                }
                assert_memory_equal(after[k], before[k], (size_t)mt_numel(m.p[k]) * sizeof(double));
            }
            assert_int_equal(mt_ddp_wait(d), 0);
        }
        grads_read(&m, after);
        for (int k = 0; k < NP; k++)
            assert_memory_equal(after[k], twin[k], (size_t)mt_numel(m.p[k]) * sizeof(double));
        /* the last rank says when its walk is over */
        mt_tensor *stop = mt_full(MT_SHAPE(1), MT_F32, MT_CPU, me == last && never_reached);
        assert_int_equal(mt_all_reduce(stop, MT_REDUCE_MAX), 0);
        done = mt_item(stop) != 0;
        mt_scope_end();
    }
    printf("# mt_ddp_wait (rank %d, progress %d): %lld allocations walked, %lld failed "
           "cleanly\n",
           me, (int)progress, (long long)(n - 2), (long long)failures);
    if (me == last) assert_true(failures > 0);
    mt_ddp_stats st;
    assert_int_equal(mt_ddp_stats_get(d, &st), 0);
    assert_int_equal(st.steps, n);
    mt_ddp_free(d);
    model_free(&m);
}

static void test_wait_out_of_memory(void **state) {
    (void)state;
    wait_walk(MT_DDP_PROGRESS_HOOKS);
    wait_walk(MT_DDP_PROGRESS_THREAD);
}

/* Ranks with different parameter lists: an error on every rank, no hang. */
static void test_mismatch_across_ranks(void **state) {
    (void)state;
    int me = mt_dist_rank();
    mt_tensor *a = mt_zeros(MT_SHAPE(me ? 3 : 4), MT_F32, MT_CPU);
    mt_tensor *b = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU);
    mt_set_requires_grad(a, true);
    mt_set_requires_grad(b, true);
    mt_tensor *ps[2] = {b, a};
    assert_null(mt_ddp_new(ps, 2, NULL));
    assert_error(MT_ERR_SHAPE, "parameter 1 differs between the ranks");
    mt_clear_error();
    assert_null(mt_ddp_new(ps, me ? 1 : 2, NULL));
    assert_error(MT_ERR_SHAPE, "different numbers of parameters");
    mt_clear_error();
    mt_tensor *plain = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU);
    mt_tensor *qs[1] = {me ? plain : b};
    assert_null(mt_ddp_new(qs, 1, NULL));
    if (me)
        assert_error(MT_ERR_STATE, "must be a leaf that requires grad");
    else
        assert_error(MT_ERR_STATE, "another rank refused its parameter list");
    mt_release(plain);
    mt_release(a);
    mt_release(b);
}

/* O2: FP16 parameters and gradients (bucketed in FP32), FP32 master weights */
static void test_sgd_amp_o2_one_rank_overflows(void **state) {
    (void)state;
    check_equivalence(&(config){.amp = true, .o2 = true, .overflow_step = 1}, 2e-3);
}
static void test_adamw_amp_o2(void **state) {
    (void)state;
    check_equivalence(&(config){.adamw = true, .amp = true, .o2 = true, .overflow_step = -1}, 2e-3);
}

/* rank r's loss on a channels-last convolution: sum(conv(x_r, w) * x-dependent weights) */
static mt_tensor *conv_loss(mt_tensor *w, int r) {
    double x[3 * 5 * 5];
    for (int i = 0; i < 75; i++) x[i] = sin(r * 11.0 + i * 0.7);
    mt_tensor *xt =
        mt_to_channels_last(mt_cast(mt_from_data(x, MT_F64, MT_SHAPE(1, 3, 5, 5), MT_CPU), MT_F32));
    mt_tensor *y = mt_conv2d(xt, w, NULL, &(mt_conv2d_opts){.padding = {1, 1}});
    return mt_sum_all(mt_mul(y, mt_tanh(y)));
}

/* Channels-last parameters (mt_params_to_channels_last) are averaged as contiguous ones are:
   the gradient comes back channels-last and equals the mean of every rank's own. */
static void test_channels_last_params(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    double v[4 * 3 * 3 * 3];
    for (int i = 0; i < 108; i++) v[i] = cos(i * 1.3) * 0.3;
    mt_tensor *v64 = mt_from_data(v, MT_F64, MT_SHAPE(4, 3, 3, 3), MT_CPU);
    mt_tensor *w = mt_cast(v64, MT_F32);
    mt_release(v64);
    mt_tensor *ref = mt_clone(w);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(ref, true);
    assert_int_equal(mt_params_to_channels_last(&w, 1), 0);
    mt_ddp *ddp = mt_ddp_new(&w, 1, NULL);
    assert_non_null(ddp);
    mt_scope_begin();
    for (int r = 0; r < W; r++) assert_int_equal(mt_backward(conv_loss(ref, r), NULL), 0);
    assert_int_equal(mt_backward(conv_loss(w, me), NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0);
    mt_tensor *g = mt_grad(w), *want = mt_mul_scalar(mt_grad(ref), 1.0 / W);
    assert_true(mt_is_channels_last(g) && !mt_is_contiguous(g));
    double *wv = mt_test_values(want);
    assert_tensor_close(g, wv, 108, 1e-5, 1e-5);
    free(wv);
    mt_release(g);
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(ref);
    mt_release(w);
}

int main(void) {
    mt_test_dist_begin();
    const struct CMUnitTest tests[] = {
        MT_TEST(test_sgd_fp32),
        MT_TEST(test_adamw_fp32),
        MT_TEST(test_sgd_amp_o1_one_rank_overflows),
        MT_TEST(test_adamw_amp_o1_one_rank_overflows),
        MT_TEST(test_sgd_amp_o2_one_rank_overflows),
        MT_TEST(test_adamw_amp_o2),
        MT_TEST(test_sgd_fp32_progress_thread),
        MT_TEST(test_adamw_amp_o1_progress_thread_overflows),
        MT_TEST(test_trace_progress_hooks),
        MT_TEST(test_trace_progress_thread),
        MT_TEST(test_bucket_counts_and_overlap),
        MT_TEST(test_buckets_per_dtype),
        MT_TEST(test_no_sync_accumulates),
        MT_TEST(test_no_sync_gradient_of_unreached_parameter),
        MT_TEST(test_unused_parameter),
        MT_TEST(test_ready_twice_refused),
        MT_TEST(test_argument_errors),
        MT_TEST(test_channels_last_params),
        MT_TEST_ONE_RANK(
            test_new_out_of_memory,
            "a world of one only (a rank failing alone would leave its peers waiting)"),
        MT_TEST(test_wait_out_of_memory),
        MT_TEST_MULTI_RANK(test_mismatch_across_ranks),
    };
    int failures = MT_RUN_TESTS(tests);
    /* C's usual cleanup order frees objects after shutting the library down: a DDP freed
       after mt_dist_finalize makes no MPI call (MPI would abort the job) */
    mt_tensor *p = mt_ones(MT_SHAPE(4), MT_F32, MT_CPU);
    mt_set_requires_grad(p, true);
    mt_ddp *late = mt_ddp_new(&p, 1, NULL);
    if (!late) {
        fprintf(stderr, "# mt_ddp_new: %s\n", mt_last_error());
        failures++;
    }
    int rc = mt_test_dist_end(failures);
    mt_ddp_free(late);
    mt_release(p);
    return rc;
}

/* Collectives on CUDA tensors through NCCL: a world of one (mt_dist_init without a launcher,
   where NCCL still runs), and worlds of 2 and 3 ranks as threads of this process
   (mt_dist_init_thread); on the emulated device the fake NCCL of test/cuda_emu. Values for
   every dtype, no host wait inside a collective, ranks that disagree, refused tensors, the
   GradScaler's cross-rank skip, and (run with MT_TEST_NCCL_MISSING=1 and MT_NCCL_LIBRARY
   naming no library) a missing NCCL.
   Devices: rank r puts its tensors on cuda:(r % the device count). The real NCCL refuses two
   ranks on one GPU ("Duplicate GPU detected", seen on a one-GPU H200 machine), so a world
   larger than the device count is reported skipped there. The fake NCCL lets ranks share a
   device (it ignores devices: the emulated devices' memory and work queue are one), so on the
   emulated device every world runs: all ranks on cuda:0 with one emulated device, and on
   different devices with MTEMU_DEVICES=2 (ranks 0 and 2 of a world of 3 share cuda:0). */
#include <pthread.h>
#include "test_util.h"

static const mt_dtype all_dtypes[] = {MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL};
#define N 5

/* rank r's value of element i (small integers: exact in every dtype) */
static double value(mt_dtype dt, int r, int i) {
    return dt == MT_BOOL ? (double)((i + r) % 3 == 0) : (double)((r + 1) * (i + 1) % 7) - 2.0;
}

/* The CUDA device count and whether NCCL is the emulated device's fake (set by main). */
static int gpus = 1;
static bool fake_nccl;

/* The fake NCCL's unique ids start with this tag (test/cuda_emu/fake_nccl.cpp). test_nccl runs
   with no MT_TEST_DEVICE (test/meson.build), so mt_test_emulated_device() answers only when
   the environment names the emulated device: the id tells the fake in every run. */
static bool nccl_is_fake(void) {
    if (mt_test_emulated_device()) return true;
    mt_dist_id id;
    static const char tag[] = "mtemu-nccl-id";
    bool fake = mt_dist_id_new(&id) == 0 && memcmp(id.bytes, tag, sizeof tag - 1) == 0;
    mt_clear_error();
    return fake;
}

/* Rank r's device: one GPU per rank where there are enough (the real NCCL needs that). */
static mt_device rank_device(int r) {
    return MT_CUDA(r % gpus);
}

/* Whether a world of threads can run here: the fake NCCL takes any world, the real one a
   GPU per rank. */
static bool world_fits(int world) {
    return fake_nccl || world <= gpus;
}

static mt_tensor *rank_tensor(mt_dtype dt, int r) {
    double v[N];
    for (int i = 0; i < N; i++) v[i] = value(dt, r, i);
    mt_tensor *d = mt_from_data(v, MT_F64, MT_SHAPE(N), rank_device(r));
    mt_tensor *t = mt_cast(d, dt);
    mt_release(d);
    return t;
}

static double expected(mt_dtype dt, mt_reduce_op op, int world, int i) {
    double s = 0, m = -1e300;
    for (int r = 0; r < world; r++) {
        double v = value(dt, r, i);
        s += v;
        m = v > m ? v : m;
    }
    if (dt == MT_BOOL) return s != 0; /* sum and max of bools: logical or */
    return op == MT_REDUCE_MAX ? m : op == MT_REDUCE_AVG ? s / world : s;
}

/* ---- a rank's checks, run on its own thread: failures are recorded, not asserted (cmocka's
   asserts belong to the main thread) */
typedef struct {
    int rank, world;
    const mt_dist_id *id;
    int (*body)(int rank, int world, char *why);
    int rc;
    char why[512];
} rank_run;

#define RANK_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(why, 512, "line %d: %s (last error: %s)", __LINE__, #cond, mt_last_error());  \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static void *rank_main(void *p) {
    rank_run *a = p;
    if (mt_dist_init_thread(a->rank, a->world, a->id) < 0) {
        snprintf(a->why, sizeof a->why, "mt_dist_init_thread: %s", mt_last_error());
        a->rc = -1;
        return NULL;
    }
    a->rc = a->body(a->rank, a->world, a->why);
    if (mt_dist_finalize() < 0 && a->rc == 0) {
        snprintf(a->why, sizeof a->why, "mt_dist_finalize: %s", mt_last_error());
        a->rc = -1;
    }
    return NULL;
}

/* Runs body as every rank of a world of threads. main registers the tests whose world does not
   fit (world_fits) as skipped, with the reason; a call that gets here with one fails. */
static void run_ranks(int world, int (*body)(int, int, char *)) {
    if (!world_fits(world))
        fail_msg("real NCCL needs one GPU per rank: world %d, %d GPU%s", world, gpus,
                 gpus == 1 ? "" : "s");
    mt_dist_id id;
    assert_int_equal(mt_dist_id_new(&id), 0);
    rank_run runs[4];
    pthread_t th[4]; /* pthreads, not C11 threads: ThreadSanitizer (GCC 12) sees only these */
    assert_true(world <= 4);
    for (int r = 0; r < world; r++) {
        runs[r] = (rank_run){.rank = r, .world = world, .id = &id, .body = body};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &runs[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    int failed = -1;
    for (int r = 0; r < world; r++)
        if (runs[r].rc != 0) {
            fprintf(stderr, "# rank %d of %d: %s\n", r, world, runs[r].why);
            failed = r;
        }
    if (failed >= 0) fail_msg("rank %d of %d: %s", failed, world, runs[failed].why);
}

/* Checks t's values against want[] exactly (small integers, exact in every dtype). */
static int equal_to(mt_tensor *t, const double *want, int n, char *why) {
    double *v = mt_test_values(t);
    RANK_CHECK(v != NULL);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (v[i] != want[i]) bad = i;
    double got = bad >= 0 ? v[bad] : 0;
    free(v);
    if (bad >= 0) {
        snprintf(why, 512, "element %d is %g, expected %g", bad, got, want[bad]);
        return -1;
    }
    return 0;
}

/* Every dtype and reduction; the collective itself never waits for the device. */
static int all_reduce_body(int rank, int world, char *why) {
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        mt_dtype dt = all_dtypes[k];
        for (int op = MT_REDUCE_SUM; op <= MT_REDUCE_AVG; op++) {
            if (op == MT_REDUCE_AVG && !mt_dtype_is_floating(dt)) continue;
            /* avg of 3 ranks is not exact in every dtype: checked with sum and max only */
            if (op == MT_REDUCE_AVG && world == 3) continue;
            mt_tensor *t = rank_tensor(dt, rank);
            RANK_CHECK(t != NULL);
            int64_t syncs = mt_host_sync_count();
            mt_dist_work *w = mt_all_reduce_async(t, (mt_reduce_op)op);
            RANK_CHECK(w != NULL);
            RANK_CHECK(mt_dist_wait(w) == 0);
            /* the count is the process's: other threads' syncs would show in it */
            RANK_CHECK(world > 1 || mt_host_sync_count() == syncs);
            double want[N];
            for (int i = 0; i < N; i++) want[i] = expected(dt, (mt_reduce_op)op, world, i);
            int rc = equal_to(t, want, N, why);
            mt_release(t);
            if (rc < 0) return rc;
        }
    }
    return 0;
}

/* Broadcast from the last rank, and all-gather, every dtype. */
static int broadcast_gather_body(int rank, int world, char *why) {
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        mt_dtype dt = all_dtypes[k];
        mt_tensor *t = rank_tensor(dt, rank);
        RANK_CHECK(t != NULL);
        RANK_CHECK(mt_broadcast(t, world - 1) == 0);
        double want[N * 4];
        for (int i = 0; i < N; i++) want[i] = value(dt, world - 1, i);
        int rc = equal_to(t, want, N, why);
        mt_release(t);
        if (rc < 0) return rc;
        t = rank_tensor(dt, rank);
        mt_tensor *all = mt_all_gather(t);
        RANK_CHECK(all != NULL && mt_ndim(all) == 2 && mt_shape(all)[0] == world);
        for (int r = 0; r < world; r++)
            for (int i = 0; i < N; i++) want[r * N + i] = value(dt, r, i);
        rc = equal_to(all, want, N * world, why);
        mt_release(all);
        mt_release(t);
        if (rc < 0) return rc;
    }
    return 0;
}

static void test_world1_process(void **state) {
    (void)state;
    /* mt_dist_init without a launcher: a world of one, whose CUDA tensors still go
       through NCCL (all-reduce is the identity, avg divides by one) */
    assert_int_equal(mt_dist_init(), 0);
    assert_int_equal(mt_dist_world_size(), 1);
    char why[512] = "";
    if (all_reduce_body(0, 1, why) < 0) fail_msg("%s", why);
    if (broadcast_gather_body(0, 1, why) < 0) fail_msg("%s", why);
    /* all-gather between devices */
    mt_tensor *out = mt_zeros(MT_SHAPE(1, 2), MT_F32, MT_CPU);
    mt_tensor *src = mt_zeros(MT_SHAPE(2), MT_F32, MT_CUDA(0));
    assert_null(mt_all_gather_async(out, src));
    assert_error(MT_ERR_DEVICE, "mt_all_gather: tensors are on different devices");
    mt_release(out);
    mt_release(src);
}

static void test_threads_all_reduce(void **state) {
    (void)state;
    run_ranks(2, all_reduce_body);
}

static void test_threads_all_reduce_world3(void **state) {
    (void)state;
    run_ranks(3, all_reduce_body);
}

static void test_threads_broadcast_gather(void **state) {
    (void)state;
    run_ranks(2, broadcast_gather_body);
}

static void test_threads_broadcast_gather_world3(void **state) {
    (void)state;
    run_ranks(3, broadcast_gather_body);
}

/* Rank 1 passes one element more: the fake NCCL sees the ranks disagree and every rank gets
   the error (the real one would hang: mixtape's MPI worlds check first, mt_dist_agree; main
   runs this with the fake only). */
static int mismatch_body(int rank, int world, char *why) {
    (void)world;
    mt_tensor *t = mt_zeros(MT_SHAPE(4 + rank), MT_F32, rank_device(rank));
    RANK_CHECK(t != NULL);
    int rc = mt_all_reduce(t, MT_REDUCE_SUM);
    mt_release(t);
    RANK_CHECK(rc == MT_ERR_STATE);
    RANK_CHECK(strstr(mt_last_error(), "mt_all_reduce: NCCL refused the call") != NULL);
    RANK_CHECK(strstr(mt_last_error(), "the ranks disagree") != NULL);
    mt_clear_error();
    /* the world is still usable */
    t = mt_ones(MT_SHAPE(3), MT_F32, rank_device(rank));
    RANK_CHECK(t != NULL && mt_all_reduce(t, MT_REDUCE_SUM) == 0);
    mt_scope_begin();
    double sum = mt_item(mt_sum_all(t));
    mt_scope_end();
    mt_release(t);
    RANK_CHECK(sum == 6.0);
    return 0;
}

static void test_threads_mismatch(void **state) {
    (void)state;
    run_ranks(2, mismatch_body);
}

/* Refused before any communication: CPU tensors (no MPI in a world of threads), layouts,
   avg of integers, a barrier and mt_ddp. */
static int refused_body(int rank, int world, char *why) {
    (void)world;
    mt_tensor *c = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU);
    RANK_CHECK(mt_all_reduce(c, MT_REDUCE_SUM) == MT_ERR_UNSUPPORTED);
    RANK_CHECK(strstr(mt_last_error(), "a CPU tensor in a world of threads") != NULL);
    mt_clear_error();
    mt_tensor *g = mt_zeros(MT_SHAPE(2, 3), MT_F32, rank_device(rank));
    mt_tensor *gt = mt_transpose(g, 0, 1);
    RANK_CHECK(mt_broadcast(gt, 0) == MT_ERR_INVALID);
    RANK_CHECK(strstr(mt_last_error(), "not contiguous") != NULL);
    mt_clear_error();
    mt_tensor *i = mt_zeros(MT_SHAPE(2), MT_I32, rank_device(rank));
    RANK_CHECK(mt_all_reduce(i, MT_REDUCE_AVG) == MT_ERR_DTYPE);
    mt_clear_error();
    mt_tensor *out = mt_zeros(MT_SHAPE(2, 2), MT_F32, MT_CPU);
    mt_tensor *src = mt_zeros(MT_SHAPE(2), MT_F32, rank_device(rank));
    RANK_CHECK(mt_all_gather_async(out, src) == NULL);
    RANK_CHECK(mt_last_status() == MT_ERR_UNSUPPORTED);
    mt_clear_error();
    RANK_CHECK(mt_dist_barrier() == MT_ERR_UNSUPPORTED);
    mt_clear_error();
    mt_set_requires_grad(c, true);
    RANK_CHECK(mt_ddp_new(&c, 1, NULL) == NULL && mt_last_status() == MT_ERR_UNSUPPORTED);
    mt_clear_error();
    RANK_CHECK(mt_dist_init_thread(0, 2, &(mt_dist_id){{0}}) == MT_ERR_STATE);
    mt_clear_error();
    mt_release(out);
    mt_release(src);
    mt_release(i);
    mt_release(gt);
    mt_release(g);
    mt_release(c);
    return 0;
}

static void test_threads_refused(void **state) {
    (void)state;
    run_ranks(2, refused_body);
    mt_dist_id id;
    assert_int_equal(mt_dist_init_thread(0, 2, NULL), MT_ERR_NULL);
    mt_clear_error();
    assert_int_equal(mt_dist_id_new(&id), 0);
    assert_int_equal(mt_dist_init_thread(2, 2, &id), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "rank 2 is not a rank of a world of 2");
}

/* One rank alone sees an inf gradient: with the scaler attached to the world, every rank
   skips the step and backs off the scale (the found-inf flag is all-reduced on the device);
   without it, the clean rank steps. */
static int scaler_step(bool dist, int rank, double *param, double *scale) {
    mt_tensor *p = mt_full(MT_SHAPE(2), MT_F32, rank_device(rank), 1.0);
    mt_set_requires_grad(p, true);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 4.0});
    int rc = mt_grad_scaler_set_dist(s, dist);
    mt_scope_begin();
    mt_tensor *loss = mt_sum_all(mt_mul_scalar(p, rank == 1 ? INFINITY : 1.0));
    if (rc == 0) rc = mt_backward(mt_grad_scaler_scale(s, loss), NULL);
    if (rc == 0) rc = mt_grad_scaler_minimize(s, o);
    *param = mt_item(mt_sum_all(p));
    mt_scope_end();
    *scale = mt_grad_scaler_get_scale(s);
    mt_grad_scaler_free(s);
    mt_optimizer_free(o);
    mt_release(p);
    return rc;
}

static int scaler_body(int rank, int world, char *why) {
    (void)world;
    double p, scale;
    RANK_CHECK(scaler_step(true, rank, &p, &scale) == 0);
    RANK_CHECK(p == 2.0 && scale == 2.0); /* skipped everywhere */
    RANK_CHECK(scaler_step(false, rank, &p, &scale) == 0);
    /* the control: rank 0 steps alone, so without the reduction the ranks diverge */
    RANK_CHECK(rank == 0 ? p == 2.0 - 2 * 0.5 && scale == 4.0 : p == 2.0 && scale == 2.0);
    return 0;
}

static void test_threads_scaler_skip(void **state) {
    (void)state;
    run_ranks(2, scaler_body);
}

/* ---- mt_ddp on CUDA parameters */
/* on rank r's device */
static mt_tensor *filled(int r, int ndim, const int64_t *shape, double base) {
    double v[16];
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    for (int64_t i = 0; i < n; i++) v[i] = base + 0.25 * (double)(i * 7 % 5) - 0.5;
    return mt_from_data(v, MT_F64, ndim, shape, rank_device(r));
}

static mt_tensor *cuda_param(int r, int ndim, const int64_t *shape, double base) {
    mt_tensor *d = filled(r, ndim, shape, base);
    mt_tensor *p = mt_cast(d, MT_F32);
    mt_release(d);
    mt_set_requires_grad(p, true);
    return p;
}

/* sum((x W^T + b)^2), backward */
static int loss_backward(mt_tensor *W, mt_tensor *b, mt_tensor *x) {
    mt_scope_begin();
    mt_tensor *y = mt_add(mt_matmul(x, mt_transpose(W, 0, 1)), b);
    int rc = mt_backward(mt_sum_all(mt_mul(y, y)), NULL);
    mt_scope_end();
    return rc;
}

/* Exact values of two tensors' equality (bitwise for F32 values read as doubles). */
static int same_values(mt_tensor *a, mt_tensor *b, char *why) {
    double *va = mt_test_values(a), *vb = mt_test_values(b);
    int64_t n = mt_numel(a), bad = -1;
    for (int64_t i = 0; i < n && bad < 0 && va && vb; i++)
        if (va[i] != vb[i]) bad = i;
    if (bad >= 0)
        snprintf(why, 512, "element %lld: %.9g vs %.9g", (long long)bad, va[bad], vb[bad]);
    int rc = va && vb && n == mt_numel(b) && bad < 0 ? 0 : -1;
    if (rc < 0 && bad < 0) snprintf(why, 512, "values unreadable or sizes differ");
    free(va);
    free(vb);
    return rc;
}

/* Each rank starts from its own values and input: mt_ddp_new gives every rank rank 0's
   parameters (NCCL broadcast), and after backward + mt_ddp_wait each gradient is exactly
   the average over the ranks of the local gradients (reduced by mt_all_reduce in the same
   order), in 2 buckets: 2 all-reduces a step. In a world of one: exactly the local step. */
static int ddp_body(int rank, int world, char *why) {
    mt_tensor *W = cuda_param(rank, MT_SHAPE(3, 4), rank),
              *b = cuda_param(rank, MT_SHAPE(3), 2.0 * rank);
    mt_tensor *ps[2] = {W, b};
    mt_ddp *d = mt_ddp_new(ps, 2, &(mt_ddp_opts){.bucket_mb = 40.0 / (1024 * 1024)});
    RANK_CHECK(d != NULL);
    mt_tensor *W0 = cuda_param(rank, MT_SHAPE(3, 4), 0), *b0 = cuda_param(rank, MT_SHAPE(3), 0);
    int rc = same_values(W, W0, why);
    if (rc == 0) rc = same_values(b, b0, why);
    mt_tensor *x = filled(rank, MT_SHAPE(2, 4), 1.0 + rank);
    mt_tensor *xf = mt_cast(x, MT_F32);
    /* the reference: the same parameters without DDP, reduced by hand */
    if (rc == 0) rc = loss_backward(W0, b0, xf);
    mt_tensor *gW0 = mt_grad(W0), *gb0 = mt_grad(b0);
    if (rc == 0 && world > 1) rc = mt_all_reduce(gW0, MT_REDUCE_AVG);
    if (rc == 0 && world > 1) rc = mt_all_reduce(gb0, MT_REDUCE_AVG);
    for (int step = 0; rc == 0 && step < 2; step++) {
        if (step == 1) { /* a second step on fresh gradients: buckets are reused */
            mt_zero_grad(W);
            mt_zero_grad(b);
        }
        int64_t syncs = mt_host_sync_count();
        rc = loss_backward(W, b, xf);
        if (rc == 0) rc = mt_ddp_wait(d);
        /* buckets, reduction and copies back are queued: the host never waits (the count
           is the process's, so only a world of one can check it) */
        if (rc == 0 && world == 1 && mt_host_sync_count() != syncs) {
            snprintf(why, 512, "%lld host syncs in backward + mt_ddp_wait",
                     (long long)(mt_host_sync_count() - syncs));
            rc = -1;
        }
        mt_tensor *gW = mt_grad(W), *gb = mt_grad(b);
        if (rc == 0) rc = same_values(gW, gW0, why);
        if (rc == 0) rc = same_values(gb, gb0, why);
        mt_release(gW);
        mt_release(gb);
    }
    mt_ddp_stats st = {0};
    if (rc == 0) rc = mt_ddp_stats_get(d, &st);
    if (rc == 0 && (st.buckets != 2 || st.allreduce_calls != 2 || st.steps != 2)) {
        snprintf(why, 512, "stats: %d buckets, %lld all-reduces, %lld steps", st.buckets,
                 (long long)st.allreduce_calls, (long long)st.steps);
        rc = -1;
    }
    if (rc > 0 || (rc < 0 && !why[0])) snprintf(why, 512, "mixtape error: %s", mt_last_error());
    mt_ddp_free(d);
    mt_release(gW0);
    mt_release(gb0);
    mt_release(xf);
    mt_release(x);
    mt_release(W0);
    mt_release(b0);
    mt_release(W);
    mt_release(b);
    return rc < 0 ? -1 : 0;
}

static void test_world1_ddp(void **state) {
    (void)state;
    assert_int_equal(mt_dist_init(), 0);
    char why[512] = "";
    if (ddp_body(0, 1, why) < 0) fail_msg("%s", why);
}

static void test_threads_ddp(void **state) {
    (void)state;
    run_ranks(2, ddp_body);
}

/* Rank 1's first parameter has one column more: the broadcast at creation fails on every
   rank (the fake NCCL compares the ranks' calls; a world of threads has no MPI check, and the
   real NCCL would hang: main runs this with the fake only). */
static int ddp_mismatch_body(int rank, int world, char *why) {
    (void)world;
    mt_tensor *W = cuda_param(rank, MT_SHAPE(3, 4 + rank), 0),
              *b = cuda_param(rank, MT_SHAPE(3), 0);
    mt_tensor *ps[2] = {W, b};
    mt_ddp *d = mt_ddp_new(ps, 2, NULL);
    bool refused = d == NULL && mt_last_status() == MT_ERR_STATE &&
                   strstr(mt_last_error(), "mt_ddp_new: NCCL refused the call") != NULL;
    mt_ddp_free(d);
    mt_release(W);
    mt_release(b);
    RANK_CHECK(refused);
    mt_clear_error();
    return 0;
}

static void test_threads_ddp_mismatch(void **state) {
    (void)state;
    run_ranks(2, ddp_mismatch_body);
}

/* The gradients of ps as clones (NULL where none). */
static void grads_clone(mt_tensor *const *ps, int n, mt_tensor **out) {
    for (int k = 0; k < n; k++) {
        mt_tensor *g = mt_grad(ps[k]);
        out[k] = g ? mt_clone(g) : NULL;
        mt_release(g);
    }
}

static void grads_assert_equal(mt_tensor *const *ps, int n, mt_tensor *const *want) {
    char why[512] = "";
    for (int k = 0; k < n; k++) {
        mt_tensor *g = mt_grad(ps[k]);
        if (!want[k]) assert_null(g);
        if (want[k] && (!g || same_values(g, want[k], why) < 0))
            fail_msg("parameter %d: %s", k, g ? why : "no gradient");
        mt_release(g);
    }
}

static void grads_release(mt_tensor **g, int n) {
    for (int k = 0; k < n; k++) mt_release(g[k]);
}

/* Every allocation of mt_ddp_wait on device buckets failed in turn, in a world of one: an
   F32 and an F16 parameter with gradients and an F32 one without (its slot is filled with
   zeros before the all-reduce, and the copy out makes its gradient). Each failure is
   MT_ERR_OOM naming mt_ddp_wait, changes no gradient and leaks nothing; calling mt_ddp_wait
   again finishes the step exactly like a twin step that never failed. */
static void test_world1_ddp_wait_out_of_memory(void **state) {
    (void)state;
    assert_int_equal(mt_dist_init(), 0);
    mt_tensor *d = filled(0, MT_SHAPE(6), 0.5);
    mt_tensor *ps[3] = {cuda_param(0, MT_SHAPE(3, 4), 1.0), mt_cast(d, MT_F16),
                        cuda_param(0, MT_SHAPE(3), 2.0)};
    mt_set_requires_grad(ps[1], true);
    mt_ddp *ddp = mt_ddp_new(ps, 3, NULL);
    assert_non_null(ddp);
    mt_tensor *x = filled(0, MT_SHAPE(2, 4), 1.5), *xf = mt_cast(x, MT_F32);
    mt_tensor *twin[3], *before[3];
    int64_t failures = 0, n = 0;
    for (bool never_reached = false; !never_reached; n++) {
        for (int k = 0; k < 3; k++) mt_zero_grad(ps[k]);
        mt_scope_begin();
        mt_tensor *y = mt_matmul(xf, mt_transpose(ps[0], 0, 1));
        assert_int_equal(mt_backward(mt_add(mt_sum_all(mt_mul(y, y)),
                                            mt_cast(mt_sum_all(mt_mul(ps[1], ps[1])), MT_F32)),
                                     NULL),
                         0);
        mt_scope_end();
        grads_clone(ps, 3, before);
        int64_t tensors = mt_live_tensors(), bytes = mt_live_bytes();
        mt_debug_fail_nth_alloc(n); /* n = 0: the twin, no failure */
        int rc = mt_ddp_wait(ddp);
        never_reached = n > 0 && mt_debug_fail_nth_alloc(0);
        if (rc != 0) {
            failures++;
            assert_oom_left_nothing("mt_ddp_wait", tensors, bytes);
            grads_assert_equal(ps, 3, before);
            assert_int_equal(mt_ddp_wait(ddp), 0);
        }
        grads_release(before, 3);
        if (n == 0) grads_clone(ps, 3, twin);
        grads_assert_equal(ps, 3, twin);
    }
    printf("# mt_ddp_wait on cuda:0: %lld allocations walked, %lld failed cleanly\n",
           (long long)(n - 2), (long long)failures);
    assert_true(failures > 0);
    grads_release(twin, 3);
    mt_ddp_free(ddp);
    mt_release(xf);
    mt_release(x);
    mt_release(d);
    for (int k = 0; k < 3; k++) mt_release(ps[k]);
}

/* An FP16 parameter: its bucket is FP32 on the device, and in a world of one the gradient
   comes back exactly (widened, averaged over one rank, rounded back). */
static void test_world1_ddp_half(void **state) {
    (void)state;
    assert_int_equal(mt_dist_init(), 0);
    mt_tensor *d = filled(0, MT_SHAPE(6), 0.5);
    mt_tensor *p = mt_cast(d, MT_F16);
    mt_set_requires_grad(p, true);
    mt_ddp *ddp = mt_ddp_new(&p, 1, NULL);
    assert_non_null(ddp);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(p, p)), NULL), 0);
    mt_tensor *local = mt_clone(mt_grad(p)); /* 2p, before the reduction */
    assert_int_equal(mt_ddp_wait(ddp), 0);
    char why[512] = "";
    mt_tensor *g = mt_grad(p);
    assert_int_equal(mt_dtype_of(g), MT_F16);
    if (same_values(g, local, why) < 0) fail_msg("%s", why);
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(p);
    mt_release(d);
}

/* A test of a world that does not fit this machine's GPUs, reported skipped with the reason as
   its TAP directive (cmocka 1.1.5's skip() would print "not ok", which meson counts as a
   failure: test_util.h). */
static struct CMUnitTest ranks_skipped(const char *fn, int world) {
    static char names[16][160];
    static int used;
    char *name = names[used++ % 16];
    snprintf(name, sizeof names[0],
             "%s # SKIP real NCCL needs one GPU per rank: world %d, %d GPU%s", fn, world, gpus,
             gpus == 1 ? "" : "s");
    return (struct CMUnitTest){.name = name, .test_func = mt_test_not_run};
}

static void test_nccl_missing(void **state) {
    (void)state;
    mt_dist_id id;
    assert_int_equal(mt_dist_id_new(&id), MT_ERR_UNSUPPORTED);
    assert_error(MT_ERR_UNSUPPORTED, "mt_dist_id_new: collectives on CUDA tensors need NCCL");
    assert_int_equal(mt_dist_init(), 0);
    mt_tensor *t = mt_zeros(MT_SHAPE(2), MT_F32, MT_CUDA(0));
    assert_int_equal(mt_all_reduce(t, MT_REDUCE_SUM), MT_ERR_UNSUPPORTED);
    assert_error(MT_ERR_UNSUPPORTED, "mt_all_reduce: collectives on CUDA tensors need NCCL");
    /* CPU tensors do not need it */
    mt_tensor *c = mt_ones(MT_SHAPE(2), MT_F32, MT_CPU);
    assert_int_equal(mt_all_reduce(c, MT_REDUCE_SUM), 0);
    mt_release(c);
    mt_release(t);
}

int main(void) {
    bool cuda = mt_cuda_available();
    if (getenv("MT_TEST_NCCL_MISSING")) {
        const struct CMUnitTest tests[] = {
            cuda ? (struct CMUnitTest)MT_TEST(test_nccl_missing)
                 : MT_TEST_SKIPPED(test_nccl_missing, "no CUDA device"),
        };
        int failures = MT_RUN_TESTS(tests);
        return mt_dist_finalize() < 0 || failures ? 1 : 0;
    }
    if (cuda) {
        gpus = mt_cuda_device_count();
        fake_nccl = nccl_is_fake();
    }
#define NCCL_TEST(fn)                                                                              \
    (cuda ? (struct CMUnitTest)MT_TEST(fn) : MT_TEST_SKIPPED(fn, "no CUDA device"))
#define RANKS_TEST(fn, world)                                                                      \
    (!cuda || world_fits(world) ? NCCL_TEST(fn) : ranks_skipped(#fn, world))
#define FAKE_NCCL_TEST(fn)                                                                         \
    (!cuda || fake_nccl ? NCCL_TEST(fn)                                                            \
                        : MT_TEST_SKIPPED(fn, "ranks that disagree hang the real NCCL; the fake "  \
                                              "one of the emulated device checks them"))
    const struct CMUnitTest tests[] = {
        NCCL_TEST(test_world1_process),
        RANKS_TEST(test_threads_all_reduce, 2),
        RANKS_TEST(test_threads_all_reduce_world3, 3),
        RANKS_TEST(test_threads_broadcast_gather, 2),
        RANKS_TEST(test_threads_broadcast_gather_world3, 3),
        FAKE_NCCL_TEST(test_threads_mismatch),
        RANKS_TEST(test_threads_refused, 2),
        RANKS_TEST(test_threads_scaler_skip, 2),
        NCCL_TEST(test_world1_ddp),
        RANKS_TEST(test_threads_ddp, 2),
        FAKE_NCCL_TEST(test_threads_ddp_mismatch),
        NCCL_TEST(test_world1_ddp_half),
        NCCL_TEST(test_world1_ddp_wait_out_of_memory),
    };
    int failures = MT_RUN_TESTS(tests);
    return mt_dist_finalize() < 0 || failures ? 1 : 0;
}

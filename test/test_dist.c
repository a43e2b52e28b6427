/* mt_dist collectives, run as every rank of the job (test/meson.build launches it with
   mpirun -np 2, and once alone as a world of one): values for every dtype, async works,
   agreement errors, the GradScaler's cross-rank skip, and a bounded wait. */
#include <time.h>
#include "dist_test_util.h"

static const mt_dtype all_dtypes[] = {MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL};
#define N 5

/* rank r's value of element i (small integers: exact in every dtype) */
static double value(int r, int i) {
    return (double)((r + 1) * (i + 1) % 7) - 2.0;
}

static mt_tensor *rank_tensor(mt_dtype dt, int r) {
    double v[N];
    for (int i = 0; i < N; i++) v[i] = dt == MT_BOOL ? (double)((i + r) % 3 == 0) : value(r, i);
    return mt_test_tensor(v, dt, MT_SHAPE(N));
}

static void test_all_reduce_every_dtype(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        mt_dtype dt = all_dtypes[k];
        for (int op = MT_REDUCE_SUM; op <= MT_REDUCE_AVG; op++) {
            if (op == MT_REDUCE_AVG && !mt_dtype_is_floating(dt)) continue;
            mt_tensor *t = rank_tensor(dt, me);
            assert_int_equal(mt_all_reduce(t, (mt_reduce_op)op), 0);
            double want[N];
            for (int i = 0; i < N; i++) {
                double s = 0, m = -1e300;
                for (int r = 0; r < W; r++) {
                    double v = dt == MT_BOOL ? (double)((i + r) % 3 == 0) : value(r, i);
                    s += v;
                    m = v > m ? v : m;
                }
                want[i] = op == MT_REDUCE_MAX ? m : op == MT_REDUCE_AVG ? s / W : s;
                if (dt == MT_BOOL) want[i] = want[i] != 0; /* logical or */
            }
            /* halves: one rounding of the FP32 result */
            double tol = dt == MT_F16 ? 1e-3 : dt == MT_BF16 ? 1e-2 : 0;
            assert_tensor_close(t, want, N, tol, tol);
            mt_release(t);
        }
    }
}

static void test_broadcast_and_gather_every_dtype(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank(), root = W - 1;
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        mt_dtype dt = all_dtypes[k];
        mt_tensor *t = rank_tensor(dt, me), *expect = rank_tensor(dt, root);
        assert_int_equal(mt_broadcast(t, root), 0);
        double *want = mt_test_values(expect);
        assert_tensor_close(t, want, N, 0, 0);
        free(want);
        mt_release(t);
        mt_release(expect);

        mt_tensor *mine = rank_tensor(dt, me);
        mt_tensor *all = mt_all_gather(mine);
        assert_non_null(all);
        assert_int_equal(mt_ndim(all), 2);
        assert_int_equal(mt_dim(all, 0), W);
        double *got = mt_test_values(all);
        for (int r = 0; r < W; r++) {
            mt_tensor *ref = rank_tensor(dt, r);
            double *rv = mt_test_values(ref);
            for (int i = 0; i < N; i++) assert_true(got[r * N + i] == rv[i]);
            free(rv);
            mt_release(ref);
        }
        free(got);
        mt_release(all);
        mt_release(mine);
    }
}

static void test_async_works(void **state) {
    (void)state;
    int W = mt_dist_world_size();
    mt_tensor *a = mt_full(MT_SHAPE(1000), MT_F32, MT_CPU, 1.0);
    mt_tensor *b = mt_full(MT_SHAPE(3), MT_BF16, MT_CPU, 2.0);
    mt_dist_work *wa = mt_all_reduce_async(a, MT_REDUCE_SUM);
    mt_dist_work *wb = mt_all_reduce_async(b, MT_REDUCE_AVG);
    assert_non_null(wa);
    assert_non_null(wb);
    assert_int_equal(mt_dist_wait(wb), 0);
    assert_int_equal(mt_dist_wait(wa), 0);
    mt_scope_begin();
    assert_true(mt_item(mt_sum_all(a)) == 1000.0 * W);
    assert_true(mt_item(mt_sum_all(b)) == 6.0);
    mt_scope_end();
    mt_release(a);
    mt_release(b);
    assert_int_equal(mt_dist_barrier(), 0);
}

static void test_collective_errors(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    assert_int_equal(mt_all_reduce(NULL, MT_REDUCE_SUM), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_all_reduce: arg 1");
    mt_tensor *i = mt_zeros(MT_SHAPE(2), MT_I32, MT_CPU);
    assert_int_equal(mt_all_reduce(i, MT_REDUCE_AVG), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "avg of i32");
    assert_int_equal(mt_broadcast(i, W), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "is not a rank");
    mt_tensor *m = mt_zeros(MT_SHAPE(3, 2), MT_F32, MT_CPU);
    mt_tensor *tr = mt_transpose(m, 0, 1);
    assert_int_equal(mt_all_reduce(tr, MT_REDUCE_SUM), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "not contiguous");
    /* the ranks disagree on the element count: an error on every rank, no exchange */
    mt_tensor *odd = mt_zeros(MT_SHAPE(2 + me), MT_F32, MT_CPU);
    if (W > 1) {
        assert_int_equal(mt_all_reduce(odd, MT_REDUCE_SUM), MT_ERR_SHAPE);
        assert_error(MT_ERR_SHAPE, "ranks disagree on the element count");
        /* and on the dtype */
        mt_tensor *d = mt_zeros(MT_SHAPE(2), me ? MT_F64 : MT_F32, MT_CPU);
        assert_int_equal(mt_broadcast(d, 0), MT_ERR_SHAPE);
        assert_error(MT_ERR_SHAPE, "ranks disagree on the dtype");
        mt_release(d);
    }
    /* still usable afterwards */
    assert_int_equal(mt_all_reduce(m, MT_REDUCE_MAX), 0);
    mt_release(odd);
    mt_release(tr);
    mt_release(m);
    mt_release(i);
}

/* A call that fails its own checks on one rank alone (rank 1 here) still takes part in the
   agreement: the other ranks fail with MT_ERR_SHAPE, nothing is exchanged, and the ranks stay
   in step (the next collective pairs with the same one on every rank). */
static void test_one_rank_fails_its_checks(void **state) {
    (void)state;
    int W = mt_dist_world_size(), me = mt_dist_rank();
    mt_tensor *m = mt_full(MT_SHAPE(2, 2), MT_F32, MT_CPU, 1.0);
    mt_tensor *tr = mt_transpose(m, 0, 1);
    mt_tensor *other = mt_full(MT_SHAPE(4), MT_F32, MT_CPU, 100.0);
    /* a non-contiguous tensor, a bad root, a bad op, a NULL gather input */
    int rc0 = mt_all_reduce(me == 1 ? tr : m, MT_REDUCE_SUM);
    int rc1 = mt_broadcast(m, me == 1 ? W : 0);
    int rc2 = mt_all_reduce(m, me == 1 ? (mt_reduce_op)42 : MT_REDUCE_SUM);
    assert_int_equal(rc0, me == 1 ? MT_ERR_INVALID : MT_ERR_SHAPE);
    assert_int_equal(rc1, me == 1 ? MT_ERR_INVALID : MT_ERR_SHAPE);
    assert_int_equal(rc2, me == 1 ? MT_ERR_INVALID : MT_ERR_SHAPE);
    if (me == 1)
        assert_error(MT_ERR_INVALID, "not contiguous");
    else
        assert_error(MT_ERR_SHAPE, "failed on another rank before the exchange");
    mt_tensor *g = mt_all_gather(me == 1 ? NULL : m);
    assert_null(g);
    assert_error(me == 1 ? MT_ERR_NULL : MT_ERR_SHAPE, me == 1 ? "arg 1" : "another rank");
    /* nothing was exchanged, and the ranks are in step */
    mt_scope_begin();
    assert_true(mt_item(mt_sum_all(m)) == 4.0);
    assert_int_equal(mt_all_reduce(other, MT_REDUCE_SUM), 0);
    assert_true(mt_item(mt_sum_all(other)) == 400.0 * W);
    mt_scope_end();
    mt_release(other);
    mt_release(tr);
    mt_release(m);
}

/* mt_dist_finalize under a work not yet waited for refuses (MPI would crash under its
   request) and changes nothing: the work still finishes, the world still runs. */
static void test_finalize_refuses_work_in_flight(void **state) {
    (void)state;
    mt_tensor *a = mt_full(MT_SHAPE(1000), MT_F32, MT_CPU, 1.0);
    mt_dist_work *w = mt_all_reduce_async(a, MT_REDUCE_SUM);
    assert_non_null(w);
    assert_int_equal(mt_dist_finalize(), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "1 collective(s) started with mt_*_async are still in flight");
    assert_true(mt_dist_is_initialized());
    assert_int_equal(mt_dist_wait(w), 0);
    mt_scope_begin();
    assert_true(mt_item(mt_sum_all(a)) == 1000.0 * mt_dist_world_size());
    mt_scope_end();
    mt_release(a);
    assert_int_equal(mt_dist_barrier(), 0);
}

/* A CUDA tensor goes through NCCL (test_nccl covers it fully): in a world of one the sum is
   the tensor itself. */
static void test_cuda_tensor_through_nccl(void **state) {
    (void)state;
    mt_tensor *t = mt_full(MT_SHAPE(2), MT_F32, MT_CUDA(0), 3.0);
    assert_non_null(t);
    assert_int_equal(mt_all_reduce(t, MT_REDUCE_SUM), 0);
    mt_scope_begin();
    assert_true(mt_item(mt_sum_all(t)) == 6.0);
    mt_scope_end();
    mt_release(t);
}

/* One rank alone sees an inf gradient: with the scaler attached to the world, every rank
   skips the step and backs off the scale; without it, the clean rank would step. */
static void run_scaler_step(bool dist, int bad_rank, double *param_after, double *scale_after) {
    mt_tensor *p = mt_full(MT_SHAPE(2), MT_F32, MT_CPU, 1.0);
    mt_set_requires_grad(p, true);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 4.0});
    assert_int_equal(mt_grad_scaler_set_dist(s, dist), 0);
    mt_scope_begin();
    mt_tensor *loss = mt_sum_all(mt_mul_scalar(p, mt_dist_rank() == bad_rank ? INFINITY : 1.0));
    assert_int_equal(mt_backward(mt_grad_scaler_scale(s, loss), NULL), 0);
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    mt_scope_end();
    mt_scope_begin();
    *param_after = mt_item(mt_sum_all(p));
    mt_scope_end();
    *scale_after = mt_grad_scaler_get_scale(s);
    mt_grad_scaler_free(s);
    mt_optimizer_free(o);
    mt_release(p);
}

static void test_scaler_skips_on_every_rank(void **state) {
    (void)state;
    double p, scale;
    run_scaler_step(true, 1, &p, &scale);
    assert_true(p == 2.0);     /* skipped: unchanged */
    assert_true(scale == 2.0); /* backed off */
    /* the control: without the all-reduce rank 0 steps (the test above can fail) */
    run_scaler_step(false, 1, &p, &scale);
    assert_true(mt_dist_rank() == 0 ? p == 2.0 - 2 * 0.5 : p == 2.0);
    assert_true(mt_dist_rank() == 0 ? scale == 4.0 : scale == 2.0);
    /* so the ranks would have diverged */
    mt_tensor *t = mt_full(MT_SHAPE(1), MT_F64, MT_CPU, p);
    mt_tensor *all = mt_all_gather(t);
    double *v = mt_test_values(all);
    assert_true(v[0] != v[1]);
    free(v);
    mt_release(all);
    mt_release(t);
}

/* A rank whose step fails before the found-inf exchange (here an earlier error is pending)
   still takes part in it: the other ranks fail their step at once instead of waiting until
   the timeout, every rank keeps its parameters and scale, and the world stays usable. The
   same for an explicit unscale. */
static void test_scaler_failure_on_one_rank(void **state) {
    (void)state;
    mt_tensor *p = mt_full(MT_SHAPE(2), MT_F32, MT_CPU, 1.0);
    mt_set_requires_grad(p, true);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 4.0});
    assert_int_equal(mt_grad_scaler_set_dist(s, true), 0);
    for (int unscale_first = 0; unscale_first < 2; unscale_first++) {
        mt_scope_begin();
        assert_int_equal(mt_backward(mt_grad_scaler_scale(s, mt_sum_all(p)), NULL), 0);
        if (mt_dist_rank() == 1) /* a failed op whose error nobody checked */
            assert_null(mt_add(p, mt_zeros(MT_SHAPE(3), MT_F32, MT_CPU)));
        int rc = unscale_first ? mt_grad_scaler_unscale(s, o) : mt_grad_scaler_minimize(s, o);
        if (mt_dist_rank() == 1) { /* the first error sticks */
            assert_int_equal(rc, MT_ERR_STATE);
            assert_error(MT_ERR_SHAPE, "mt_add");
        } else { /* at once, not MT_ERR_TIMEOUT */
            assert_int_equal(rc, MT_ERR_SHAPE);
            assert_error(MT_ERR_SHAPE, "failed on another rank before the exchange");
        }
        mt_scope_end();
        mt_clear_error();
        mt_scope_begin();
        assert_true(mt_item(mt_sum_all(p)) == 2.0); /* not stepped */
        mt_scope_end();
        assert_true(mt_grad_scaler_get_scale(s) == 4.0); /* neither backed off nor grown */
        /* the next step runs normally on every rank */
        assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
        mt_scope_begin();
        assert_true(mt_item(mt_sum_all(p)) == 2.0 - 2 * 0.5);
        mt_scope_end();
        mt_optimizer_zero_grad(o);
        bool prev = mt_set_grad_enabled(false);
        assert_int_equal(mt_fill(p, 1.0), 0);
        mt_set_grad_enabled(prev);
    }
    assert_int_equal(mt_dist_barrier(), 0);
    mt_grad_scaler_free(s);
    mt_optimizer_free(o);
    mt_release(p);
}

/* Last: a peer that joins a barrier late gives a bounded MT_ERR_TIMEOUT on the waiting rank,
   which then refuses further collectives; the late peer completes the barrier, so both can
   still finalize. */
static void test_timeout_is_bounded(void **state) {
    (void)state;
    double saved = mt_dist_timeout();
    if (mt_dist_rank() == 0) {
        assert_int_equal(mt_dist_set_timeout(0.5), 0);
        assert_int_equal(mt_dist_barrier(), MT_ERR_TIMEOUT);
        assert_error(MT_ERR_TIMEOUT, "waited 0.5 s and a peer never joined");
        mt_tensor *t = mt_zeros(MT_SHAPE(1), MT_F32, MT_CPU);
        assert_int_equal(mt_all_reduce(t, MT_REDUCE_SUM), MT_ERR_STATE);
        assert_error(MT_ERR_STATE, "unusable after an earlier failure");
        mt_release(t);
    } else {
        struct timespec ts = {1, 500000000};
        nanosleep(&ts, NULL);
        assert_int_equal(mt_dist_barrier(), 0);
    }
    assert_int_equal(mt_dist_set_timeout(saved), 0);
    assert_int_equal(mt_dist_set_timeout(0), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "not a number of seconds in (0, 1e+09]");
    /* an endless wait is not a timeout (it made the progress thread's deadline invalid) */
    assert_int_equal(mt_dist_set_timeout(INFINITY), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "arg 1: inf is not a number of seconds");
    assert_int_equal(mt_dist_set_timeout(1e19), MT_ERR_INVALID);
    mt_clear_error();
    assert_true(mt_dist_timeout() == saved);
}

/* What main saw before joining the job: a collective before mt_dist_init, and (without a
   launcher) a torchrun-style WORLD_SIZE=2, which this build cannot serve. */
typedef struct {
    int status;
    char msg[256];
} probe;
static probe before_init, torchrun_env;

static void record(int rc, probe *out) {
    out->status = rc;
    snprintf(out->msg, sizeof out->msg, "%s", mt_last_error());
    mt_clear_error();
}

static void probe_before_init(void) {
    mt_tensor *t = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU);
    record(mt_all_reduce(t, MT_REDUCE_SUM), &before_init);
    mt_release(t);
    torchrun_env.status = 1; /* not probed: launched by mpirun */
    if (!getenv("OMPI_COMM_WORLD_SIZE")) {
        setenv("WORLD_SIZE", "2", 1);
        record(mt_dist_init(), &torchrun_env);
        unsetenv("WORLD_SIZE");
    }
}

static void test_before_init(void **state) {
    (void)state;
    assert_int_equal(before_init.status, MT_ERR_STATE);
    assert_non_null(strstr(before_init.msg, "mt_all_reduce: call mt_dist_init first"));
    if (torchrun_env.status != 1) {
        assert_int_equal(torchrun_env.status, MT_ERR_UNSUPPORTED);
        assert_non_null(strstr(torchrun_env.msg, "WORLD_SIZE=2 but no MPI launcher"));
    }
}

int main(void) {
    probe_before_init();
    mt_test_dist_begin();
    const struct CMUnitTest tests[] = {
        MT_TEST(test_before_init),
        MT_TEST(test_all_reduce_every_dtype),
        MT_TEST(test_broadcast_and_gather_every_dtype),
        MT_TEST(test_async_works),
        MT_TEST(test_collective_errors),
        !mt_cuda_available() ? MT_TEST_SKIPPED(test_cuda_tensor_through_nccl, "no CUDA device")
        : mt_dist_world_size() > 1
            ? MT_TEST_SKIPPED(test_cuda_tensor_through_nccl,
                              "the emulated NCCL joins threads, not processes: test_nccl")
            : (struct CMUnitTest)MT_TEST(test_cuda_tensor_through_nccl),
        MT_TEST_MULTI_RANK(test_one_rank_fails_its_checks),
        MT_TEST_MULTI_RANK(test_finalize_refuses_work_in_flight),
        MT_TEST_MULTI_RANK(test_scaler_skips_on_every_rank),
        MT_TEST_MULTI_RANK(test_scaler_failure_on_one_rank),
        MT_TEST_MULTI_RANK(test_timeout_is_bounded),
    };
    return mt_test_dist_end(MT_RUN_TESTS(tests));
}

/* GradScaler, the scaler's own rules: defaults and options, scaling the loss, the dynamic
   scale (backoff, growth, bounds, backoff_after), the state machine and its errors,
   checkpoints, the disabled scaler and the counters. What unscale and step do to gradients,
   parameters, masters and optimizer state is in test_grad_scaler_step.c. */
#include "grad_scaler_helpers.h"

/* ------------------------------------------------------------------ defaults and options */

static void test_defaults(void **state) {
    (void)state;
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    assert_non_null(s);
    assert_true(mt_grad_scaler_get_scale(s) == 65536.0f);
    mt_grad_scaler_state st;
    assert_int_equal(mt_grad_scaler_state_get(s, &st), 0);
    assert_true(st.scale == 65536.0);
    assert_int_equal(st.good_steps, 0);
    assert_int_equal(st.bad_steps, 0);
    assert_int_equal(st.skipped_steps, 0);
    assert_int_equal(mt_grad_scaler_skipped_steps(s), 0);
    assert_false(mt_grad_scaler_last_step_skipped(s));
    mt_grad_scaler_free(s);
    /* zero fields mean defaults; others are taken */
    s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 128, .growth_interval = 3});
    assert_true(mt_grad_scaler_get_scale(s) == 128.0f);
    mt_grad_scaler_free(s);
    mt_grad_scaler_free(NULL);
    assert_no_error();
}

static void test_bad_options(void **state) {
    (void)state;
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.min_scale = 8, .max_scale = 4}));
    assert_error(MT_ERR_INVALID, "min_scale 8 and max_scale 4");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.max_scale = 1e39}));
    assert_error(MT_ERR_INVALID, "FLT_MAX");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.min_scale = -1}));
    assert_error(MT_ERR_INVALID, "min_scale -1");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 0.5}));
    assert_error(MT_ERR_INVALID, "init_scale 0.5 is outside [min_scale 1, max_scale 1.67772e+07]");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = NAN}));
    assert_error(MT_ERR_INVALID, "init_scale nan");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.growth_factor = 0.5}));
    assert_error(MT_ERR_INVALID, "growth_factor 0.5");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.backoff_factor = 1.5}));
    assert_error(MT_ERR_INVALID, "backoff_factor 1.5 must be in (0, 1]");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.growth_interval = -3}));
    assert_error(MT_ERR_INVALID, "growth_interval -3");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.backoff_after = -1}));
    assert_error(MT_ERR_INVALID, "backoff_after -1");
    /* the F32 growth tracker stops at 2^24: a longer interval would never grow the scale */
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.growth_interval = 16777218}));
    assert_error(MT_ERR_INVALID,
                 "growth_interval 16777218 and backoff_after 1 must be in [1, 2^24]");
    assert_null(mt_grad_scaler_new(&(mt_grad_scaler_opts){.min_scale = 1e-50, .init_scale = 1}));
    assert_error(MT_ERR_INVALID, "min_scale 1e-50 is 0 in F32");
}

static void test_null_arguments(void **state) {
    (void)state;
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    mt_tensor *loss = mt_scalar(1.0, MT_F32, mt_test_device());
    assert_null(mt_grad_scaler_scale(NULL, loss));
    assert_error(MT_ERR_NULL, "mt_grad_scaler_scale: arg 1: scaler is NULL");
    assert_null(mt_grad_scaler_scale(s, NULL)); /* NULL in, NULL out, error untouched */
    assert_no_error();
    assert_int_equal(mt_grad_scaler_unscale(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_grad_scaler_unscale: arg 2: optimizer is NULL");
    assert_int_equal(mt_grad_scaler_step(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_grad_scaler_step: arg 2: optimizer is NULL");
    assert_int_equal(mt_grad_scaler_minimize(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "arg 2: optimizer is NULL");
    assert_int_equal(mt_grad_scaler_unscale(NULL, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "arg 1: scaler is NULL");
    assert_int_equal(mt_grad_scaler_update(NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_grad_scaler_update: arg 1: scaler is NULL");
    assert_true(isnan(mt_grad_scaler_get_scale(NULL)));
    assert_error(MT_ERR_NULL, "mt_grad_scaler_get_scale");
    assert_false(mt_grad_scaler_last_step_skipped(NULL));
    assert_error(MT_ERR_NULL, "scaler is NULL");
    assert_int_equal(mt_grad_scaler_skipped_steps(NULL), -1);
    assert_error(MT_ERR_NULL, "scaler is NULL");
    assert_int_equal(mt_grad_scaler_state_get(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_grad_scaler_state_get: arg 2");
    assert_int_equal(mt_grad_scaler_state_set(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_grad_scaler_state_set: arg 2");
    mt_release(loss);
    mt_grad_scaler_free(s);
}

/* ------------------------------------------------------------------ scale */

static void test_scale_loss(void **state) {
    (void)state;
    mt_scope_begin();
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    mt_tensor *p = param((const double[]){1, -2, 3}, 3, MT_F32);
    mt_tensor *loss = mt_sum_all(mt_mul(p, p)); /* 14, grad 2p */
    mt_tensor *scaled = mt_grad_scaler_scale(s, loss);
    assert_int_equal(mt_dtype_of(scaled), MT_F32);
    assert_same(scaled, ((const double[]){14.0 * 65536}), 1);
    assert_int_equal(mt_backward(scaled, NULL), 0);
    assert_same(mt_grad(p), ((const double[]){2 * 65536.0, -4 * 65536.0, 6 * 65536.0}), 3);

    /* the result keeps the loss's dtype, also inside an O2 region */
    mt_grad_scaler *s2 = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
    mt_tensor *l16 = mt_scalar(2.5, MT_F16, mt_test_device()),
              *lbf = mt_scalar(2.5, MT_BF16, mt_test_device());
    mt_tensor *l64 = mt_scalar(2.5, MT_F64, mt_test_device()),
              *l32 = mt_scalar(2.5, MT_F32, mt_test_device());
    mt_tensor *r16 = mt_grad_scaler_scale(s2, l16), *rbf = mt_grad_scaler_scale(s2, lbf);
    mt_tensor *r64 = mt_grad_scaler_scale(s2, l64);
    mt_autocast_begin(MT_F16, MT_AMP_O2);
    mt_tensor *r32 = mt_grad_scaler_scale(s2, l32);
    mt_autocast_end();
    assert_int_equal(mt_dtype_of(r16), MT_F16);
    assert_int_equal(mt_dtype_of(rbf), MT_BF16);
    assert_int_equal(mt_dtype_of(r64), MT_F64);
    assert_int_equal(mt_dtype_of(r32), MT_F32);
    assert_same(r16, ((const double[]){2560}), 1);
    assert_same(rbf, ((const double[]){2560}), 1);
    assert_same(r64, ((const double[]){2560}), 1);
    assert_same(r32, ((const double[]){2560}), 1);

    mt_tensor *labels = mt_from_data((const int64_t[]){1}, MT_I64, MT_SHAPE(1), mt_test_device());
    assert_null(mt_grad_scaler_scale(s2, labels));
    assert_error(MT_ERR_DTYPE,
                 "mt_grad_scaler_scale: arg 2: loss must be a floating tensor, got i64");
    mt_grad_scaler_free(s);
    mt_grad_scaler_free(s2);
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ dynamic scale */

typedef struct {
    mt_grad_scaler *s;
    mt_optimizer *o;
    mt_tensor *p;
} rig;

static rig rig_new(const mt_grad_scaler_opts *opts) {
    rig r;
    r.p = param((const double[]){1, 2}, 2, MT_F32);
    r.o = mt_sgd_new(&r.p, 1, &(mt_sgd_opts){.lr = MT_SET(0.01)});
    r.s = mt_grad_scaler_new(opts);
    assert_non_null(r.o);
    assert_non_null(r.s);
    return r;
}

static void rig_free(rig *r) {
    mt_optimizer_free(r->o);
    mt_grad_scaler_free(r->s);
    mt_test_drop(r->p);
}

/* One step with a clean (bad = false) or an inf gradient. */
static void rig_step(rig *r, bool bad) {
    set_grad(r->p, (const double[]){0.5, 0.25}, mt_grad_scaler_get_scale(r->s), bad ? INFINITY : 0);
    assert_int_equal(mt_grad_scaler_minimize(r->s, r->o), 0);
    assert_int_equal(mt_grad_scaler_last_step_skipped(r->s), bad);
}

static void expect_state(rig *r, double scale, int64_t good, int64_t bad, int64_t skipped) {
    mt_grad_scaler_state st;
    assert_int_equal(mt_grad_scaler_state_get(r->s, &st), 0);
    if (st.scale != scale || st.good_steps != good || st.bad_steps != bad ||
        st.skipped_steps != skipped)
        fail_msg("state {%g, %lld, %lld, %lld}, expected {%g, %lld, %lld, %lld}", st.scale,
                 (long long)st.good_steps, (long long)st.bad_steps, (long long)st.skipped_steps,
                 scale, (long long)good, (long long)bad, (long long)skipped);
}

static void test_growth(void **state) {
    (void)state;
    rig r = rig_new(&(mt_grad_scaler_opts){.init_scale = 1024, .growth_interval = 3});
    rig_step(&r, false);
    rig_step(&r, false);
    expect_state(&r, 1024, 2, 0, 0);
    rig_step(&r, false);
    expect_state(&r, 2048, 0, 0, 0);
    rig_step(&r, false);
    rig_step(&r, false);
    expect_state(&r, 2048, 2, 0, 0);
    rig_step(&r, true); /* an inf resets the run */
    expect_state(&r, 1024, 0, 0, 1);
    rig_step(&r, false);
    rig_step(&r, false);
    expect_state(&r, 1024, 2, 0, 1);
    rig_step(&r, false);
    expect_state(&r, 2048, 0, 0, 1);
    rig_free(&r);
    assert_no_error();
}

static void test_backoff_default(void **state) {
    (void)state;
    rig r = rig_new(NULL);
    rig_step(&r, true);
    assert_true(mt_grad_scaler_get_scale(r.s) == 32768.0f);
    rig_step(&r, true);
    expect_state(&r, 16384, 0, 0, 2);
    rig_free(&r);
    assert_no_error();
}

static void test_bounds(void **state) {
    (void)state;
    /* never under min_scale */
    rig r = rig_new(&(mt_grad_scaler_opts){.init_scale = 4, .min_scale = 2});
    rig_step(&r, true);
    expect_state(&r, 2, 0, 0, 1);
    rig_step(&r, true);
    expect_state(&r, 2, 0, 0, 2);
    rig_free(&r);
    /* never over max_scale: a growth past it stops at it */
    r = rig_new(&(mt_grad_scaler_opts){
        .init_scale = 8, .max_scale = 20, .growth_factor = 2, .growth_interval = 1});
    rig_step(&r, false);
    expect_state(&r, 16, 0, 0, 0);
    rig_step(&r, false);
    expect_state(&r, 20, 0, 0, 0);
    rig_step(&r, false);
    expect_state(&r, 20, 0, 0, 0);
    rig_free(&r);
    /* defaults: 2^24 is the ceiling; a growth that is not finite in f32 keeps the old scale
       (torch and Paddle), even under a max_scale it would otherwise clamp to */
    r = rig_new(&(mt_grad_scaler_opts){.init_scale = 16777216, .growth_interval = 1});
    rig_step(&r, false);
    expect_state(&r, 16777216, 0, 0, 0);
    rig_free(&r);
    r = rig_new(&(mt_grad_scaler_opts){
        .init_scale = 1e38, .max_scale = 3e38, .growth_factor = 1e10, .growth_interval = 1});
    set_grad(r.p, (const double[]){0, 0}, 1, 0); /* grad * 1e38 would overflow: use zeros */
    assert_int_equal(mt_grad_scaler_minimize(r.s, r.o), 0);
    assert_true(mt_grad_scaler_get_scale(r.s) == 1e38f);
    rig_free(&r);
    /* bounds F32 cannot hold exactly: the scale clamped to one (as F32 holds it) is inside
       them, so the state reads back, sets again, saves and loads */
    for (int top = 0; top < 2; top++) {
        r = rig_new(top ? &(mt_grad_scaler_opts){.init_scale = 25000.1,
                                                 .max_scale = 100000.1,
                                                 .growth_interval = 1}
                        : &(mt_grad_scaler_opts){.init_scale = 4e-4, .min_scale = 1e-4});
        for (int k = 0; k < 3; k++) rig_step(&r, !top);
        mt_grad_scaler_state st;
        assert_int_equal(mt_grad_scaler_state_get(r.s, &st), 0);
        assert_true(st.scale == (top ? 100000.1f : 1e-4f));
        assert_int_equal(mt_grad_scaler_state_set(r.s, &st), 0);
        mt_state *saved = mt_state_new();
        assert_int_equal(mt_grad_scaler_state_save(r.s, saved, "sc."), 0);
        assert_int_equal(mt_grad_scaler_state_load(r.s, saved, "sc."), 0);
        assert_true(mt_grad_scaler_get_scale(r.s) == (top ? 100000.1f : 1e-4f));
        /* a file whose bound is the value as given (saved before bounds were rounded) */
        mt_tensor *given = mt_scalar(top ? 100000.1 : 1e-4, MT_F64, MT_CPU);
        assert_int_equal(mt_state_put(saved, top ? "sc.max_scale" : "sc.min_scale", given), 0);
        mt_release(given);
        assert_int_equal(mt_grad_scaler_state_load(r.s, saved, "sc."), 0);
        mt_state_free(saved);
        rig_free(&r);
    }
    /* a scale equal to a bound F32 cannot hold exactly is inside it (both round alike) */
    mt_grad_scaler *edge = mt_grad_scaler_new(
        &(mt_grad_scaler_opts){.init_scale = 0.7, .min_scale = 0.5, .max_scale = 0.7});
    assert_non_null(edge);
    assert_int_equal(mt_grad_scaler_state_set(edge, &(mt_grad_scaler_state){.scale = 0.7}), 0);
    mt_grad_scaler_free(edge);
    assert_no_error();
}

static void test_backoff_after_two(void **state) {
    (void)state;
    rig r = rig_new(&(mt_grad_scaler_opts){.init_scale = 1024, .backoff_after = 2});
    rig_step(&r, true);
    expect_state(&r, 1024, 0, 1, 1); /* one bad step: no backoff yet */
    rig_step(&r, false);
    expect_state(&r, 1024, 1, 0, 1); /* a clean step breaks the run */
    rig_step(&r, true);
    expect_state(&r, 1024, 0, 1, 2);
    rig_step(&r, true);
    expect_state(&r, 512, 0, 0, 3);
    rig_free(&r);
    assert_no_error();
}

static void test_skipped_counters(void **state) {
    (void)state;
    rig r = rig_new(NULL);
    assert_false(mt_grad_scaler_last_step_skipped(r.s));
    rig_step(&r, true);
    rig_step(&r, false);
    assert_int_equal(mt_grad_scaler_skipped_steps(r.s), 1);
    /* nan counts too */
    set_grad(r.p, (const double[]){0.5, 0.25}, mt_grad_scaler_get_scale(r.s), NAN);
    assert_int_equal(mt_grad_scaler_minimize(r.s, r.o), 0);
    assert_true(mt_grad_scaler_last_step_skipped(r.s));
    rig_step(&r, false);
    assert_int_equal(mt_grad_scaler_skipped_steps(r.s), 2);
    assert_true(mt_grad_scaler_get_scale(r.s) == 16384.0f);
    rig_free(&r);
    assert_no_error();
}

/* ------------------------------------------------------------------ state machine */

static void test_state_errors(void **state) {
    (void)state;
    rig r = rig_new(NULL);
    /* update before any step */
    assert_int_equal(mt_grad_scaler_update(r.s), MT_ERR_STATE);
    assert_error(MT_ERR_STATE,
                 "mt_grad_scaler_update: no mt_grad_scaler_step or unscale since the last update");

    set_grad(r.p, (const double[]){0.5, 0.25}, 65536, 0);
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), 0);
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_grad_scaler_unscale: already called for this optimizer");
    mt_tensor *g = mt_grad(r.p); /* unscaled once, not twice */
    assert_same(g, ((const double[]){0.5, 0.25}), 2);
    mt_release(g);
    assert_int_equal(mt_grad_scaler_step(r.s, r.o), 0);
    assert_int_equal(mt_grad_scaler_step(r.s, r.o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE,
                 "mt_grad_scaler_step: already called for this optimizer since the last update");
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_grad_scaler_unscale: called after mt_grad_scaler_step");
    assert_int_equal(mt_grad_scaler_update(r.s), 0);
    assert_int_equal(mt_grad_scaler_update(r.s), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "no mt_grad_scaler_step or unscale since the last update");
    /* the parameter moved once, by the unscaled gradient */
    assert_tensor_close(r.p, ((const double[]){1 - 0.01 * 0.5, 2 - 0.01 * 0.25}), 2, 1e-7, 0);
    /* after update a new step starts cleanly */
    rig_step(&r, false);
    /* a step with no gradient at all (torch: "No inf checks were recorded") is refused and
       counts for nothing: the parameter, the scale and the counters stay */
    mt_zero_grad(r.p);
    mt_grad_scaler_state before, after;
    assert_int_equal(mt_grad_scaler_state_get(r.s, &before), 0);
    double *p_before = mt_test_values(r.p);
    assert_int_equal(mt_grad_scaler_step(r.s, r.o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE,
                 "mt_grad_scaler_step: none of the optimizer's 1 parameters has a gradient");
    assert_int_equal(mt_grad_scaler_update(r.s), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "no mt_grad_scaler_step or unscale since the last update");
    assert_int_equal(mt_grad_scaler_state_get(r.s, &after), 0);
    assert_memory_equal(&before, &after, sizeof before);
    assert_tensor_close(r.p, p_before, 2, 0, 0);
    /* so is an unscale with no gradient: it would let the next step apply a later
       backward's gradients unchecked and still scaled */
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE,
                 "mt_grad_scaler_unscale: none of the optimizer's 1 parameters has a gradient");
    mt_state *saved = mt_state_new(); /* no step left open: the state saves */
    assert_int_equal(mt_grad_scaler_state_save(r.s, saved, "sc."), 0);
    mt_state_free(saved);
    set_grad(r.p, (const double[]){0.5, 0.25}, 65536, INFINITY);
    assert_int_equal(mt_grad_scaler_step(r.s, r.o), 0); /* checks: skipped */
    assert_int_equal(mt_grad_scaler_update(r.s), 0);
    assert_true(mt_grad_scaler_last_step_skipped(r.s));
    assert_tensor_close(r.p, p_before, 2, 0, 0);
    free(p_before);
    /* an unscale that saw an inf, its step skipped by the loop: update backs off (torch) */
    assert_int_equal(mt_grad_scaler_state_get(r.s, &before), 0);
    set_grad(r.p, (const double[]){0.5, 0.25}, before.scale, INFINITY);
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), 0);
    assert_true(mt_grad_scaler_last_step_skipped(r.s));
    assert_int_equal(mt_grad_scaler_update(r.s), 0);
    assert_int_equal(mt_grad_scaler_state_get(r.s, &after), 0);
    assert_true(after.scale == before.scale / 2 && after.skipped_steps == before.skipped_steps + 1);
    /* and a clean one counts toward growth */
    set_grad(r.p, (const double[]){0.5, 0.25}, after.scale, 0);
    assert_int_equal(mt_grad_scaler_unscale(r.s, r.o), 0);
    assert_false(mt_grad_scaler_last_step_skipped(r.s));
    assert_int_equal(mt_grad_scaler_update(r.s), 0);
    assert_int_equal(mt_grad_scaler_state_get(r.s, &before), 0);
    assert_true(before.scale == after.scale && before.good_steps == after.good_steps + 1);
    rig_step(&r, false); /* and the next step with gradients runs */
    rig_free(&r);
    assert_no_error();
}

/* ------------------------------------------------------------------ checkpoints */

static void test_state_export_import(void **state) {
    (void)state;
    mt_grad_scaler_opts opts = {.growth_interval = 3};
    rig r = rig_new(&opts);
    rig_step(&r, false);
    rig_step(&r, false);
    rig_step(&r, true);
    rig_step(&r, false);
    mt_grad_scaler_state st;
    assert_int_equal(mt_grad_scaler_state_get(r.s, &st), 0);
    assert_true(st.scale == 32768);
    assert_int_equal(st.good_steps, 1);
    assert_int_equal(st.skipped_steps, 1);

    /* import before the new scaler made its device state */
    rig q = rig_new(&opts);
    assert_int_equal(mt_grad_scaler_state_set(q.s, &st), 0);
    expect_state(&q, 32768, 1, 0, 1);
    assert_true(mt_grad_scaler_get_scale(q.s) == 32768.0f);
    rig_step(&q, false);
    rig_step(&q, false); /* 1 + 2 clean steps: grows */
    expect_state(&q, 65536, 0, 0, 1);

    /* import into a scaler already in use */
    assert_int_equal(mt_grad_scaler_state_set(r.s, &(mt_grad_scaler_state){1024, 2, 0, 5}), 0);
    expect_state(&r, 1024, 2, 0, 5);
    assert_int_equal(mt_grad_scaler_skipped_steps(r.s), 5);
    rig_step(&r, false);
    expect_state(&r, 2048, 0, 0, 5);

    assert_true(mt_grad_scaler_state_set(r.s, &(mt_grad_scaler_state){0, 0, 0, 0}) < 0);
    assert_error(MT_ERR_INVALID, "scale 0 is outside [min_scale 1, max_scale 1.67772e+07]");
    assert_true(mt_grad_scaler_state_set(r.s, &(mt_grad_scaler_state){INFINITY, 0, 0, 0}) < 0);
    assert_error(MT_ERR_INVALID, "scale inf");
    assert_true(mt_grad_scaler_state_set(r.s, &(mt_grad_scaler_state){8, -1, 0, 0}) < 0);
    assert_error(MT_ERR_INVALID, "counters must be >= 0");
    assert_true(mt_grad_scaler_state_set(r.s, &(mt_grad_scaler_state){8, 0, 0, (int64_t)1 << 40}) <
                0);
    assert_error(MT_ERR_INVALID, "2^24");
    expect_state(&r, 2048, 0, 0, 5); /* unchanged by refused imports */
    rig_free(&r);
    rig_free(&q);
    assert_no_error();
}

/* ------------------------------------------------------------------ disabled */

static void test_disabled(void **state) {
    (void)state;
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.disabled = true});
    mt_tensor *p = param((const double[]){1, 2}, 2, MT_F32);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_tensor *loss = mt_sum_all(p);
    mt_tensor *scaled = mt_grad_scaler_scale(s, loss);
    assert_ptr_equal(scaled, loss); /* a new reference to the loss itself */
    mt_release(scaled);
    assert_true(mt_grad_scaler_get_scale(s) == 1.0f);
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_release(loss);
    assert_int_equal(mt_grad_scaler_unscale(s, o), 0); /* nothing to undo */
    mt_tensor *g = mt_grad(p);
    assert_same(g, ((const double[]){1, 1}), 2);
    mt_release(g);
    assert_int_equal(mt_grad_scaler_step(s, o), 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    assert_same(p, ((const double[]){0.5, 1.5}), 2);
    /* a plain step: an inf gradient is applied, nothing is skipped or counted */
    set_grad(p, (const double[]){1, 1}, 1, INFINITY);
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    assert_false(mt_grad_scaler_last_step_skipped(s));
    assert_int_equal(mt_grad_scaler_skipped_steps(s), 0);
    assert_same(p, ((const double[]){-INFINITY, 1.0}), 2);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    mt_release(p);
    assert_no_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_defaults),
        MT_TEST(test_bad_options),
        MT_TEST(test_null_arguments),
        MT_TEST(test_scale_loss),
        MT_TEST(test_growth),
        MT_TEST(test_backoff_default),
        MT_TEST(test_bounds),
        MT_TEST(test_backoff_after_two),
        MT_TEST(test_skipped_counters),
        MT_TEST(test_state_errors),
        MT_TEST(test_state_export_import),
        MT_TEST(test_disabled),
    };
    return MT_RUN_TESTS(tests);
}

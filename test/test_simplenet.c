/* End-to-end mixed precision training: the SimpleNet of the Paddle AMP guide (three Linear
   layers hidden x hidden, ReLU after the first two, MSE loss, SGD, GradScaler with init scale
   1024 for FP16), trained from the same initial weights on the same data in FP32, AMP-O1 FP16,
   AMP-O2 FP16 with FP32 master weights and AMP-O1 BF16. The acceptance test: O1 FP16
   ends within 1% of FP32's final loss. Also: every mode learns, the other modes end within
   bounds derived from their formats, a healthy run skips no step, and a step whose loss is
   made inf is skipped (and only that one) without spoiling the run. */
#include "test_util.h"

/* Small enough for well under a second per run (also under ASan), large enough that the GEMMs
   reduce over 64-128 terms in low precision and the loss falls several-fold. */
enum {
    HIDDEN = 128,
    BATCH = 64,
    N_BATCHES = 4, /* cycled: 10 epochs of 4 batches */
    STEPS = 40,
    N_LAYERS = 3,
    N_PARAMS = 2 * N_LAYERS,
    INJECT_STEP = 5, /* the step whose loss is made inf in test_inf_step_is_skipped */
};
enum { DATA_SEED = 2023, TEACHER_SEED = 2024, WEIGHT_SEED = 2025 };

/* The guide's lr 1e-4 moves the loss on a given batch by 0.03% in 40 steps: nothing to
   compare. The MSE gradient is divided by BATCH * HIDDEN (a mean over 8192 elements), so a
   plain-SGD lr of a few units is the natural scale here; 5 brings the loss to 0.2-0.3 of its
   first value in 40 steps and is far from the edge of stability (lr 30 still trains smoothly,
   with FP16 within 4e-4 of FP32). */
#define LR 5.0

/* Unit roundoffs (half an ulp at 1) of the low-precision formats. */
#define U_F16  0x1p-11 /* 4.9e-4 */
#define U_BF16 0x1p-8  /* 3.9e-3 */

typedef struct {
    const char *name;
    mt_dtype low; /* MT_F32: no autocast */
    mt_amp_level level;
    bool scaler;         /* FP16 needs loss scaling; BF16 has FP32's exponent range */
    bool master_weights; /* O2: FP16 parameters, FP32 masters in the optimizer */
} mode;

static const mode FP32 = {"fp32", MT_F32, MT_AMP_O1, false, false};
static const mode O1_FP16 = {"o1-fp16", MT_F16, MT_AMP_O1, true, false};
static const mode O2_FP16 = {"o2-fp16", MT_F16, MT_AMP_O2, true, true};
static const mode O1_BF16 = {"o1-bf16", MT_BF16, MT_AMP_O1, false, false};

typedef struct {
    mt_tensor *x[N_BATCHES], *y[N_BATCHES];
} dataset;

typedef struct {
    double first, final; /* loss of the first and of the last step */
    int64_t skipped;
    double scale; /* the scaler's scale at the end (0 without a scaler) */
} result;

static mt_tensor *simplenet_forward(mt_linear_layer *l, mt_tensor *x) {
    mt_tensor *h = mt_relu(mt_linear_layer_forward(&l[0], x));
    h = mt_relu(mt_linear_layer_forward(&l[1], h));
    return mt_linear_layer_forward(&l[2], h);
}

/* Inputs N(0, 1); targets from a teacher SimpleNet of the same shape with its own weights. The
   guide's random targets carry no signal (the loss could only fall by memorising), and a
   unit-scale low-rank linear teacher, tried first, makes the student escape a saddle, during
   which rounding differences grew into final losses up to 6% apart over seeds: no precision
   could be compared there. Targets the student can reach from its scale keep training smooth, so
   the final losses compare the precisions and not chaos. */
static void dataset_make(dataset *d) {
    mt_manual_seed(DATA_SEED);
    for (int b = 0; b < N_BATCHES; b++)
        d->x[b] = mt_randn(MT_SHAPE(BATCH, HIDDEN), MT_F32, mt_test_device());
    mt_manual_seed(TEACHER_SEED);
    mt_linear_layer teacher[N_LAYERS] = {0};
    for (int i = 0; i < N_LAYERS; i++)
        mt_linear_layer_init(&teacher[i], HIDDEN, HIDDEN, true, MT_F32, mt_test_device());
    bool was = mt_set_grad_enabled(false);
    for (int b = 0; b < N_BATCHES; b++) {
        mt_scope_begin();
        d->y[b] = mt_retain(simplenet_forward(teacher, d->x[b]));
        mt_scope_end();
    }
    mt_set_grad_enabled(was);
    for (int i = 0; i < N_LAYERS; i++) mt_linear_layer_free(&teacher[i]);
    assert_no_error();
}

static void dataset_free(dataset *d) {
    for (int b = 0; b < N_BATCHES; b++) {
        mt_release(d->x[b]);
        mt_release(d->y[b]);
    }
}

static double *param_values(mt_tensor *const *params) {
    double *all = malloc((size_t)N_LAYERS * (HIDDEN * HIDDEN + HIDDEN) * sizeof *all);
    assert_non_null(all);
    double *p = all;
    for (int i = 0; i < N_PARAMS; i++) {
        double *v = mt_test_values(params[i]);
        assert_non_null(v);
        memcpy(p, v, (size_t)mt_numel(params[i]) * sizeof *v);
        p += mt_numel(params[i]);
        free(v);
    }
    return all;
}

/* O2: the parameters are FP16, the optimizer holds FP32 masters, and each parameter is its
   master rounded to FP16. The masters must also hold values FP16 cannot: updates below half an
   FP16 ulp accumulate there and not in the parameters. */
static void check_master_weights(mt_optimizer *opt, mt_tensor *const *params) {
    int64_t finer = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        assert_int_equal(mt_dtype_of(params[i]), MT_F16);
        mt_tensor *master = mt_optimizer_master(opt, i);
        assert_non_null(master);
        assert_int_equal(mt_dtype_of(master), MT_F32);
        mt_tensor *rounded = mt_cast(master, MT_F16);
        double *m = mt_test_values(master), *r = mt_test_values(rounded),
               *p = mt_test_values(params[i]);
        assert_no_error();
        for (int64_t k = 0; k < mt_numel(params[i]); k++) {
            if (r[k] != p[k])
                fail_msg("param %d element %lld is %.9g, its master %.9g rounds to %.9g", i,
                         (long long)k, p[k], m[k], r[k]);
            finer += m[k] != p[k];
        }
        free(m);
        free(r);
        free(p);
        mt_release(rounded);
        mt_release(master);
    }
    assert_true(finer > 0);
}

/* Trains a fresh SimpleNet (same initial weights in every mode) for STEPS steps over the data.
   When inject_at >= 0, the scaled loss of that step is multiplied by inf: that step must be
   skipped, its batch consumed without an update. */
static void train(const dataset *d, const mode *m, int inject_at, result *r) {
    mt_manual_seed(WEIGHT_SEED);
    mt_linear_layer layers[N_LAYERS] = {0};
    mt_tensor *params[N_PARAMS];
    for (int i = 0; i < N_LAYERS; i++) {
        assert_int_equal(
            mt_linear_layer_init(&layers[i], HIDDEN, HIDDEN, true, MT_F32, mt_test_device()), 0);
        params[2 * i] = layers[i].weight;
        params[2 * i + 1] = layers[i].bias;
    }
    if (m->master_weights) assert_int_equal(mt_amp_decorate(params, N_PARAMS, m->low, NULL), 0);
    mt_optimizer *opt = mt_sgd_new(
        params, N_PARAMS, &(mt_sgd_opts){.lr = MT_SET(LR), .multi_precision = m->master_weights});
    assert_non_null(opt);
    mt_grad_scaler *scaler =
        m->scaler ? mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024}) : NULL;
    assert_true(!m->scaler || scaler);

    /* Low precision must really be used: every forward linear runs in the low dtype. */
    mt_amp_stats_reset();
    mt_amp_stats_enable(true);
    for (int s = 0; s < STEPS; s++) {
        bool inject = s == inject_at;
        double *before = inject ? param_values(params) : NULL;
        mt_scope_begin();
        if (m->low != MT_F32) mt_autocast_begin(m->low, m->level);
        mt_tensor *pred = simplenet_forward(layers, d->x[s % N_BATCHES]);
        mt_tensor *loss = mt_mse_loss(pred, d->y[s % N_BATCHES]);
        if (m->low != MT_F32) mt_autocast_end();
        if (scaler) {
            mt_tensor *scaled = mt_grad_scaler_scale(scaler, loss);
            if (inject) scaled = mt_mul_scalar(scaled, INFINITY); /* as an FP16 overflow would */
            mt_backward(scaled, NULL);
            mt_grad_scaler_minimize(scaler, opt);
        } else {
            mt_backward(loss, NULL);
            mt_optimizer_step(opt);
        }
        mt_optimizer_zero_grad(opt);
        double l = mt_item(loss);
        mt_scope_end();
        assert_no_error();
        assert_true(isfinite(l));
        if (s == 0) r->first = l;
        r->final = l;
        if (scaler) assert_true(mt_grad_scaler_last_step_skipped(scaler) == inject);
        if (inject) {
            /* skipped: not one bit of any parameter changed */
            double *after = param_values(params);
            int64_t n = 0;
            for (int i = 0; i < N_PARAMS; i++) n += mt_numel(params[i]);
            for (int64_t k = 0; k < n; k++)
                if (memcmp(&before[k], &after[k], sizeof before[k]) != 0)
                    fail_msg("the skipped step changed parameter element %lld: %.9g -> %.9g",
                             (long long)k, before[k], after[k]);
            free(after);
        }
        free(before);
    }
    mt_amp_stats_enable(false);
    mt_dtype compute = m->low;
    assert_int_equal(mt_amp_stats_count("linear", compute), N_LAYERS * STEPS);
    if (compute != MT_F32) assert_int_equal(mt_amp_stats_count("linear", MT_F32), 0);
    mt_amp_stats_reset();

    if (m->master_weights) check_master_weights(opt, params);
    r->skipped = scaler ? mt_grad_scaler_skipped_steps(scaler) : 0;
    r->scale = scaler ? mt_grad_scaler_get_scale(scaler) : 0;
    assert_no_error();
    fprintf(stderr, "# %-8s loss %.7f -> %.7f, skipped %lld\n", m->name, r->first, r->final,
            (long long)r->skipped);

    mt_grad_scaler_free(scaler);
    mt_optimizer_free(opt);
    for (int i = 0; i < N_LAYERS; i++) mt_linear_layer_free(&layers[i]);
}

static double rel_diff(double a, double ref) {
    return fabs(a - ref) / fabs(ref);
}

/* Trains FP32 and mode m; checks that both learn and start from the same point, and returns
   m's final loss relative to FP32's. */
static double compare_with_fp32(const mode *m, int inject_at, result *out) {
    dataset d = {0};
    dataset_make(&d);
    result ref = {0}, r = {0};
    train(&d, &FP32, -1, &ref);
    train(&d, m, inject_at, &r);
    dataset_free(&d);
    /* Same weights, same data: the first losses differ only by the forward's rounding. */
    assert_true(rel_diff(r.first, ref.first) < 2 * (m->low == MT_BF16 ? U_BF16 : U_F16));
    /* Both learn: measured final/first is 0.21 here, 0.30 at worst over 30 other seeds. */
    assert_true(ref.final < 0.4 * ref.first);
    assert_true(r.final < 0.4 * r.first);
    double rel = rel_diff(r.final, ref.final);
    fprintf(stderr, "# %-8s final loss vs fp32: relative difference %.3g\n", m->name, rel);
    *out = r;
    return rel;
}

/* The issue: "O1 FP16 training of SimpleNet reaches a final loss within 1% of FP32 on the same
   data and seed". Measured: 3e-5 or less here (1-4 threads), 1.2e-4 at worst over 30 other
   seeds of data and weights. Loose as it is, the bound fails when the reference is trained
   with a 5% larger lr. */
static void test_o1_fp16_within_1pct_of_fp32(void **state) {
    (void)state;
    result r;
    double rel = compare_with_fp32(&O1_FP16, -1, &r);
    assert_true(rel < 0.01);
    assert_int_equal(r.skipped, 0);
    assert_true(r.scale == 1024); /* no backoff; growth is 2000 clean steps away */
}

/* O2 stores activations and weights in FP16 too. Each rounding is at most one unit roundoff u,
   and the roundings of the 64 x 128 outputs are independent, so they average out in the mean
   loss rather than add up: measured 8e-6 or less here (1-4 threads), 1.3e-4 = 0.26 u at
   worst over 30 other seeds. Bound: 2 u (1e-3), 7x that. At this lr an update is many FP16
   ulps of its weight, so even FP16 SGD without masters stays inside the bound (1.1e-4,
   measured): the masters are tested directly by check_master_weights. */
static void test_o2_fp16_master_weights(void **state) {
    (void)state;
    result r;
    double rel = compare_with_fp32(&O2_FP16, -1, &r);
    assert_true(rel < 2 * U_F16);
    assert_int_equal(r.skipped, 0);
}

/* BF16 keeps 8 significant bits instead of FP16's 11 (u = 2^-8), and needs no loss scaling.
   Measured 2e-4 or less here (1-4 threads), 3.2e-4 = 0.08 u at worst over 30 other seeds;
   bound: u (3.9e-3), 12x that and still under the 1% asked of FP16. */
static void test_o1_bf16(void **state) {
    (void)state;
    result r;
    double rel = compare_with_fp32(&O1_BF16, -1, &r);
    assert_true(rel < U_BF16);
    assert_int_equal(r.skipped, 0);
}

/* One step's scaled loss is inf, as when FP16 overflows: the scaler skips exactly that step
   (the parameters keep every bit, checked in train), backs the scale off once to 512, and
   training goes on. The run makes one update fewer than FP32; at this lr the lost step costs
   0.29% of final loss here (0.21-0.34% over 30 other seeds), inside the 1% bound. */
static void test_inf_step_is_skipped(void **state) {
    (void)state;
    result r;
    double rel = compare_with_fp32(&O1_FP16, INJECT_STEP, &r);
    assert_true(rel < 0.01);
    assert_int_equal(r.skipped, 1);
    assert_true(r.scale == 512);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_o1_fp16_within_1pct_of_fp32),
        MT_TEST(test_o2_fp16_master_weights),
        MT_TEST(test_o1_bf16),
        MT_TEST(test_inf_step_is_skipped),
    };
    return MT_RUN_TESTS(tests);
}

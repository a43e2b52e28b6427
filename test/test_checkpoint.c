/* Checkpoints of training state: loading a state dict into parameters (torch's strict
   semantics), linear layers' names, optimizer and GradScaler state, and bit-exact resume:
   N steps, save everything to a file, load into a freshly made model / optimizer / scaler, M
   more steps, compared bit for bit with an uninterrupted N + M step run. Also files written
   by Python's safetensors and PyTorch (test/data, made by tools/gen_state_data.py). */
#include <unistd.h>
#include "test_util.h"

#ifndef MT_TEST_DATA_DIR
#define MT_TEST_DATA_DIR "test/data"
#endif

static size_t nbytes_of(const mt_tensor *t) {
    return (size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t));
}

/* a and b (any devices) hold the same dtype, shape and bytes */
static void assert_same_bits(const mt_tensor *a, const mt_tensor *b, const char *what) {
    assert_int_equal(mt_dtype_of(a), mt_dtype_of(b));
    assert_int_equal(mt_numel(a), mt_numel(b));
    size_t n = nbytes_of(a);
    unsigned char *x = malloc(n + 1), *y = malloc(n + 1);
    assert_int_equal(mt_copy_to_host(a, x, n), 0);
    assert_int_equal(mt_copy_to_host(b, y, n), 0);
    if (memcmp(x, y, n) != 0) fail_msg("%s: the bits differ", what);
    free(x);
    free(y);
}

static void temp_path(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/mt_ckpt_%ld_XXXXXX", (long)getpid());
    int fd = mkstemp(buf);
    assert_true(fd >= 0);
    close(fd);
}

/* ---------------------------------------------------------------- load_into */

static void test_load_into(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    /* the state on the CPU, the parameters on the device under test */
    mt_state *s = mt_state_new();
    mt_tensor *w = mt_arange(0, 6, 1, MT_F32, MT_CPU), *w2 = mt_reshape(w, MT_SHAPE(2, 3));
    mt_tensor *b = mt_full(MT_SHAPE(2), MT_F32, MT_CPU, -1);
    mt_state_put(s, "fc.weight", w2);
    mt_state_put(s, "fc.bias", b);
    mt_state_put(s, "other.x", b);
    mt_tensor *pw = mt_zeros(MT_SHAPE(2, 3), MT_F32, dev), *pb = mt_zeros(MT_SHAPE(2), MT_F32, dev);
    mt_set_requires_grad(pw, true);
    mt_set_requires_grad(pb, true);
    mt_tensor *params[2] = {pw, pb};
    const char *names[2] = {"weight", "bias"};
    assert_int_equal(mt_state_load_into(s, "fc.", params, names, 2, true), 0);
    assert_same_bits(pw, w2, "weight");
    assert_same_bits(pb, b, "bias");
    assert_true(mt_requires_grad(pw)); /* still a leaf parameter */

    /* strict: entries under the prefix that no name claims */
    assert_int_equal(mt_state_load_into(s, "fc.", params, names, 1, true), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "0 missing entries; 1 unexpected entry: fc.bias");
    assert_int_equal(mt_state_load_into(s, "fc.", params, names, 1, false), 0);
    /* missing entries */
    const char *wrong[2] = {"weight", "gamma"};
    assert_int_equal(mt_state_load_into(s, "fc.", params, wrong, 2, true), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "1 missing entry: fc.gamma; 1 unexpected entry: fc.bias");
    /* an empty prefix in strict mode sees every entry */
    assert_int_equal(
        mt_state_load_into(s, NULL, params, (const char *[]){"fc.weight", "fc.bias"}, 2, true),
        MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "unexpected entry: other.x");

    /* a mismatch is an error even when not strict, and nothing changes (all or nothing) */
    mt_fill(b, 5);
    mt_tensor *bad = mt_zeros(MT_SHAPE(3), MT_F32, MT_CPU);
    mt_state_put(s, "fc.weight", bad);
    mt_state_put(s, "fc.bias", b);
    const char *rev[2] = {"bias", "weight"};
    mt_tensor *rparams[2] = {pb, pw};
    assert_int_equal(mt_state_load_into(s, "fc.", rparams, rev, 2, false), MT_ERR_SHAPE);
    assert_error(MT_ERR_SHAPE, "entry 'fc.weight' is f32 [3] but params[1] is f32 [2, 3]");
    mt_tensor *minus1 = mt_full(MT_SHAPE(2), MT_F32, dev, -1);
    assert_same_bits(pb, minus1, "bias unchanged");
    mt_tensor *half = mt_zeros(MT_SHAPE(2, 3), MT_F16, MT_CPU);
    mt_state_put(s, "fc.weight", half);
    assert_int_equal(mt_state_load_into(s, "fc.", params, names, 2, false), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "entry 'fc.weight' is f16 [2, 3] but params[0] is f32 [2, 3]");
    /* argument errors */
    assert_int_equal(mt_state_load_into(NULL, "", params, names, 2, true), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_load_into: arg 1");
    assert_int_equal(mt_state_load_into(s, "", (mt_tensor *[]){pw, NULL}, names, 2, true),
                     MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "params[1] is NULL");
    assert_int_equal(
        mt_state_load_into(s, "fc.", rparams, (const char *[]){"bias", "bias"}, 2, false),
        MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "names[0] and names[1] are both 'bias'");
    /* a parameter whose elements share memory (an expanded view) cannot take an entry's
       distinct values, as torch's copy_ refuses it; the other parameter stays as it was */
    mt_state_put(s, "fc.weight", w2);
    mt_tensor *row = mt_zeros(MT_SHAPE(1, 3), MT_F32, dev), *rows = mt_expand(row, MT_SHAPE(2, 3));
    assert_int_equal(mt_state_load_into(s, "fc.", (mt_tensor *[]){pb, rows}, rev, 2, false),
                     MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "strides [0, 1] has elements that share memory");
    assert_same_bits(pb, minus1, "bias unchanged");
    mt_release(rows);
    mt_release(row);
    /* names as long as the state takes them (no fixed key buffer) */
    char *long_name = malloc(5001);
    memset(long_name, 'n', 5000);
    long_name[5000] = 0;
    char *long_key = malloc(5004);
    snprintf(long_key, 5004, "fc.%s", long_name);
    mt_state_put(s, long_key, minus1);
    mt_tensor *plong = mt_zeros(MT_SHAPE(2), MT_F32, dev);
    assert_int_equal(
        mt_state_load_into(s, "fc.", &plong, (const char *const *)&long_name, 1, false), 0);
    assert_same_bits(plong, minus1, "long name");
    mt_release(plong);
    free(long_key);
    free(long_name);
    mt_release(half);
    mt_release(minus1);
    mt_release(bad);
    mt_release(w);
    mt_release(w2);
    mt_release(b);
    mt_release(pw);
    mt_release(pb);
    mt_state_free(s);
}

static void test_linear_layer_names(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_linear_layer a = {0}, b = {0}, nb = {0};
    mt_manual_seed(1);
    assert_int_equal(mt_linear_layer_init(&a, 3, 2, true, MT_F32, dev), 0);
    assert_int_equal(mt_linear_layer_init(&b, 3, 2, true, MT_F32, dev), 0);
    assert_int_equal(mt_linear_layer_init(&nb, 3, 2, false, MT_F32, dev), 0);
    mt_state *s = mt_state_new();
    assert_int_equal(mt_linear_layer_state_put(&a, s, "fc1."), 0);
    assert_int_equal(mt_state_count(s), 2);
    assert_string_equal(mt_state_name(s, 0), "fc1.weight");
    assert_string_equal(mt_state_name(s, 1), "fc1.bias");
    assert_int_equal(mt_linear_layer_state_load(&b, s, "fc1.", true), 0);
    assert_same_bits(a.weight, b.weight, "weight");
    assert_same_bits(a.bias, b.bias, "bias");
    /* a layer without bias, strict: fc1.bias is unexpected */
    assert_int_equal(mt_linear_layer_state_load(&nb, s, "fc1.", true), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_linear_layer_state_load: mt_state_load_into: strict load");
    assert_int_equal(mt_linear_layer_state_load(&nb, s, "fc1.", true), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "unexpected entry: fc1.bias");
    assert_int_equal(mt_linear_layer_state_load(&nb, s, "fc1.", false), 0);
    assert_same_bits(a.weight, nb.weight, "weight without bias");
    mt_linear_layer_free(&nb);
    assert_int_equal(mt_linear_layer_state_put(&nb, s, "x."), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "not initialised");
    mt_linear_layer_free(&a);
    mt_linear_layer_free(&b);
    mt_state_free(s);
}

/* ---------------------------------------------------------------- bit-exact resume */

typedef enum { K_SGD, K_MOMENTUM, K_ADAM, K_ADAMW } kind;

typedef struct {
    mt_dtype low;       /* MT_F32: no autocast, no scaler */
    mt_amp_level level; /* O2: parameters decorated to low */
    bool multi_precision;
} amp_cfg;

enum { N_STEPS = 3, M_STEPS = 3, IN = 5, HID = 7, OUT = 3, BATCH = 4 };

typedef struct {
    mt_linear_layer fc1, fc2;
    mt_tensor *params[4];
    mt_optimizer *opt;
    mt_grad_scaler *scaler; /* NULL without AMP */
} rig;

static void rig_make(rig *r, kind k, const amp_cfg *c, uint64_t seed, bool default_scaler) {
    mt_device dev = mt_test_device();
    mt_manual_seed(seed);
    assert_int_equal(mt_linear_layer_init(&r->fc1, IN, HID, true, MT_F32, dev), 0);
    assert_int_equal(mt_linear_layer_init(&r->fc2, HID, OUT, true, MT_F32, dev), 0);
    mt_tensor *p[4] = {r->fc1.weight, r->fc1.bias, r->fc2.weight, r->fc2.bias};
    memcpy(r->params, p, sizeof p);
    if (c->low != MT_F32 && c->level == MT_AMP_O2)
        assert_int_equal(mt_amp_decorate(r->params, 4, c->low, NULL), 0);
    bool mp = c->multi_precision;
    switch (k) {
    case K_SGD:
        r->opt =
            mt_sgd_new(r->params, 4, &(mt_sgd_opts){.lr = MT_SET(0.05), .multi_precision = mp});
        break;
    case K_MOMENTUM:
        r->opt = mt_momentum_new(r->params, 4,
                                 &(mt_momentum_opts){.lr = MT_SET(0.05),
                                                     .momentum = MT_SET(0.8),
                                                     .weight_decay = 0.01,
                                                     .nesterov = true,
                                                     .multi_precision = mp});
        break;
    case K_ADAM:
        r->opt = mt_adam_new(r->params, 4,
                             &(mt_adam_opts){.lr = MT_SET(0.01),
                                             .weight_decay = MT_SET(0.02),
                                             .multi_precision = mp});
        break;
    case K_ADAMW:
        r->opt = mt_adamw_new(
            r->params, 4,
            &(mt_adam_opts){.lr = MT_SET(0.01), .beta1 = MT_SET(0.8), .multi_precision = mp});
        break;
    }
    assert_non_null(r->opt);
    r->scaler = NULL;
    if (c->low != MT_F32) {
        /* growth every 2 clean steps, so the scale changes across the resume; a fresh rig
           made to be loaded into gets the defaults, which the load must replace */
        r->scaler = mt_grad_scaler_new(
            default_scaler ? NULL
                           : &(mt_grad_scaler_opts){.init_scale = 256, .growth_interval = 2});
        assert_non_null(r->scaler);
    }
}

static void rig_free(rig *r) {
    mt_optimizer_free(r->opt);
    mt_grad_scaler_free(r->scaler);
    mt_linear_layer_free(&r->fc1);
    mt_linear_layer_free(&r->fc2);
}

/* Batch `step`, a fixed function of the step; with poison the input holds an inf, so the
   scaled gradients are not finite and the GradScaler skips the step. */
static void batch(int step, bool poison, mt_tensor **x, mt_tensor **y) {
    float xs[BATCH * IN], ys[BATCH * OUT];
    for (int i = 0; i < BATCH * IN; i++) xs[i] = (float)sin(0.7 * i + 1.3 * step);
    for (int i = 0; i < BATCH * OUT; i++) ys[i] = (float)cos(0.3 * i - 0.9 * step);
    if (poison) xs[3] = INFINITY;
    *x = mt_from_data(xs, MT_F32, MT_SHAPE(BATCH, IN), mt_test_device());
    *y = mt_from_data(ys, MT_F32, MT_SHAPE(BATCH, OUT), mt_test_device());
}

static void train(rig *r, const amp_cfg *c, int from, int to, int poison_at) {
    for (int step = from; step < to; step++) {
        mt_scope_begin();
        mt_tensor *x, *y;
        batch(step, r->scaler && step == poison_at, &x, &y);
        if (r->scaler) mt_autocast_begin(c->low, c->level);
        mt_tensor *h = mt_relu(mt_linear_layer_forward(&r->fc1, x));
        mt_tensor *loss = mt_mse_loss(mt_linear_layer_forward(&r->fc2, h), y);
        if (r->scaler) {
            mt_autocast_end();
            assert_int_equal(mt_backward(mt_grad_scaler_scale(r->scaler, loss), NULL), 0);
            assert_int_equal(mt_grad_scaler_minimize(r->scaler, r->opt), 0);
            assert_int_equal(mt_grad_scaler_last_step_skipped(r->scaler), step == poison_at);
        } else {
            assert_int_equal(mt_backward(loss, NULL), 0);
            assert_int_equal(mt_optimizer_step(r->opt), 0);
        }
        mt_optimizer_zero_grad(r->opt);
        mt_scope_end();
        assert_no_error();
    }
}

static void check_resume(kind k, const amp_cfg *c) {
    char path[64];
    temp_path(path, sizeof path);
    /* the uninterrupted run; the step right after the resume is skipped (inf) under AMP */
    rig whole = {0};
    rig_make(&whole, k, c, 11, false);
    train(&whole, c, 0, N_STEPS + M_STEPS, N_STEPS);

    /* N steps, then everything to a file */
    rig first = {0};
    rig_make(&first, k, c, 11, false);
    train(&first, c, 0, N_STEPS, N_STEPS);
    mt_state *s = mt_state_new();
    assert_int_equal(mt_linear_layer_state_put(&first.fc1, s, "fc1."), 0);
    assert_int_equal(mt_linear_layer_state_put(&first.fc2, s, "fc2."), 0);
    assert_int_equal(mt_optimizer_state_save(first.opt, s, "optim."), 0);
    if (first.scaler) assert_int_equal(mt_grad_scaler_state_save(first.scaler, s, "scaler."), 0);
    assert_int_equal(mt_state_save(s, path), 0);
    mt_state_free(s);
    rig_free(&first);

    /* a fresh model (other initial weights), optimizer and scaler, loaded from the file */
    rig second = {0};
    rig_make(&second, k, c, 99, true);
    s = mt_state_load(path, MT_CPU);
    assert_non_null(s);
    assert_int_equal(mt_linear_layer_state_load(&second.fc1, s, "fc1.", false), 0);
    assert_int_equal(mt_linear_layer_state_load(&second.fc2, s, "fc2.", false), 0);
    assert_int_equal(mt_optimizer_state_load(second.opt, s, "optim."), 0);
    if (second.scaler) assert_int_equal(mt_grad_scaler_state_load(second.scaler, s, "scaler."), 0);
    mt_state_free(s);
    unlink(path);
    train(&second, c, N_STEPS, N_STEPS + M_STEPS, N_STEPS);

    for (int i = 0; i < 4; i++) {
        assert_same_bits(second.params[i], whole.params[i], "parameter");
        mt_tensor *ma = mt_optimizer_master(second.opt, i), *mb = mt_optimizer_master(whole.opt, i);
        assert_int_equal(ma == NULL, mb == NULL);
        if (ma) assert_same_bits(ma, mb, "master weight");
        mt_release(ma);
        mt_release(mb);
    }
    if (whole.scaler) {
        mt_grad_scaler_state a, b;
        assert_int_equal(mt_grad_scaler_state_get(second.scaler, &a), 0);
        assert_int_equal(mt_grad_scaler_state_get(whole.scaler, &b), 0);
        assert_true(a.scale == b.scale && a.good_steps == b.good_steps &&
                    a.bad_steps == b.bad_steps && a.skipped_steps == b.skipped_steps);
        assert_int_equal(b.skipped_steps, 1);
    }
    rig_free(&second);
    rig_free(&whole);
}

static const amp_cfg cfgs[] = {
    {MT_F32, MT_AMP_O1, false}, /* plain FP32 */
    {MT_F16, MT_AMP_O1, false}, /* O1: FP32 parameters, low GEMMs */
    {MT_BF16, MT_AMP_O1, true},
    {MT_F16, MT_AMP_O2, true}, /* O2 with FP32 masters */
    {MT_BF16, MT_AMP_O2, true},
    {MT_F16, MT_AMP_O2, false}, /* O2 without masters: low parameters updated directly */
    {MT_BF16, MT_AMP_O2, false},
};

static void resume_all(kind k) {
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_resume(k, &cfgs[i]);
}

static void test_resume_sgd(void **state) {
    (void)state;
    resume_all(K_SGD);
}
static void test_resume_momentum(void **state) {
    (void)state;
    resume_all(K_MOMENTUM);
}
static void test_resume_adam(void **state) {
    (void)state;
    resume_all(K_ADAM);
}
static void test_resume_adamw(void **state) {
    (void)state;
    resume_all(K_ADAMW);
}

/* ---------------------------------------------------------------- state errors */

/* A copy of s (entries and metadata) without the entry named drop. */
static mt_state *state_without(mt_state *s, const char *drop) {
    mt_state *out = mt_state_new();
    for (int i = 0; i < mt_state_count(s); i++)
        if (strcmp(mt_state_name(s, i), drop) != 0) {
            mt_tensor *t = mt_state_get(s, mt_state_name(s, i));
            mt_state_put(out, mt_state_name(s, i), t);
            mt_release(t);
        }
    for (int i = 0; i < mt_state_meta_count(s); i++)
        mt_state_set_meta(out, mt_state_meta_key(s, i),
                          mt_state_get_meta(s, mt_state_meta_key(s, i)));
    return out;
}

static void test_optimizer_state_errors(void **state) {
    (void)state;
    const amp_cfg o2 = {MT_F16, MT_AMP_O2, true};
    rig a = {0}, b = {0};
    rig_make(&a, K_ADAM, &o2, 1, false);
    train(&a, &o2, 0, 2, -1);
    mt_state *s = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(a.opt, s, "opt."), 0);
    /* the saved state is a copy: later steps do not change it */
    mt_tensor *m0 = mt_state_get(s, "opt.state.0.exp_avg");
    mt_tensor *keep = mt_clone(m0);
    train(&a, &o2, 2, 3, -1);
    assert_same_bits(m0, keep, "saved moment");
    mt_release(m0);
    mt_release(keep);
    assert_string_equal(mt_state_get_meta(s, "opt.kind"), "adam");

    /* another kind */
    rig_make(&b, K_ADAMW, &o2, 1, false);
    assert_int_equal(mt_optimizer_state_load(b.opt, s, "opt."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID,
                 "the saved optimizer has opt.kind 'adam' but this one has 'adamw'");
    rig_free(&b);
    /* without multi_precision */
    const amp_cfg o2n = {MT_F16, MT_AMP_O2, false};
    rig_make(&b, K_ADAM, &o2n, 1, false);
    assert_int_equal(mt_optimizer_state_load(b.opt, s, "opt."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "opt.multi_precision 'true' but this one has 'false'");
    rig_free(&b);
    /* a wrong prefix */
    rig_make(&b, K_ADAM, &o2, 1, false);
    assert_int_equal(mt_optimizer_state_load(b.opt, s, "x."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "no metadata 'x.kind'");
    /* a moment of the wrong shape: refused, and nothing changed (lr included) */
    mt_optimizer_set_lr(b.opt, 0.5);
    mt_tensor *wrong = mt_zeros(MT_SHAPE(2), MT_F32, MT_CPU);
    mt_state_put(s, "opt.state.3.exp_avg_sq", wrong);
    assert_int_equal(mt_optimizer_state_load(b.opt, s, "opt."), MT_ERR_SHAPE);
    assert_error(MT_ERR_SHAPE, "entry 'opt.state.3.exp_avg_sq' is f32 [2], expected f32 [3]");
    assert_true(mt_optimizer_get_lr(b.opt) == 0.5);
    /* a missing master weight; a moment without its partner */
    mt_state *s2 = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(a.opt, s2, ""), 0);
    mt_state *s3 = state_without(s2, "state.1.master");
    assert_int_equal(mt_optimizer_state_load(b.opt, s3, ""), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "no entry 'state.1.master'");
    mt_state *s4 = state_without(s2, "state.1.exp_avg_sq");
    assert_int_equal(mt_optimizer_state_load(b.opt, s4, ""), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "the state has 'state.1.exp_avg' but not 'state.1.exp_avg_sq'");
    mt_state_free(s4);
    assert_int_equal(mt_optimizer_state_load(b.opt, s2, ""), 0);
    assert_true(mt_optimizer_get_lr(b.opt) == 0.01);
    assert_int_equal(mt_optimizer_state_save(NULL, s, ""), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_optimizer_state_save: arg 1");
    assert_int_equal(mt_optimizer_state_load(b.opt, NULL, ""), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_optimizer_state_load: arg 2");
    mt_release(wrong);
    mt_state_free(s);
    mt_state_free(s2);
    mt_state_free(s3);
    rig_free(&a);
    rig_free(&b);
}

/* Two F32 parameters of ones ([3] and [2]) on the device under test, and gradients for them
   (0.5 and 2) to set. */
typedef struct {
    mt_tensor *a, *b, *ga, *gb;
} two_params;

static void two_params_make(two_params *t) {
    mt_device dev = mt_test_device();
    t->a = mt_ones(MT_SHAPE(3), MT_F32, dev);
    t->b = mt_ones(MT_SHAPE(2), MT_F32, dev);
    mt_set_requires_grad(t->a, true);
    mt_set_requires_grad(t->b, true);
    t->ga = mt_full(MT_SHAPE(3), MT_F32, dev, 0.5);
    t->gb = mt_full(MT_SHAPE(2), MT_F32, dev, 2);
}

static void two_params_free(two_params *t) {
    mt_release(t->a);
    mt_release(t->b);
    mt_release(t->ga);
    mt_release(t->gb);
}

/* got holds exactly want's entries, bit for bit. */
static void assert_same_state(mt_state *want, mt_state *got) {
    assert_int_equal(mt_state_count(got), mt_state_count(want));
    for (int i = 0; i < mt_state_count(want); i++) {
        mt_tensor *x = mt_state_get(want, mt_state_name(want, i)),
                  *y = mt_state_get(got, mt_state_name(want, i));
        if (!y) fail_msg("entry %s is missing", mt_state_name(want, i));
        assert_same_bits(x, y, mt_state_name(want, i));
        mt_release(x);
        mt_release(y);
    }
}

/* A parameter that no step has updated yet has no moments; loading such a state drops the
   moments the target optimizer had made, so its state equals the saved one. */
static void test_optimizer_state_lazy_moments(void **state) {
    (void)state;
    two_params tp;
    two_params_make(&tp);
    mt_tensor *p[2] = {tp.a, tp.b};
    mt_optimizer *o1 = mt_adam_new(p, 2, NULL), *o2 = mt_adam_new(p, 2, NULL);
    mt_set_grad(tp.a, tp.ga); /* o1: only a has a gradient */
    assert_int_equal(mt_optimizer_step(o1), 0);
    mt_set_grad(tp.b, tp.gb); /* o2: both */
    assert_int_equal(mt_optimizer_step(o2), 0);
    mt_state *s = mt_state_new(), *t = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o1, s, ""), 0);
    assert_true(mt_state_contains(s, "state.0.exp_avg"));
    assert_false(mt_state_contains(s, "state.1.exp_avg"));
    assert_int_equal(mt_optimizer_state_load(o2, s, ""), 0);
    assert_int_equal(mt_optimizer_state_save(o2, t, ""), 0);
    assert_false(mt_state_contains(t, "state.1.exp_avg_sq"));
    assert_same_state(s, t);
    mt_state_free(s);
    mt_state_free(t);
    mt_optimizer_free(o1);
    mt_optimizer_free(o2);
    two_params_free(&tp);
}

/* Adam's step counts are per parameter, saved as torch's "state.<i>.step" (F32 scalars) for
   the parameters that have moments. A state saved before that has one "step" for all; it
   still loads. A bad count is refused and changes nothing. */
/* A state cannot bring in what the constructor refuses: nesterov with momentum 0. */
static void test_optimizer_state_nesterov_momentum(void **state) {
    (void)state;
    two_params tp;
    two_params_make(&tp);
    mt_tensor *p[2] = {tp.a, tp.b};
    mt_optimizer *o = mt_momentum_new(p, 2, &(mt_momentum_opts){.nesterov = true});
    mt_state *s = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o, s, ""), 0);
    mt_tensor *zero = mt_scalar(0, MT_F64, MT_CPU);
    mt_state_put(s, "momentum", zero);
    assert_int_equal(mt_optimizer_state_load(o, s, ""), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "saved momentum is 0, which nesterov refuses");
    mt_release(zero);
    mt_state_free(s);
    mt_optimizer_free(o);
    two_params_free(&tp);
}

static void test_optimizer_state_step_counts(void **state) {
    (void)state;
    two_params tp;
    two_params_make(&tp);
    mt_tensor *p[2] = {tp.a, tp.b};
    mt_optimizer *o = mt_adamw_new(p, 2, NULL);
    mt_set_grad(tp.a, tp.ga);
    for (int i = 0; i < 3; i++) assert_int_equal(mt_optimizer_step(o), 0);
    mt_set_grad(tp.b, tp.gb);
    assert_int_equal(mt_optimizer_step(o), 0); /* a: 4 steps, b: 1 */
    mt_state *s = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o, s, "o."), 0);
    mt_tensor *s0 = mt_state_get(s, "o.state.0.step"), *s1 = mt_state_get(s, "o.state.1.step");
    assert_non_null(s0);
    assert_non_null(s1);
    assert_int_equal(mt_ndim(s0), 0);
    assert_int_equal(mt_dtype_of(s0), MT_F32);
    assert_float_equal(mt_item(s0), 4, 0);
    assert_float_equal(mt_item(s1), 1, 0);
    assert_false(mt_state_contains(s, "o.step"));

    /* a count of the wrong dtype: refused, the optimizer's state unchanged */
    mt_optimizer *o2 = mt_adamw_new(p, 2, NULL);
    mt_state *before = mt_state_new(), *after = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o2, before, ""), 0);
    mt_tensor *bad = mt_scalar(4, MT_F64, MT_CPU);
    mt_state_put(s, "o.state.1.step", bad);
    assert_int_equal(mt_optimizer_state_load(o2, s, "o."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "entry 'o.state.1.step' is not an f32 scalar");
    assert_int_equal(mt_optimizer_state_save(o2, after, ""), 0);
    assert_same_state(before, after);
    /* counts that are not whole numbers >= 0: refused, nothing changed */
    const double not_counts[] = {NAN, -4, 2.5, INFINITY};
    for (size_t i = 0; i < sizeof not_counts / sizeof not_counts[0]; i++) {
        mt_tensor *nc = mt_scalar(not_counts[i], MT_F32, MT_CPU);
        mt_state_put(s, "o.state.0.step", nc);
        mt_release(nc);
        assert_int_equal(mt_optimizer_state_load(o2, s, "o."), MT_ERR_INVALID);
        assert_error(MT_ERR_INVALID, "is not a step count");
        mt_state *again = mt_state_new();
        assert_int_equal(mt_optimizer_state_save(o2, again, ""), 0);
        assert_same_state(before, again);
        mt_state_free(again);
    }
    mt_state_put(s, "o.state.0.step", s0);
    /* the older form: one "step" for every parameter with moments */
    mt_state_put(s, "o.state.1.step", s1);
    mt_tensor *old = mt_scalar(7, MT_F32, MT_CPU);
    mt_state_put(s, "o.step", old);
    assert_int_equal(mt_optimizer_state_load(o2, s, "o."), 0);
    mt_state *t = mt_state_new();
    assert_int_equal(mt_optimizer_state_save(o2, t, "o."), 0);
    mt_tensor *t0 = mt_state_get(t, "o.state.0.step"), *t1 = mt_state_get(t, "o.state.1.step");
    assert_float_equal(mt_item(t0), 7, 0);
    assert_float_equal(mt_item(t1), 7, 0);
    assert_no_error();
    mt_tensor *keep[] = {t0, t1, old, bad, s0, s1};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) mt_release(keep[i]);
    mt_state *states[] = {s, t, before, after};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) mt_state_free(states[i]);
    mt_optimizer_free(o);
    mt_optimizer_free(o2);
    two_params_free(&tp);
}

static void test_scaler_state_errors(void **state) {
    (void)state;
    const amp_cfg o1 = {MT_F16, MT_AMP_O1, false};
    rig a = {0};
    rig_make(&a, K_SGD, &o1, 1, false);
    mt_state *s = mt_state_new();
    /* before first use: the host values */
    assert_int_equal(mt_grad_scaler_state_save(a.scaler, s, "sc."), 0);
    mt_tensor *first = mt_state_get(s, "sc.scale");
    assert_true(mt_item(first) == 256.0);
    mt_release(first);
    train(&a, &o1, 0, 3, 1);
    assert_int_equal(mt_grad_scaler_state_save(a.scaler, s, "sc."), 0);
    mt_tensor *sc = mt_state_get(s, "sc.scale"); /* kept to put back */
    mt_grad_scaler *b = mt_grad_scaler_new(NULL);
    assert_int_equal(mt_grad_scaler_state_load(b, s, "sc."), 0);
    mt_grad_scaler_state sa, sb;
    mt_grad_scaler_state_get(a.scaler, &sa);
    mt_grad_scaler_state_get(b, &sb);
    assert_true(sa.scale == sb.scale && sa.good_steps == sb.good_steps && sb.skipped_steps == 1);
    /* a scale outside the saved range */
    mt_tensor *big = mt_scalar(1e30, MT_F32, MT_CPU);
    mt_state_put(s, "sc.scale", big);
    assert_int_equal(mt_grad_scaler_state_load(b, s, "sc."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "saved scale 1e+30 is outside");
    mt_grad_scaler_state_get(b, &sb);
    assert_true(sa.scale == sb.scale); /* unchanged */
    /* counters that are no count the F32 state could hold: inf, past 2^24, fractional */
    mt_state_put(s, "sc.scale", sc);
    const double bad_counts[] = {INFINITY, 1e30, 16777218.0, 2.5, -1.0};
    for (size_t i = 0; i < sizeof bad_counts / sizeof *bad_counts; i++) {
        mt_tensor *c = mt_scalar(bad_counts[i], MT_F32, MT_CPU);
        mt_state_put(s, i % 2 ? "sc.skipped_steps" : "sc.growth_tracker", c);
        assert_int_equal(mt_grad_scaler_state_load(b, s, "sc."), MT_ERR_INVALID);
        assert_error(MT_ERR_INVALID, "is not a count in [0, 2^24]");
        mt_grad_scaler_state_get(b, &sb);
        assert_true(sb.good_steps == sa.good_steps && sb.skipped_steps == 1);
        mt_release(c);
    }
    mt_tensor *zero = mt_scalar(0, MT_F32, MT_CPU);
    mt_state_put(s, "sc.growth_tracker", zero);
    mt_state_put(s, "sc.skipped_steps", zero);
    mt_release(zero);
    assert_int_equal(mt_grad_scaler_state_load(b, s, "nope."), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "no entry 'nope.growth_factor'");
    /* between step and update */
    mt_scope_begin();
    mt_tensor *x, *y;
    batch(0, false, &x, &y);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *loss = mt_mse_loss(
        mt_linear_layer_forward(&a.fc2, mt_relu(mt_linear_layer_forward(&a.fc1, x))), y);
    mt_autocast_end();
    mt_backward(mt_grad_scaler_scale(a.scaler, loss), NULL);
    assert_int_equal(mt_grad_scaler_unscale(a.scaler, a.opt), 0);
    assert_int_equal(mt_grad_scaler_state_save(a.scaler, s, "sc."), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "between unscale/step and update");
    assert_int_equal(mt_grad_scaler_step(a.scaler, a.opt), 0);
    assert_int_equal(mt_grad_scaler_update(a.scaler), 0);
    mt_scope_end();
    mt_release(big);
    mt_release(sc);
    mt_grad_scaler_free(b);
    mt_state_free(s);
    rig_free(&a);
}

/* ---------------------------------------------------------------- files from Python */

static void test_python_dtypes(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_state *s = mt_state_load(MT_TEST_DATA_DIR "/dtypes.safetensors", dev);
    assert_non_null(s);
    assert_string_equal(mt_state_get_meta(s, "format"), "pt");
    assert_string_equal(mt_state_get_meta(s, "writer"), "tools/gen_state_data.py");
    assert_int_equal(mt_state_count(s), 9);
    const float f32[6] = {-1, -0.5f, 0, 0.5f, 1, 1.5f};
    const double f64[4] = {0, 1 / 3.0, 2 / 3.0, 1.0};
    const int64_t i64[3] = {-((int64_t)1 << 40), 0, ((int64_t)1 << 40) + 1};
    const int32_t i32[4] = {-7, 0, INT32_MAX, INT32_MIN};
    const uint8_t b8[4] = {1, 0, 1, 1};
    const float scalar = 2.5f;
    mt_scope_begin(); /* the expected tensors and their intermediates */
    mt_tensor *ref32 = mt_from_data(f32, MT_F32, MT_SHAPE(2, 3), MT_CPU);
    mt_tensor *want[9] = {
        ref32,
        mt_reshape(mt_cast(ref32, MT_F16), MT_SHAPE(3, 2)),
        mt_reshape(mt_cast(ref32, MT_BF16), MT_SHAPE(6)),
        mt_from_data(f64, MT_F64, MT_SHAPE(4), MT_CPU),
        mt_from_data(i64, MT_I64, MT_SHAPE(3), MT_CPU),
        mt_from_data(i32, MT_I32, MT_SHAPE(2, 2), MT_CPU),
        mt_from_data(b8, MT_BOOL, MT_SHAPE(4), MT_CPU),
        mt_from_data(&scalar, MT_F32, 0, NULL, MT_CPU),
        mt_zeros(MT_SHAPE(0, 3), MT_F32, MT_CPU),
    };
    const char *names[9] = {"f32", "f16", "bf16", "f64", "i64", "i32", "bool", "scalar", "empty"};
    for (int i = 0; i < 9; i++) {
        mt_tensor *t = mt_state_get(s, names[i]);
        assert_non_null(t);
        assert_int_equal(mt_ndim(t), mt_ndim(want[i]));
        for (int d = 0; d < mt_ndim(t); d++) assert_int_equal(mt_dim(t, d), mt_dim(want[i], d));
        assert_same_bits(t, want[i], names[i]);
    }
    mt_scope_end();
    mt_state_free(s);
}

/* A PyTorch model's state dict loads into the matching mixtape layers (train_mlp's MLP) and
   computes what PyTorch computed. */
static void test_pytorch_mlp(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_linear_layer fc1 = {0}, fc2 = {0};
    assert_int_equal(mt_linear_layer_init(&fc1, 32, 64, true, MT_F32, dev), 0);
    assert_int_equal(mt_linear_layer_init(&fc2, 64, 8, true, MT_F32, dev), 0);
    mt_state *s = mt_state_load(MT_TEST_DATA_DIR "/mlp.safetensors", MT_CPU);
    assert_non_null(s);
    mt_tensor *params[4] = {fc1.weight, fc1.bias, fc2.weight, fc2.bias};
    const char *names[4] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    assert_int_equal(mt_state_load_into(s, NULL, params, names, 4, true), 0);
    mt_state_free(s);
    s = mt_state_load(MT_TEST_DATA_DIR "/mlp_io.safetensors", dev);
    assert_non_null(s);
    mt_scope_begin();
    mt_tensor *y =
        mt_linear_layer_forward(&fc2, mt_relu(mt_linear_layer_forward(&fc1, mt_state_get(s, "x"))));
    mt_tensor *want = mt_state_get(s, "y");
    float a[32], b[32];
    assert_int_equal(mt_copy_to_host(y, a, sizeof a), 0);
    assert_int_equal(mt_copy_to_host(want, b, sizeof b), 0);
    for (int i = 0; i < 32; i++)
        if (fabsf(a[i] - b[i]) > 1e-5f * (1 + fabsf(b[i])))
            fail_msg("y[%d]: mixtape %.8g, PyTorch %.8g", i, a[i], b[i]);
    mt_scope_end();
    mt_state_free(s);
    mt_linear_layer_free(&fc1);
    mt_linear_layer_free(&fc2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_load_into),
        MT_TEST(test_linear_layer_names),
        MT_TEST(test_resume_sgd),
        MT_TEST(test_resume_momentum),
        MT_TEST(test_resume_adam),
        MT_TEST(test_resume_adamw),
        MT_TEST(test_optimizer_state_errors),
        MT_TEST(test_optimizer_state_lazy_moments),
        MT_TEST(test_optimizer_state_nesterov_momentum),
        MT_TEST(test_optimizer_state_step_counts),
        MT_TEST(test_scaler_state_errors),
        MT_TEST(test_python_dtypes),
        MT_TEST(test_pytorch_mlp),
    };
    return MT_RUN_TESTS(tests);
}

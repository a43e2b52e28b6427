/* Whole training steps on two devices: small random training configurations (an MLP or a
   CNN with batch norm and a residual, autocast level and dtype, optimizer, GradScaler,
   gradient clipping, channels-last, dropout, gradient accumulation, a step with an inf in its
   input) trained for a few steps from the same parameters and data on MT_CPU and on
   MT_CUDA(0), then compared.
   test_parity checks each op alone; this checks what only shows when they run together: the
   scaler's skip decisions and scale updates, masters and moments, the optimizer kernels
   against the CPU's loops, layouts through decorate and autocast, clipping, and the state a
   skipped step must leave alone.

   What must agree:
   - exactly: which steps were skipped, the loss scale after every update, and a parameter's
     values when every step was skipped;
   - within a tolerance: each step's loss and clip norm, each parameter's and master's change
     over the run, the last step's gradients, the batch-norm running statistics and the
     logits of an eval-mode forward. FP32 runs (no autocast): every element within 1e-3 of
     the tensor's largest |change| (or |value|), where only summation order differs (the
     largest seen over seeds 1-1500 was 4.7e-5). Low precision: the L2 norm of the
     differences within 0.3 of the tensor's, after one ulp of a stored F16 or BF16 value. Two
     values one ulp apart on the CPU can tie on the device, which flips a max-pool winner,
     and a value within an ulp of 0 can flip a ReLU; either moves one term of a gradient's
     batch sum (over seeds 1-1500 the largest was 0.10, seed 282, and a few more above 0.03,
     all with max pooling or batch norm; an earlier set of configurations reached 0.185, each
     such case traced to a flip), so there only gross differences are caught (a missing
     unscale, a decay or a step count gone wrong, a wrong master): what a wrong kernel gives.
     Adam's eps is kept large enough that its update is not a sign function of near-zero
     gradients.
   Flips also happen in FP32, rarely: a search over seeds 1-20000 on the emulated device
   failed 3 configurations, each traced to a ReLU input of about 1e-7 with opposite signs on
   the two devices (seeds 5153 and 7919, FP32) or to ReLU flips in FP16 (seed 7643, L2 0.40).
   So a failure in a long search needs tracing (compare the activations of both runs step by
   step) before it counts as a bug. Both runs are deterministic, so a configuration passes or
   fails the same way every time, and the suite's seeds 1-24 pass. MT_FUZZ_SEEDS widens the
   search (see mt_test_seed_range). Without a CUDA device every configuration is reported
   skipped; the harness self-test runs anyway (CPU against CPU). */
#include "test_util.h"

#define STEPS       4
#define BATCH       8
#define CLASSES     5
#define MAX_PARAMS  10
#define MAX_BUFFERS 4

typedef enum { ARCH_MLP, ARCH_CNN } arch_kind;
typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_NESTEROV, OPT_ADAM, OPT_ADAMW, OPT_COUNT } opt_kind;
static const char *const opt_names[OPT_COUNT] = {"sgd", "momentum", "nesterov", "adam", "adamw"};

typedef struct {
    uint64_t seed;
    arch_kind arch;
    bool channels_last, fused_bn, max_pool; /* CNN */
    bool layer_norm, linear_act, embed;     /* MLP (embed: plus an embedding of 3 ids a row) */
    mt_activation act;                      /* MLP: RELU, GELU or GELU_TANH */
    double dropout;                         /* 0: none */
    bool cross_entropy;                     /* else MSE against a target */
    mt_dtype low;                           /* MT_F32: no autocast */
    mt_amp_level level;
    opt_kind opt;
    double lr, weight_decay, eps;
    bool scaler;
    double init_scale;
    int growth_interval;
    int bad_step;        /* the step whose input holds an inf, -1 for none */
    double clip;         /* max_norm after unscale; 0: no clipping */
    bool clip_async;     /* mt_clip_grad_norm_async (no host wait) instead of mt_clip_grad_norm */
    bool accumulate;     /* two backward passes per step (gradient accumulation) */
    bool two_optimizers; /* the parameters split between two optimizers of one scaler */
} config;

/* ------------------------------------------------------------------ random configurations */

static int draw_int(uint64_t *s, int lo, int hi) { /* [lo, hi] */
    int v = lo + (int)mt_test_urand(s, 0, hi - lo + 1);
    return v > hi ? hi : v;
}

static bool draw_bool(uint64_t *s) {
    return draw_int(s, 0, 1) == 1;
}

static config config_draw(uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
    config c = {.seed = seed, .arch = draw_bool(&s) ? ARCH_CNN : ARCH_MLP};
    c.channels_last = c.arch == ARCH_CNN && draw_bool(&s);
    c.fused_bn = c.arch == ARCH_CNN && draw_bool(&s);
    c.max_pool = c.arch == ARCH_CNN && draw_bool(&s);
    c.layer_norm = c.arch == ARCH_MLP && draw_bool(&s);
    c.linear_act = c.arch == ARCH_MLP && draw_bool(&s);
    c.dropout = draw_int(&s, 0, 2) == 0 ? 0.0 : mt_test_urand(&s, 0.05, 0.3);
    c.cross_entropy = draw_bool(&s);
    static const mt_dtype lows[3] = {MT_F32, MT_F16, MT_BF16};
    c.low = lows[draw_int(&s, 0, 2)];
    c.level = c.low != MT_F32 && draw_bool(&s) ? MT_AMP_O2 : MT_AMP_O1;
    c.opt = (opt_kind)draw_int(&s, 0, OPT_COUNT - 1);
    bool adam = c.opt == OPT_ADAM || c.opt == OPT_ADAMW;
    c.lr = adam ? mt_test_urand(&s, 1e-3, 1e-2) : mt_test_urand(&s, 0.01, 0.1);
    c.weight_decay = draw_bool(&s) ? mt_test_urand(&s, 0.01, 0.3) : 0.0;
    c.eps = c.low == MT_F32 ? mt_test_urand(&s, 1e-4, 1e-3) : mt_test_urand(&s, 1e-2, 5e-2);
    c.scaler = c.low != MT_F32 || draw_bool(&s);
    c.init_scale = ldexp(1.0, draw_int(&s, 0, 10));
    c.growth_interval = draw_int(&s, 1, 3);
    /* never the last step, whose gradients are compared */
    c.bad_step = c.scaler && draw_bool(&s) ? draw_int(&s, 0, STEPS - 2) : -1;
    c.clip = draw_bool(&s) ? mt_test_urand(&s, 0.05, 2.0) : 0.0;
    c.clip_async = c.clip > 0 && draw_bool(&s);
    c.accumulate = draw_int(&s, 0, 3) == 0;
    static const mt_activation acts[3] = {MT_ACT_RELU, MT_ACT_GELU, MT_ACT_GELU_TANH};
    c.act = c.arch == ARCH_MLP ? acts[draw_int(&s, 0, 2)] : MT_ACT_RELU;
    c.embed = c.arch == ARCH_MLP && draw_bool(&s);
    c.two_optimizers = draw_int(&s, 0, 3) == 0;
    return c;
}

static const char *config_describe(const config *c, char *buf, size_t cap) {
    char model[96];
    if (c->arch == ARCH_MLP)
        snprintf(model, sizeof model, "mlp %s%s%s%s",
                 c->act == MT_ACT_RELU   ? "relu"
                 : c->act == MT_ACT_GELU ? "gelu"
                                         : "gelu-tanh",
                 c->layer_norm ? "+layer_norm" : "", c->linear_act ? "+linear_act" : "",
                 c->embed ? "+embedding" : "");
    else
        snprintf(model, sizeof model, "cnn%s%s %s", c->channels_last ? " channels-last" : "",
                 c->fused_bn ? " fused-bn" : "", c->max_pool ? "max-pool" : "avg-pool");
    char amp[32] = "fp32";
    if (c->low != MT_F32)
        snprintf(amp, sizeof amp, "%s-%s", c->level == MT_AMP_O2 ? "o2" : "o1",
                 mt_dtype_name(c->low));
    snprintf(buf, cap,
             "seed %llu: %s, dropout %.2f, %s, %s, %s lr %.3g wd %.3g eps %.3g, scaler %s "
             "(init %g, growth every %d), inf at step %d, clip %.3g%s%s%s",
             (unsigned long long)c->seed, model, c->dropout, c->cross_entropy ? "ce" : "mse", amp,
             opt_names[c->opt], c->lr, c->weight_decay, c->eps, c->scaler ? "on" : "off",
             c->init_scale, c->growth_interval, c->bad_step, c->clip, c->clip_async ? " async" : "",
             c->accumulate ? ", two backward passes a step" : "",
             c->two_optimizers ? ", two optimizers" : "");
    return buf;
}

/* ------------------------------------------------------------------ model and data */

/* The parameters' shapes and initial values, and the data of every step: host values made
   once per configuration, handed to both runs. */
typedef struct {
    int n;
    int ndim[MAX_PARAMS];
    int64_t shape[MAX_PARAMS][4];
    double *init[MAX_PARAMS];
    bool keep_fp32[MAX_PARAMS]; /* norm parameters: FP32 under O2 */
    int n_buffers;              /* batch norm's running mean and variance, [channels] each */
    int64_t buffer_len;
    int x_ndim;
    int64_t x_shape[4];
    double *x[STEPS], *target[STEPS];
    int64_t labels[STEPS][BATCH];
    int embedding; /* index of the embedding's weight, -1 without one */
    int64_t ids[STEPS][BATCH * 3];
} problem;

/* Norm parameters (SCALE, SHIFT) stay FP32 under O2. */
enum { INIT_WEIGHT, INIT_BIAS, INIT_SCALE, INIT_SHIFT, INIT_EMBEDDING };

static void add_param(problem *p, uint64_t *s, int kind, int ndim, const int64_t *shape) {
    int i = p->n++;
    p->ndim[i] = ndim;
    memcpy(p->shape[i], shape, (size_t)ndim * sizeof *shape);
    int64_t n = mt_test_numel(ndim, shape), fan_in = n / shape[0];
    p->init[i] = malloc((size_t)n * sizeof(double));
    p->keep_fp32[i] = kind == INIT_SCALE || kind == INIT_SHIFT;
    double bound = kind == INIT_WEIGHT      ? 1.0 / sqrt((double)fan_in)
                   : kind == INIT_EMBEDDING ? 1.0
                                            : 0.1;
    for (int64_t k = 0; k < n; k++)
        p->init[i][k] = (kind == INIT_SCALE ? 1.0 : 0.0) + mt_test_urand(s, -bound, bound);
}

/* MLP: x [+ the embeddings (20 x 4) of 3 ids a row, flattened], linear(12, 16), an
   activation, [layer_norm(16)], dropout, linear(16, 5).
   CNN: conv 3x3 (3 -> 4) + bn + relu = h; conv 3x3 (4 -> 4) + bn + h, relu; 2x2 pooling,
   global average, dropout, linear(4, 5). The convolutions have no bias, as in ResNets: batch
   norm takes the mean out, so a bias's gradient would be rounding noise, which Adam scales up
   to an update of lr * noise / eps that differs between devices by its own size. */
static void problem_make(problem *p, const config *c) {
    uint64_t s = c->seed * 0xD1B54A32D192ED03ULL + 11;
    *p = (problem){0};
    if (c->arch == ARCH_MLP) {
        add_param(p, &s, INIT_WEIGHT, MT_SHAPE(16, 12));
        add_param(p, &s, INIT_BIAS, MT_SHAPE(16));
        add_param(p, &s, INIT_WEIGHT, MT_SHAPE(CLASSES, 16));
        add_param(p, &s, INIT_BIAS, MT_SHAPE(CLASSES));
        if (c->layer_norm) {
            add_param(p, &s, INIT_SCALE, MT_SHAPE(16));
            add_param(p, &s, INIT_SHIFT, MT_SHAPE(16));
        }
        p->embedding = c->embed ? p->n : -1;
        if (c->embed) add_param(p, &s, INIT_EMBEDDING, MT_SHAPE(20, 4));
        p->x_ndim = 2;
        memcpy(p->x_shape, (int64_t[]){BATCH, 12}, 2 * sizeof(int64_t));
    } else {
        p->embedding = -1;
        add_param(p, &s, INIT_WEIGHT, MT_SHAPE(4, 3, 3, 3));
        add_param(p, &s, INIT_SCALE, MT_SHAPE(4));
        add_param(p, &s, INIT_SHIFT, MT_SHAPE(4));
        add_param(p, &s, INIT_WEIGHT, MT_SHAPE(4, 4, 3, 3));
        add_param(p, &s, INIT_SCALE, MT_SHAPE(4));
        add_param(p, &s, INIT_SHIFT, MT_SHAPE(4));
        add_param(p, &s, INIT_WEIGHT, MT_SHAPE(CLASSES, 4));
        add_param(p, &s, INIT_BIAS, MT_SHAPE(CLASSES));
        p->n_buffers = 4;
        p->buffer_len = 4;
        p->x_ndim = 4;
        memcpy(p->x_shape, (int64_t[]){BATCH, 3, 6, 6}, 4 * sizeof(int64_t));
    }
    int64_t nx = mt_test_numel(p->x_ndim, p->x_shape);
    for (int t = 0; t < STEPS; t++) {
        p->x[t] = malloc((size_t)nx * sizeof(double));
        p->target[t] = malloc(BATCH * CLASSES * sizeof(double));
        for (int64_t k = 0; k < nx; k++) p->x[t][k] = mt_test_urand(&s, -1.5, 1.5);
        for (int k = 0; k < BATCH * CLASSES; k++) p->target[t][k] = mt_test_urand(&s, -1, 1);
        for (int k = 0; k < BATCH; k++) p->labels[t][k] = draw_int(&s, 0, CLASSES - 1);
        for (int k = 0; k < BATCH * 3; k++) p->ids[t][k] = draw_int(&s, 0, 19);
        if (t == c->bad_step) p->x[t][nx / 3] = INFINITY;
    }
}

static void problem_free(problem *p) {
    for (int i = 0; i < p->n; i++) free(p->init[i]);
    for (int t = 0; t < STEPS; t++) {
        free(p->x[t]);
        free(p->target[t]);
    }
}

/* relu(bn(x) [+ residual]), fused or as separate ops. */
static mt_tensor *bn_relu(const config *c, bool training, mt_tensor *x, mt_tensor *const *buf,
                          mt_tensor *w, mt_tensor *b, mt_tensor *residual) {
    if (c->fused_bn)
        return mt_batch_norm_act(x, buf[0], buf[1], w, b, residual, training, 0.1, 1e-5,
                                 MT_ACT_RELU);
    mt_tensor *y = mt_batch_norm(x, buf[0], buf[1], w, b, training, 0.1, 1e-5);
    return mt_relu(residual ? mt_add(y, residual) : y);
}

static mt_tensor *activation(mt_tensor *x, mt_activation act) {
    return act == MT_ACT_GELU ? mt_gelu(x) : act == MT_ACT_GELU_TANH ? mt_gelu_tanh(x) : mt_relu(x);
}

static mt_tensor *forward_mlp(const config *c, const problem *pb, bool training,
                              mt_tensor *const *p, mt_tensor *x, mt_tensor *ids) {
    if (c->embed)
        x = mt_add(x, mt_reshape(mt_embedding(p[pb->embedding], ids), MT_SHAPE(BATCH, 12)));
    mt_tensor *h = c->linear_act ? mt_linear_act(x, p[0], p[1], c->act)
                                 : activation(mt_linear(x, p[0], p[1]), c->act);
    if (c->layer_norm) h = mt_layer_norm(h, 1, p[4], p[5], 1e-5);
    return mt_linear(mt_dropout(h, c->dropout, training), p[2], p[3]);
}

static mt_tensor *forward(const config *c, const problem *pb, bool training, mt_tensor *const *p,
                          mt_tensor *const *buf, mt_tensor *x, mt_tensor *ids) {
    if (c->arch == ARCH_MLP) return forward_mlp(c, pb, training, p, x, ids);
    const mt_conv2d_opts same = {.padding = {1, 1}};
    mt_tensor *h = bn_relu(c, training, mt_conv2d(x, p[0], NULL, &same), buf, p[1], p[2], NULL);
    h = bn_relu(c, training, mt_conv2d(h, p[3], NULL, &same), buf + 2, p[4], p[5], h);
    const mt_pool2d_opts pool = {.kernel = {2, 2}};
    h = c->max_pool ? mt_max_pool2d(h, &pool) : mt_avg_pool2d(h, &pool);
    h = mt_reshape(mt_adaptive_avg_pool2d(h, 1, 1), MT_SHAPE(BATCH, 4));
    return mt_linear(mt_dropout(h, c->dropout, training), p[6], p[7]);
}

/* ------------------------------------------------------------------ one run */

typedef struct {
    double loss[STEPS], norm[STEPS];
    float scale[STEPS];
    bool skipped[STEPS];
    double *param[MAX_PARAMS], *grad[MAX_PARAMS], *master[MAX_PARAMS], *buffer[MAX_BUFFERS];
    double *eval; /* the logits of an eval-mode forward after the last step */
    mt_dtype param_dtype[MAX_PARAMS];
    char error[400]; /* "" when the run went through */
} run_result;

static void run_result_free(run_result *r) {
    for (int i = 0; i < MAX_PARAMS; i++) {
        free(r->param[i]);
        free(r->grad[i]);
        free(r->master[i]);
    }
    for (int i = 0; i < MAX_BUFFERS; i++) free(r->buffer[i]);
    free(r->eval);
}

static mt_optimizer *optimizer_make(const config *c, mt_tensor *const *params, int n, double lr) {
    bool mp = c->level == MT_AMP_O2;
    switch (c->opt) {
    case OPT_SGD:
        return mt_sgd_new(params, n,
                          &(mt_sgd_opts){.lr = MT_SET(lr),
                                         .weight_decay = c->weight_decay,
                                         .multi_precision = mp});
    case OPT_MOMENTUM:
    case OPT_NESTEROV:
        return mt_momentum_new(params, n,
                               &(mt_momentum_opts){.lr = MT_SET(lr),
                                                   .momentum = MT_SET(0.9),
                                                   .weight_decay = c->weight_decay,
                                                   .nesterov = c->opt == OPT_NESTEROV,
                                                   .multi_precision = mp});
    default: {
        mt_adam_opts o = {.lr = MT_SET(lr),
                          .eps = MT_SET(c->eps),
                          .weight_decay = MT_SET(c->weight_decay),
                          .multi_precision = mp};
        return c->opt == OPT_ADAM ? mt_adam_new(params, n, &o) : mt_adamw_new(params, n, &o);
    }
    }
}

/* A host array (doubles) as an F32 tensor on dev. */
static mt_tensor *on_device(const double *v, int ndim, const int64_t *shape, mt_device dev) {
    return mt_cast(mt_from_data(v, MT_F64, ndim, shape, dev), MT_F32);
}

/* What one run trains: the model's tensors on one device, its optimizers (the parameters
   [0, split) in the first, the rest in the second when there are two) and the scaler. */
typedef struct {
    mt_device dev;
    mt_tensor *params[MAX_PARAMS], *buffers[MAX_BUFFERS];
    mt_optimizer *opt[2];
    int n_opt, split;
    mt_grad_scaler *scaler;
} trainer;

/* The model's tensors on dev, laid out and cast as the configuration asks, its optimizers
   and scaler; false on error. */
static bool trainer_make(trainer *tr, const config *c, const problem *pb, mt_device dev,
                         double lr_factor) {
    *tr = (trainer){.dev = dev, .n_opt = c->two_optimizers ? 2 : 1};
    tr->split = c->two_optimizers ? pb->n / 2 : pb->n;
    for (int i = 0; i < pb->n; i++) {
        tr->params[i] = on_device(pb->init[i], pb->ndim[i], pb->shape[i], dev);
        mt_set_requires_grad(tr->params[i], true);
    }
    for (int i = 0; i < pb->n_buffers; i++)
        tr->buffers[i] = i % 2 ? mt_ones(1, &pb->buffer_len, MT_F32, dev)
                               : mt_zeros(1, &pb->buffer_len, MT_F32, dev);
    if (mt_last_status() != MT_OK) return false;
    if (c->channels_last && mt_params_to_channels_last(tr->params, pb->n) != 0) return false;
    if (c->level == MT_AMP_O2 && mt_amp_decorate(tr->params, pb->n, c->low, pb->keep_fp32) != 0)
        return false;
    tr->opt[0] = optimizer_make(c, tr->params, tr->split, c->lr * lr_factor);
    if (tr->n_opt == 2)
        tr->opt[1] =
            optimizer_make(c, tr->params + tr->split, pb->n - tr->split, c->lr * lr_factor);
    tr->scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = c->init_scale,
                                                           .growth_interval = c->growth_interval,
                                                           .disabled = !c->scaler});
    return tr->opt[0] && (tr->n_opt == 1 || tr->opt[1]) && tr->scaler;
}

static void trainer_free(trainer *tr) {
    mt_optimizer_free(tr->opt[0]);
    mt_optimizer_free(tr->opt[1]);
    mt_grad_scaler_free(tr->scaler);
}

/* The logits of step t's data under autocast (the parameters as they are now). */
static mt_tensor *logits_of(const config *c, const problem *pb, const trainer *tr, int t,
                            bool training) {
    mt_tensor *x = on_device(pb->x[t], pb->x_ndim, pb->x_shape, tr->dev);
    if (c->channels_last) x = mt_to_channels_last(x);
    mt_tensor *ids = mt_from_data(pb->ids[t], MT_I64, MT_SHAPE(BATCH, 3), tr->dev);
    if (c->low != MT_F32) mt_autocast_begin(c->low, c->level);
    mt_tensor *logits = forward(c, pb, training, tr->params, tr->buffers, x, ids);
    if (c->low != MT_F32) mt_autocast_end();
    return logits;
}

/* Forward and the scaled backward; the step's loss in *loss. */
static bool forward_backward(const config *c, const problem *pb, const trainer *tr, int t,
                             mt_tensor **loss) {
    mt_tensor *logits = logits_of(c, pb, tr, t, true);
    if (c->cross_entropy)
        *loss =
            mt_cross_entropy(logits, mt_from_data(pb->labels[t], MT_I64, MT_SHAPE(BATCH), tr->dev));
    else
        *loss = mt_mse_loss(logits, on_device(pb->target[t], MT_SHAPE(BATCH, CLASSES), tr->dev));
    return mt_backward(mt_grad_scaler_scale(tr->scaler, *loss), NULL) == 0;
}

/* Unscale and clip (each optimizer's gradients on their own: the sum of the norms is
   recorded), step each optimizer, one update. */
static bool step_all(const config *c, const trainer *tr, double *norm) {
    *norm = 0;
    for (int k = 0; k < tr->n_opt; k++) {
        mt_optimizer *o = tr->opt[k];
        if (c->clip > 0) {
            if (mt_grad_scaler_unscale(tr->scaler, o) != 0) return false;
            *norm += c->clip_async ? mt_item(mt_clip_grad_norm_async(o, c->clip))
                                   : mt_clip_grad_norm(o, c->clip);
        }
        if (mt_grad_scaler_step(tr->scaler, o) != 0) return false;
    }
    return mt_grad_scaler_update(tr->scaler) == 0;
}

/* One step: forward and backward (twice when accumulating), step, update; records the
   step's figures, and the gradients after the last step. */
static bool train_step(const config *c, const problem *pb, const trainer *tr, int t,
                       run_result *r) {
    mt_tensor *loss = NULL;
    for (int pass = 0; pass < (c->accumulate ? 2 : 1); pass++)
        if (!forward_backward(c, pb, tr, t, &loss)) return false;
    if (!step_all(c, tr, &r->norm[t])) return false;
    r->loss[t] = mt_item(loss);
    r->skipped[t] = mt_grad_scaler_last_step_skipped(tr->scaler);
    r->scale[t] = mt_grad_scaler_get_scale(tr->scaler);
    if (t == STEPS - 1)
        for (int i = 0; i < pb->n; i++) {
            mt_tensor *g = mt_grad(tr->params[i]);
            r->grad[i] = g ? mt_test_values(g) : NULL;
            mt_release(g);
        }
    for (int k = 0; k < tr->n_opt; k++) mt_optimizer_zero_grad(tr->opt[k]);
    return mt_last_status() == MT_OK;
}

/* The parameters, masters, running statistics and an eval-mode forward of the last step's
   data (batch norm on its running statistics, no dropout). */
static void record_state(const config *c, const problem *pb, const trainer *tr, run_result *r) {
    for (int i = 0; i < pb->n; i++) {
        r->param[i] = mt_test_values(tr->params[i]);
        r->param_dtype[i] = mt_dtype_of(tr->params[i]);
        int k = i < tr->split ? 0 : 1;
        mt_tensor *m = mt_optimizer_master(tr->opt[k], k ? i - tr->split : i);
        r->master[i] = m ? mt_test_values(m) : NULL;
        mt_release(m);
    }
    for (int i = 0; i < pb->n_buffers; i++) r->buffer[i] = mt_test_values(tr->buffers[i]);
    r->eval = mt_test_values(logits_of(c, pb, tr, STEPS - 1, false));
}

/* Trains the configuration on dev for STEPS steps; lr_factor scales the learning rate (the
   harness self-test's deliberate difference). */
static void run(const config *c, const problem *pb, mt_device dev, double lr_factor,
                run_result *r) {
    *r = (run_result){0};
    mt_clear_error();
    mt_manual_seed(c->seed); /* dropout draws the same masks on both devices */
    mt_scope_begin();
    trainer tr;
    bool ok = trainer_make(&tr, c, pb, dev, lr_factor);
    for (int t = 0; ok && t < STEPS; t++) {
        mt_scope_begin();
        ok = train_step(c, pb, &tr, t, r);
        mt_scope_end();
    }
    if (ok) record_state(c, pb, &tr, r);
    if (mt_last_status() != MT_OK)
        snprintf(r->error, sizeof r->error, "%s", mt_last_error());
    else if (!ok)
        snprintf(r->error, sizeof r->error, "a call failed without an error");
    mt_clear_error();
    trainer_free(&tr);
    mt_scope_end();
}

/* ------------------------------------------------------------------ comparison */

/* Non-finite values must be the same class (NaN, +inf, -inf) on both devices. */
static bool same_class(double a, double b) {
    return (isnan(a) && isnan(b)) ||
           (!isnan(a) && !isnan(b) && isinf(a) == isinf(b) && (!isinf(a) || (a > 0) == (b > 0)));
}

static void compare_scalar(mt_test_failures *d, const char *what, int t, double a, double b,
                           double rtol) {
    bool ok = same_class(a, b) && (!isfinite(a) || fabs(a - b) <= rtol * fmax(fabs(a), 1e-3));
    if (!ok) mt_test_note(d, "step %d: %s %.9g on the CPU, %.9g on the device", t, what, a, b);
}

/* One ulp of a value stored in dt (F16/BF16), 0 for wider dtypes: two runs whose FP32
   masters differ in the last bits may round to neighbouring low-precision values. */
static double storage_ulp(double v, mt_dtype dt) {
    int mant = dt == MT_F16 ? 10 : dt == MT_BF16 ? 7 : 0;
    if (!mant || v == 0) return 0;
    return ldexp(1.0, ilogb(v) - mant);
}

/* The size of an array's finite values (or of their changes from init): the largest |value|,
   or with l2 the root of the sum of squares. */
static double size_of(const double *a, const double *init, int64_t n, bool l2) {
    double m = 0;
    for (int64_t k = 0; a && k < n; k++) {
        double v = a[k] - (init ? init[k] : 0);
        if (isfinite(v)) m = l2 ? m + v * v : fmax(m, fabs(v));
    }
    return l2 ? sqrt(m) : m;
}

/* Arrays of n values (for parameters and masters: their changes from `init`, so that a
   parameter is judged by what the steps did to it). Non-finite values must be of the same
   kind. A difference of one ulp of a stored F16/BF16 value is allowed; beyond it, either
   each difference within tol times the CPU's largest |value| (FP32), or (l2, low precision)
   the L2 norm of the differences within tol times the CPU's L2 norm: one flipped max-pool
   winner or ReLU moves one element of a gradient by up to a fifth of the largest (two
   values one ulp apart on the CPU tie on the device), which the norm over the tensor
   absorbs, while a wrong kernel, which moves every element, still fails. The CPU's size is
   raised to `floor`, so that rounding noise in a tensor far smaller than the others does not
   count; all-zero changes on the CPU (floor 0) must be all-zero on the device. */
static void compare_array(mt_test_failures *d, const char *what, const double *a, const double *b,
                          const double *init, int64_t n, mt_dtype dt, double tol, double floor,
                          bool l2) {
    if (!a || !b) {
        if (a != b) mt_test_note(d, "%s: present on one device only", what);
        return;
    }
    double scale = fmax(size_of(a, init, n, l2), floor), sq = 0, worst = -1;
    int64_t at = 0;
    for (int64_t k = 0; k < n; k++) {
        double base = init ? init[k] : 0;
        double excess = fabs((a[k] - base) - (b[k] - base)) - storage_ulp(a[k], dt);
        if (!same_class(a[k], b[k])) {
            excess = INFINITY;
        } else if (!isfinite(a[k]) || excess <= 0) {
            continue;
        }
        sq += excess * excess;
        if (excess > worst) {
            worst = excess;
            at = k;
        }
    }
    double err = l2 ? sqrt(sq) : worst;
    if (worst >= 0 && !(err <= tol * scale))
        mt_test_note(d,
                     "%s: %s %.3g against %.3g on the CPU (%s %s); worst at [%lld]: %.9g on the "
                     "CPU, %.9g on the device",
                     what, l2 ? "L2 norm of the differences" : "difference", err, scale,
                     l2 ? "L2 norm of its" : "largest", init ? "change" : "value", (long long)at,
                     a[at], b[at]);
}

/* A hundredth of the largest size (or size of the change) over a run's tensors of one kind. */
static double floor_of(double *const *arrays, const problem *pb, bool changes, bool l2) {
    double m = 0;
    for (int i = 0; i < pb->n; i++)
        m = fmax(m, size_of(arrays[i], changes ? pb->init[i] : NULL,
                            mt_test_numel(pb->ndim[i], pb->shape[i]), l2));
    return 0.01 * m;
}

static void compare_runs(mt_test_failures *d, const config *c, const problem *pb,
                         const run_result *a, const run_result *b) {
    if (a->error[0] || b->error[0]) {
        mt_test_note(d, "a run failed: CPU \"%s\", device \"%s\"", a->error, b->error);
        return;
    }
    double tol = c->low == MT_F32 ? 1e-3 : 0.3, ltol = c->low == MT_F32 ? 1e-4 : 0.05;
    for (int t = 0; t < STEPS; t++) {
        if (a->skipped[t] != b->skipped[t] || a->scale[t] != b->scale[t])
            mt_test_note(d,
                         "step %d: skipped %d, scale %g on the CPU; skipped %d, scale %g on the "
                         "device",
                         t, a->skipped[t], a->scale[t], b->skipped[t], b->scale[t]);
        compare_scalar(d, "loss", t, a->loss[t], b->loss[t], ltol);
        compare_scalar(d, "clip norm", t, a->norm[t], b->norm[t], ltol);
    }
    bool l2 = c->low != MT_F32;
    double pf = floor_of(a->param, pb, true, l2), mf = floor_of(a->master, pb, true, l2),
           gf = floor_of(a->grad, pb, false, l2);
    char what[64];
    for (int i = 0; i < pb->n; i++) {
        int64_t n = mt_test_numel(pb->ndim[i], pb->shape[i]);
        snprintf(what, sizeof what, "parameter %d", i);
        compare_array(d, what, a->param[i], b->param[i], pb->init[i], n, a->param_dtype[i], tol, pf,
                      l2);
        snprintf(what, sizeof what, "master %d", i);
        compare_array(d, what, a->master[i], b->master[i], pb->init[i], n, MT_F32, tol, mf, l2);
        snprintf(what, sizeof what, "last gradient %d", i);
        compare_array(d, what, a->grad[i], b->grad[i], NULL, n, a->param_dtype[i], tol, gf, l2);
    }
    for (int i = 0; i < pb->n_buffers; i++) {
        snprintf(what, sizeof what, "running %s %d", i % 2 ? "var" : "mean", i / 2);
        compare_array(d, what, a->buffer[i], b->buffer[i], NULL, pb->buffer_len, MT_F32, tol, 0,
                      l2);
    }
    compare_array(d, "eval-mode logits", a->eval, b->eval, NULL, BATCH * CLASSES, MT_F32, tol, 0,
                  l2);
}

/* Runs c on the CPU and on dev and compares; returns the number of differences (the first in
   d->first). */
static int check_config(const config *c, mt_device dev, mt_test_failures *d) {
    problem pb;
    problem_make(&pb, c);
    run_result a, b;
    run(c, &pb, MT_CPU, 1.0, &a);
    run(c, &pb, dev, 1.0, &b);
    compare_runs(d, c, &pb, &a, &b);
    run_result_free(&a);
    run_result_free(&b);
    problem_free(&pb);
    return d->count;
}

/* ------------------------------------------------------------------ tests */

/* The configuration of the running case (cmocka's state holds the leak counters). */
static const config *current_config;

static int config_setup(void **state) {
    current_config = *state;
    return mt_test_setup(state);
}

static void test_config(void **state) {
    (void)state;
    const config *c = current_config;
    mt_test_failures d = {0};
    char desc[400];
    if (check_config(c, MT_CUDA(0), &d))
        fail_msg("%s: %d difference(s); first: %s", config_describe(c, desc, sizeof desc), d.count,
                 d.first);
}

/* Runs c twice on the CPU, the second time with learning rate times lr_factor and then
   `edit` applied to its result, and returns the comparison's first difference ("" if none). */
static const char *check_edited(const config *c, double lr_factor,
                                void (*edit)(run_result *r, const problem *pb),
                                mt_test_failures *d) {
    problem pb;
    problem_make(&pb, c);
    run_result a, b;
    run(c, &pb, MT_CPU, 1.0, &a);
    run(c, &pb, MT_CPU, lr_factor, &b);
    if (edit) edit(&b, &pb);
    *d = (mt_test_failures){.quiet = true};
    compare_runs(d, c, &pb, &a, &b);
    run_result_free(&a);
    run_result_free(&b);
    problem_free(&pb);
    return d->first;
}

/* Moves one element of parameter 0 by 0.2% of the parameter's largest change. */
static void nudge_parameter(run_result *r, const problem *pb) {
    double m = size_of(r->param[0], pb->init[0], mt_test_numel(pb->ndim[0], pb->shape[0]), false);
    r->param[0][3] += 2e-3 * m;
}

static void flip_skip(run_result *r, const problem *pb) {
    (void)pb;
    r->skipped[2] = !r->skipped[2];
}

static void nudge_running_var(run_result *r, const problem *pb) {
    (void)pb;
    r->buffer[1][2] *= 1.01;
}

/* The comparison itself, CPU against CPU (runs without a device): identical runs agree; a
   parameter moved by 0.2% of its change (F32), a flipped skip decision, a running variance
   1% off, a learning rate 2% off (F32) or doubled (low precision) are reported. */
static void test_harness_detects_differences(void **state) {
    (void)state;
    config f32 = config_draw(1);
    f32.arch = ARCH_CNN;
    f32.low = MT_F32;
    f32.level = MT_AMP_O1;
    f32.opt = OPT_ADAM;
    f32.eps = 1e-3;
    f32.scaler = true;
    f32.bad_step = 1;
    mt_test_failures d;
    assert_string_equal(check_edited(&f32, 1.0, NULL, &d), "");
    assert_non_null(strstr(check_edited(&f32, 1.0, nudge_parameter, &d), "parameter 0: "));
    assert_non_null(strstr(d.first, "worst at [3]"));
    assert_non_null(strstr(check_edited(&f32, 1.0, flip_skip, &d), "step 2: skipped"));
    config finite = f32; /* the inf of step 1 leaves NaN running statistics */
    finite.bad_step = -1;
    assert_non_null(strstr(check_edited(&finite, 1.0, nudge_running_var, &d), "running var 0: "));
    assert_non_null(strstr(d.first, "worst at [2]"));
    assert_string_not_equal(check_edited(&f32, 1.02, NULL, &d), "");
    config low = config_draw(2);
    low.low = MT_BF16;
    low.level = MT_AMP_O2;
    low.opt = OPT_SGD;
    low.scaler = true;
    assert_string_equal(check_edited(&low, 1.0, NULL, &d), "");
    assert_string_not_equal(check_edited(&low, 2.0, NULL, &d), "");
    assert_no_error();
}

int main(void) {
    mt_cuda_set_allow_tf32(false); /* F32 GEMMs must match the CPU's (the default anyway) */
    uint64_t first, last;
    mt_test_seed_range(24, &first, &last);
    size_t n = (size_t)(last - first + 1);
    bool device = mt_cuda_device_count() > 0;
    struct CMUnitTest *tests = calloc(n + 1, sizeof *tests);
    config *configs = calloc(n, sizeof *configs);
    char(*names)[400] = calloc(n, sizeof *names);
    if (!tests || !configs || !names) return 1;
    for (size_t i = 0; i < n; i++) {
        configs[i] = config_draw(first + i);
        config_describe(&configs[i], names[i], sizeof names[i]);
        if (device) {
            tests[i] = (struct CMUnitTest){.name = names[i],
                                           .test_func = test_config,
                                           .setup_func = config_setup,
                                           .teardown_func = mt_test_teardown,
                                           .initial_state = &configs[i]};
        } else {
            strncat(names[i], " # SKIP no CUDA device in this build or machine",
                    sizeof names[i] - strlen(names[i]) - 1);
            tests[i] = (struct CMUnitTest){.name = names[i], .test_func = mt_test_not_run};
        }
    }
    tests[n] = (struct CMUnitTest)MT_TEST(test_harness_detects_differences);
    mt_test_announce_device();
    mt_test_apply_filter();
    cmocka_set_message_output(CM_OUTPUT_TAP);
    int rc = _cmocka_run_group_tests("test_train_parity", tests, n + 1, NULL, NULL);
    free(tests);
    free(configs);
    free(names);
    return rc;
}

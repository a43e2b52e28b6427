/* ResNet AMP sample: ResNet-18 (basic blocks) or ResNet-50 (bottleneck blocks, stride on the
 * 3x3 convolution as torchvision's) trained on synthetic ImageNet-shaped data (one fixed batch
 * of random images with random labels, as the guides' synthetic-data benchmarks) once per
 * mode, from the same initial weights, and timed in images per second:
 *
 *   fp32     plain FP32 training
 *   o1-fp16  autocast O1 to FP16 (convolutions and GEMMs in FP16, batch norm's statistics and
 *            the loss in FP32) + GradScaler
 *   o2-fp16  parameters cast to FP16 once (mt_amp_decorate; batch norm's stay FP32), autocast
 *            O2, GradScaler, SGD with momentum on FP32 master weights (multi_precision)
 *   o1-bf16  autocast O1 to BF16; no loss scaling (BF16 has FP32's exponent range)
 *
 * Activations are channels-last (NHWC strides under the NCHW shape; conv and batch norm keep
 * the format), and every block ends in the fused relu(bn(conv(x)) + shortcut)
 * (mt_batch_norm_act with a residual), the stem and inner convolutions in the fused bn+relu.
 * The loss is cross entropy, the optimizer SGD with momentum 0.9 and weight decay 1e-4.
 *
 * On a CPU, FP16 is a storage format computed in FP32 (oneDNN converts), so the FP16 modes
 * run but are not faster there; BF16 convolutions run natively where the CPU has
 * AVX512-BF16/AMX. The CPU defaults are scaled down (image 64, batch 8, 6 steps) so that all
 * four modes take seconds; a GPU gets the guide's batch and image size.
 *
 * On the CPU each step is timed (its median resists other processes on a shared machine); on
 * a GPU the clock is read only after mt_synchronize, around the timed steps as a whole. The
 * CPU time of each step (all threads; not the time other processes hold the cores) is kept too.
 * --json prints one object per mode and line with "mode", "images_per_s" (the mean over the
 * timed steps), "images_per_s_median", "ms_median", "cpu_ms_median", "loss_first", "loss".
 *
 * With --ddp the sample is one rank of a data-parallel job (mpirun -np N resnet_amp --ddp):
 * each rank trains on its own synthetic batch, gradients are averaged through mt_ddp (buckets
 * of --bucket-mb, started during backward), the GradScaler's skip decision is shared, and
 * --json lines also carry "rank", "world_size", "allreduce_calls_per_step" and
 * "param_checksum" (the sum of every parameter after training: equal on every rank; batch
 * norm's running statistics are per rank, as torch's DDP with broadcast_buffers off). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MT_SAMPLE_NAME "resnet_amp"
#include "sample_util.h"
#include "sample_opts.h"

typedef struct {
    bool resnet50;
    int64_t batch, image, classes;
    int steps, warmup, threads;
    double lr;
    uint64_t seed;
    mt_device dev;
    bool json, run[N_MODES];
    bool ddp;
    mt_ddp_opts ddp_opts;
} config;

/* ---- the model */

typedef struct {
    mt_conv2d_layer conv;
    mt_batch_norm2d_layer bn;
} conv_bn;

typedef struct {
    conv_bn a, b, c; /* c: bottleneck only */
    conv_bn down;    /* the projection shortcut, when has_down */
    bool bottleneck, has_down;
} block;

enum { MAX_BLOCKS = 16, MAX_PARAMS = 3 * (1 + 4 * MAX_BLOCKS) + 2 };

typedef struct {
    conv_bn stem;
    block blocks[MAX_BLOCKS];
    int n_blocks;
    mt_linear_layer fc;
    mt_tensor *params[MAX_PARAMS];
    int n_params;
    int64_t features; /* channels into the classifier */
} resnet;

static void conv_bn_init(resnet *r, conv_bn *cb, int64_t in, int64_t out, int64_t k, int64_t stride,
                         mt_device dev) {
    mt_conv2d_opts o = {.stride = {stride, stride}, .padding = {k / 2, k / 2}};
    /* no conv bias: batch norm's shift follows, as in torchvision */
    mt_conv2d_layer_init(&cb->conv, in, out, k, k, &o, false, MT_F32, dev);
    mt_batch_norm2d_layer_init(&cb->bn, out, MT_F32, dev);
    r->params[r->n_params++] = cb->conv.weight;
    r->params[r->n_params++] = cb->bn.weight;
    r->params[r->n_params++] = cb->bn.bias;
}

static void conv_bn_free(conv_bn *cb) {
    mt_conv2d_layer_free(&cb->conv);
    mt_batch_norm2d_layer_free(&cb->bn);
}

/* act(bn(conv(x)) + residual), batch norm, residual and activation in one fused op. */
static mt_tensor *conv_bn_forward(conv_bn *cb, mt_tensor *x, mt_tensor *residual,
                                  mt_activation act) {
    mt_batch_norm2d_layer *bn = &cb->bn;
    return mt_batch_norm_act(mt_conv2d_layer_forward(&cb->conv, x), bn->running_mean,
                             bn->running_var, bn->weight, bn->bias, residual, bn->training,
                             bn->momentum, bn->eps, act);
}

/* torchvision's resnet18 ([2, 2, 2, 2] basic blocks) or resnet50 ([3, 4, 6, 3] bottlenecks,
   expansion 4); initialised like torch.nn's layers (the same draws in every mode). */
static void resnet_init(resnet *r, const config *c) {
    memset(r, 0, sizeof *r);
    mt_manual_seed(c->seed + 1);
    static const int depth18[4] = {2, 2, 2, 2}, depth50[4] = {3, 4, 6, 3};
    const int *depth = c->resnet50 ? depth50 : depth18;
    int64_t expansion = c->resnet50 ? 4 : 1, in = 64;
    conv_bn_init(r, &r->stem, 3, 64, 7, 2, c->dev);
    for (int stage = 0; stage < 4; stage++) {
        int64_t width = 64 << stage, out = width * expansion;
        for (int i = 0; i < depth[stage]; i++) {
            block *b = &r->blocks[r->n_blocks++];
            int64_t stride = stage > 0 && i == 0 ? 2 : 1;
            b->bottleneck = c->resnet50;
            if (b->bottleneck) {
                conv_bn_init(r, &b->a, in, width, 1, 1, c->dev);
                conv_bn_init(r, &b->b, width, width, 3, stride, c->dev);
                conv_bn_init(r, &b->c, width, out, 1, 1, c->dev);
            } else {
                conv_bn_init(r, &b->a, in, width, 3, stride, c->dev);
                conv_bn_init(r, &b->b, width, out, 3, 1, c->dev);
            }
            b->has_down = stride != 1 || in != out;
            if (b->has_down) conv_bn_init(r, &b->down, in, out, 1, stride, c->dev);
            in = out;
        }
    }
    r->features = in;
    mt_linear_layer_init(&r->fc, in, c->classes, true, MT_F32, c->dev);
    r->params[r->n_params++] = r->fc.weight;
    r->params[r->n_params++] = r->fc.bias;
    check("making the model");
}

static void resnet_free(resnet *r) {
    conv_bn_free(&r->stem);
    for (int i = 0; i < r->n_blocks; i++) {
        block *b = &r->blocks[i];
        conv_bn_free(&b->a);
        conv_bn_free(&b->b);
        if (b->bottleneck) conv_bn_free(&b->c);
        if (b->has_down) conv_bn_free(&b->down);
    }
    mt_linear_layer_free(&r->fc);
}

static mt_tensor *block_forward(block *b, mt_tensor *x) {
    mt_tensor *shortcut = b->has_down ? conv_bn_forward(&b->down, x, NULL, MT_ACT_NONE) : x;
    mt_tensor *h = conv_bn_forward(&b->a, x, NULL, MT_ACT_RELU);
    if (b->bottleneck) {
        h = conv_bn_forward(&b->b, h, NULL, MT_ACT_RELU);
        return conv_bn_forward(&b->c, h, shortcut, MT_ACT_RELU);
    }
    return conv_bn_forward(&b->b, h, shortcut, MT_ACT_RELU);
}

/* x [N, 3, H, W] channels-last -> logits [N, classes]. */
static mt_tensor *resnet_forward(resnet *r, mt_tensor *x) {
    mt_tensor *h = conv_bn_forward(&r->stem, x, NULL, MT_ACT_RELU);
    h = mt_max_pool2d(h, &(mt_pool2d_opts){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
    for (int i = 0; i < r->n_blocks; i++) h = block_forward(&r->blocks[i], h);
    h = mt_adaptive_avg_pool2d(h, 1, 1);
    h = mt_reshape(h, MT_SHAPE(-1, r->features)); /* [N, C, 1, 1] -> [N, C] */
    return mt_linear_layer_forward(&r->fc, h);
}

/* ---- options */

static void usage(FILE *f) {
    fprintf(f, "usage: resnet_amp [options]\n"
               "  --arch A         resnet18 or resnet50 (default resnet18)\n"
               "  --modes LIST     comma list of fp32,o1-fp16,o2-fp16,o1-bf16 (default: all)\n"
               "  --device DEV     cpu or cuda[:N] (default: cuda when available, else cpu)\n"
               "  --batch N        images per step (GPU default 256, CPU 8)\n"
               "  --image-size N   height = width (GPU default 224, CPU 64)\n"
               "  --steps N        training steps per mode (GPU default 50, CPU 6)\n"
               "  --warmup N       untimed steps at the start (GPU default 5, CPU 1)\n"
               "  --classes N      classifier outputs (default 1000)\n"
               "  --lr X           SGD learning rate (default 0.01; momentum 0.9, wd 1e-4)\n"
               "  --threads N      CPU threads for kernels and BLAS (default: all cores)\n"
               "  --seed N         seed for data and weights (default 2023)\n"
               "  --json           one JSON object per mode and line on stdout, nothing "
               "else\n" SAMPLE_DDP_USAGE);
}

/* Sizes given on the command line; 0 (-1 for warmup): the device's default. */
typedef struct {
    int64_t batch, image, steps, warmup;
    bool dev_given;
} given;

static void parse_lr(const char *s, void *dst) {
    char *end;
    double lr = strtod(s, &end);
    if (end == s || *end || !(lr >= 0 && lr < 100)) {
        fprintf(stderr, "resnet_amp: --lr: expected a number in [0, 100), got \"%s\"\n", s);
        exit(2);
    }
    *(double *)dst = lr;
}

static void parse_arch(const char *arg, void *resnet50) {
    if (strcmp(arg, "resnet18") != 0 && strcmp(arg, "resnet50") != 0) {
        fprintf(stderr, "resnet_amp: --arch: expected resnet18 or resnet50, got \"%s\"\n", arg);
        exit(2);
    }
    *(bool *)resnet50 = strcmp(arg, "resnet50") == 0;
}

static void parse_args(int argc, char **argv, config *c) {
    given g = {.warmup = -1};
    const sample_opt opts[] = {
        SAMPLE_OPT_CALL("arch", &c->resnet50, parse_arch),
        SAMPLE_OPT("modes", SO_MODES, c->run),
        {.name = "device", .kind = SO_DEVICE, .dst = &c->dev, .seen = &g.dev_given},
        SAMPLE_OPT_RANGE("batch", SO_I64, &g.batch, 2, 1 << 16),       /* batch norm needs 2 */
        SAMPLE_OPT_RANGE("image-size", SO_I64, &g.image, 32, 1 << 12), /* 32 halves 5 times */
        SAMPLE_OPT_RANGE("steps", SO_I64, &g.steps, 1, 1 << 20),
        SAMPLE_OPT_RANGE("warmup", SO_I64, &g.warmup, 0, 1 << 20),
        SAMPLE_OPT_RANGE("classes", SO_I64, &c->classes, 2, 1 << 20),
        SAMPLE_OPT_CALL("lr", &c->lr, parse_lr),
        SAMPLE_OPT_THREADS(&c->threads),
        SAMPLE_OPT_SEED(&c->seed),
        SAMPLE_OPT("json", SO_FLAG, &c->json),
        SAMPLE_OPT_HELP,
        SAMPLE_OPTS_DDP(&c->ddp, &c->ddp_opts),
    };
    *c = (config){.classes = 1000, .lr = 0.01, .seed = 2023, .dev = MT_CPU};
    for (int k = 0; k < N_MODES; k++) c->run[k] = true;
    sample_opts_parse(argc, argv, opts, (int)(sizeof opts / sizeof *opts), usage, false);
    c->dev = resolve_device(g.dev_given, c->dev);
    /* The guide's sizes on a GPU; on a CPU a scaled-down run of seconds. */
    bool gpu = c->dev.type == MT_DEVICE_CUDA;
    c->batch = g.batch ? g.batch : (gpu ? 256 : 8);
    c->image = g.image ? g.image : (gpu ? 224 : 64);
    c->steps = g.steps ? (int)g.steps : (gpu ? 50 : 6);
    long warmup = g.warmup >= 0 ? g.warmup : (gpu ? 5 : 1);
    /* at least one step is timed: a one-step run times its only step */
    c->warmup = warmup < c->steps ? (int)warmup : c->steps - 1;
    if (!gpu && !(g.batch || g.image || g.steps) && !c->json)
        printf("cpu: scaled-down defaults (image 64, batch 8, 6 steps); the guide's sizes are "
               "--image-size 224 --batch 256 --steps 50\n");
}

/* ---- training */

typedef struct {
    double ms_mean, ms_median, images_per_s, images_per_s_median;
    double cpu_ms_median;         /* CPU time of the median step (CPU only), all threads */
    double loss_first, loss_last; /* the first and the last step's loss */
    int64_t skipped, peak_bytes;
    int timed_steps;
    mt_ddp_stats ddp; /* --ddp: the last step's all-reduce calls, buckets */
    ddp_trace trace;  /* --ddp on the CPU: backward against the all-reduces, per timed step */
    double checksum;  /* the sum of every parameter after training */
} result;

/* One step: forward under autocast, (scaled) backward, optimizer step; the loss belongs to the
   caller's scope. */
static mt_tensor *train_step(const mode_spec *m, resnet *r, mt_optimizer *opt,
                             mt_grad_scaler *scaler, mt_ddp *ddp, ddp_trace *tr, mt_tensor *x,
                             mt_tensor *y) {
    if (m->low != MT_F32) mt_autocast_begin(m->low, m->level);
    mt_tensor *loss = mt_cross_entropy(resnet_forward(r, x), y);
    if (m->low != MT_F32) mt_autocast_end();
    sample_backward_step(loss, opt, scaler, ddp, tr);
    return loss;
}

static void train(const config *c, const mode_spec *m, mt_tensor *x, mt_tensor *y, result *res) {
    int64_t tensors_before = mt_live_tensors();
    mt_memory_peak_reset(c->dev);
    resnet *r = malloc(sizeof *r);
    if (!r) {
        fprintf(stderr, "resnet_amp: out of memory\n");
        exit(1);
    }
    resnet_init(r, c);
    /* channels-last weights under channels-last activations, as torch's
       model.to(memory_format=torch.channels_last): no layout copies in the convolutions */
    mt_params_to_channels_last(r->params, r->n_params);
    check("mt_params_to_channels_last");
    if (m->master_weights) {
        mt_amp_decorate(r->params, r->n_params, m->low, NULL); /* batch norm's stay FP32 */
        check("mt_amp_decorate");
    }
    mt_optimizer *opt = mt_momentum_new(r->params, r->n_params,
                                        &(mt_momentum_opts){.lr = MT_SET(c->lr),
                                                            .momentum = MT_SET(0.9),
                                                            .weight_decay = 1e-4,
                                                            .multi_precision = m->master_weights});
    mt_grad_scaler *scaler = NULL;
    if (m->scaler) scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
    check("making the optimizer");
    mt_ddp *ddp =
        c->ddp ? sample_ddp_new(r->params, r->n_params, &c->ddp_opts, scaler, &res->trace, c->steps)
               : NULL;

    double *step_ms = calloc(2 * (size_t)c->steps, sizeof *step_ms); /* wall, then CPU */
    mt_tensor *first = NULL, *last = NULL;
    mt_synchronize(c->dev);
    check("mt_synchronize");
    double t0 = now_s();
    for (int s = 0; s < c->steps; s++) {
        if (s == c->warmup && s > 0) {
            mt_synchronize(c->dev); /* the warm-up steps (oneDNN primitives, caches) are done */
            check("mt_synchronize");
            t0 = now_s();
        }
        double ts = now_s(), tc = cpu_s();
        mt_scope_begin();
        /* a GPU's backward returns before the device has run it: no trace there */
        bool traced = s >= c->warmup && c->dev.type == MT_DEVICE_CPU;
        mt_tensor *loss = train_step(m, r, opt, scaler, ddp, traced ? &res->trace : NULL, x, y);
        /* read after the clock stops: mt_item would wait for the device */
        if (s == 0) first = mt_retain(loss);
        if (s == c->steps - 1) last = mt_retain(loss);
        mt_scope_end();
        if (step_ms) {
            step_ms[s] = 1e3 * (now_s() - ts);
            step_ms[c->steps + s] = 1e3 * (cpu_s() - tc);
        }
        check(m->name);
    }
    mt_synchronize(c->dev);
    check("mt_synchronize");
    double t1 = now_s();
    res->timed_steps = c->steps - c->warmup;
    res->ms_mean = 1e3 * (t1 - t0) / res->timed_steps;
    res->images_per_s = (double)c->batch * 1e3 / res->ms_mean;
    /* a GPU step returns before the device has run it: only the mean means something there */
    res->ms_median = res->cpu_ms_median = NAN;
    if (step_ms && c->dev.type == MT_DEVICE_CPU) {
        res->ms_median = median(step_ms + c->warmup, res->timed_steps);
        res->cpu_ms_median = median(step_ms + c->steps + c->warmup, res->timed_steps);
    }
    res->images_per_s_median = (double)c->batch * 1e3 / res->ms_median;
    free(step_ms);
    res->loss_first = mt_item(first);
    res->loss_last = mt_item(last);
    mt_release(first);
    mt_release(last);
    res->skipped = scaler ? mt_grad_scaler_skipped_steps(scaler) : 0;
    mt_memory_stats ms = {0};
    mt_memory_stats_get(c->dev, &ms);
    res->peak_bytes = ms.peak_bytes;
    if (ddp) mt_ddp_stats_get(ddp, &res->ddp);
    res->checksum = param_checksum(r->params, r->n_params);
    check("reading the results");

    mt_ddp_free(ddp);
    mt_grad_scaler_free(scaler);
    mt_optimizer_free(opt);
    resnet_free(r);
    free(r);
    warn_live_tensors(m->name, tensors_before);
}

static void print_json(const config *c, const mode_spec *m, result *r) {
    printf("{\"mode\": \"%s\", \"arch\": \"%s\", \"device\": \"%s\", \"batch\": %lld, "
           "\"image_size\": %lld, \"classes\": %lld, \"steps\": %d, \"warmup\": %d, "
           "\"timed_steps\": %d, \"threads\": %d, \"images_per_s\": ",
           m->name, c->resnet50 ? "resnet50" : "resnet18",
           c->dev.type == MT_DEVICE_CUDA ? "cuda" : "cpu", (long long)c->batch, (long long)c->image,
           (long long)c->classes, c->steps, c->warmup, r->timed_steps, mt_get_num_threads());
    print_json_number(r->images_per_s);
    print_json_field("images_per_s_median", r->images_per_s_median);
    print_json_field("ms_per_step", r->ms_mean);
    print_json_field("ms_median", r->ms_median);
    print_json_field("cpu_ms_median", r->cpu_ms_median);
    print_json_field("loss_first", r->loss_first);
    print_json_field("loss", r->loss_last);
    printf(", \"skipped\": %lld, \"peak_bytes\": %lld", (long long)r->skipped,
           (long long)r->peak_bytes);
    if (c->ddp) print_ddp_json(&r->ddp, &c->ddp_opts, &r->trace);
    print_json_checksum_end(r->checksum);
}

int main(int argc, char **argv) {
    config c;
    parse_args(argc, argv, &c);
    sample_init(c.threads, c.ddp);
    /* --ddp: only rank 0 prints the table (with --json every rank prints its lines) */
    bool quiet = !c.json && mt_dist_rank() > 0;

    /* One synthetic batch, made on the CPU (the same numbers on every device), channels-last
       on the device: random images and random labels, as the guides' synthetic benchmarks;
       each rank its own batch. */
    mt_manual_seed(c.seed + (uint64_t)(c.ddp ? mt_dist_rank() : 0));
    mt_scope_begin();
    mt_tensor *x = mt_randn(MT_SHAPE(c.batch, 3, c.image, c.image), MT_F32, MT_CPU);
    mt_tensor *labels =
        mt_mul_scalar(mt_rand(MT_SHAPE(c.batch), MT_F32, MT_CPU), (double)c.classes);
    x = mt_retain(mt_to_channels_last(mt_to(x, c.dev)));
    mt_tensor *y = mt_retain(mt_to(mt_cast(labels, MT_I64), c.dev)); /* truncates: 0..classes-1 */
    mt_scope_end();
    check("making the data");

    if (!c.json && !quiet) {
        if (c.ddp) print_ddp_header(c.batch, &c.ddp_opts);
        printf("%s, channels-last, fused BN+add+ReLU; synthetic %lldx3x%lldx%lld images, %lld "
               "classes; batch %lld, %d steps (%d untimed) per mode on %s (%d threads)\n",
               c.resnet50 ? "ResNet-50" : "ResNet-18", (long long)c.batch, (long long)c.image,
               (long long)c.image, (long long)c.classes, (long long)c.batch, c.steps, c.warmup,
               c.dev.type == MT_DEVICE_CUDA ? "cuda" : "cpu", mt_get_num_threads());
        printf("%-28s %10s %12s %12s %10s %10s %8s\n", "mode", "images/s", "ms/step", "median ms",
               "first loss", "last loss", "skipped");
        fflush(stdout);
    }
    for (int k = 0; k < N_MODES; k++) {
        if (!c.run[k]) continue;
        result r = {0};
        train(&c, &MODES[k], x, y, &r);
        if (c.json) {
            print_json(&c, &MODES[k], &r);
            ddp_trace_free(&r.trace);
            continue;
        }
        if (!quiet)
            printf("%-28s %10.1f %12.2f %12.2f %10.4f %10.4f %8lld\n", MODES[k].label,
                   r.images_per_s, r.ms_mean, r.ms_median, r.loss_first, r.loss_last,
                   (long long)r.skipped);
        if (!quiet && c.ddp && r.trace.n) {
            printf("  %d buckets, progress %s; median step, ms from the start of backward: ",
                   r.ddp.buckets, progress_name(c.ddp_opts.progress));
            print_ddp_trace_text(&r.trace);
        }
        ddp_trace_free(&r.trace);
        fflush(stdout);
    }
    if (!c.json && !quiet && c.dev.type == MT_DEVICE_CPU)
        printf("On a CPU, FP16 is a storage format computed in FP32 (no faster math); BF16 runs "
               "natively through oneDNN where the CPU has AVX512-BF16/AMX.\n");
    mt_release(x);
    mt_release(y);
    check("cleaning up");
    if (c.ddp && mt_dist_finalize() < 0) check("mt_dist_finalize");
    return 0;
}

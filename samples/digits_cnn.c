/* digits_cnn: a small convolutional network trained on a real data set, scikit-learn's 8x8
 * handwritten digits (1797 images, 10 classes), written out at build time by
 * tools/dump_digits.py (see samples/meson.build).
 *
 *   conv3x3(1 -> 16) + BN + ReLU, conv3x3(16 -> 32) + BN + ReLU,
 *   max pool 2x2 -> [N, 32, 4, 4], flatten, dropout, Linear(512, 10)
 *
 * (each BN + ReLU is one fused mt_batch_norm_act; the convolutions have no bias, BN's shift
 * takes its place).
 *
 * The split is fixed (360 test images drawn by a permutation under seed 0, whatever --seed
 * says); --seed picks the initial weights, the batch order and the dropout masks. Every epoch
 * shuffles the training images (mt_randperm, then mt_index_select of each batch), trains
 * with Adam, then evaluates on the test images with batch norm on its running statistics and
 * dropout off (the layers' `training` flags) and without autograd; accuracy counts
 * mt_argmax(logits) == label. --amp o1|o2 trains under autocast (BF16 on the CPU; FP16 with a
 * GradScaler on CUDA; o2 casts the weights once, keeps batch norm's parameters FP32 and gives
 * Adam FP32 master weights). --json prints one object per epoch and a last one holding
 * "test_accuracy". Run with --help for the options. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MT_SAMPLE_NAME "digits_cnn"
#include "sample_util.h"
#include "sample_opts.h"

#ifndef MT_DIGITS_DATA
#define MT_DIGITS_DATA "digits.txt"
#endif

enum { PIXELS = 64, SIDE = 8, CLASSES = 10, TEST_IMAGES = 360, SPLIT_SEED = 0 };

typedef enum { AMP_OFF, AMP_O1, AMP_O2 } amp_mode;

typedef struct {
    const char *data;
    int epochs, threads;
    int64_t batch;
    double lr, dropout;
    uint64_t seed;
    mt_device dev;
    amp_mode amp;
    bool json;
} config;

typedef struct {
    mt_conv2d_layer conv1, conv2;
    mt_batch_norm2d_layer bn1, bn2;
    mt_dropout_layer drop;
    mt_linear_layer fc;
} model;

enum { N_PARAMS = 8 }; /* the convolutions have no bias: batch norm's shift takes its place */

static void usage(FILE *f) {
    fprintf(f,
            "usage: digits_cnn [options]\n"
            "  --data PATH     digits file of tools/dump_digits.py (default %s)\n"
            "  --epochs N      passes over the training images (default 12)\n"
            "  --batch N       batch size (default 32)\n"
            "  --lr X          Adam learning rate (default 0.003)\n"
            "  --dropout P     dropout before the classifier (default 0.25)\n"
            "  --seed N        weights, batch order and dropout (default 1); the split is fixed\n"
            "  --device DEV    cpu or cuda[:N] (default cpu)\n"
            "  --amp MODE      off, o1 or o2 (default off); BF16 on the CPU, FP16 on CUDA\n"
            "  --threads N     CPU threads (default: all cores)\n"
            "  --json          one JSON object per epoch, then one with \"test_accuracy\"\n",
            MT_DIGITS_DATA);
}

static void parse_amp(const char *s, void *dst) {
    amp_mode *amp = dst;
    if (strcmp(s, "off") == 0)
        *amp = AMP_OFF;
    else if (strcmp(s, "o1") == 0)
        *amp = AMP_O1;
    else if (strcmp(s, "o2") == 0)
        *amp = AMP_O2;
    else {
        fprintf(stderr, "digits_cnn: --amp: expected off, o1 or o2, got \"%s\"\n", s);
        exit(2);
    }
}

static void parse_args(int argc, char **argv, config *c) {
    const sample_opt opts[] = {
        SAMPLE_OPT("data", SO_STRING, &c->data),
        SAMPLE_OPT_RANGE("epochs", SO_INT, &c->epochs, 1, 10000),
        SAMPLE_OPT_RANGE("batch", SO_I64, &c->batch, 2, 1437),
        SAMPLE_OPT_DOUBLE("lr", &c->lr, 0, 10),
        SAMPLE_OPT_DOUBLE("dropout", &c->dropout, 0, 0.99),
        SAMPLE_OPT_SEED(&c->seed),
        SAMPLE_OPT("device", SO_DEVICE, &c->dev),
        SAMPLE_OPT_CALL("amp", &c->amp, parse_amp),
        SAMPLE_OPT_THREADS(&c->threads),
        {.name = "json", .kind = SO_FLAG, .dst = &c->json, .short_name = 'j'},
        SAMPLE_OPT_HELP,
    };
    *c = (config){.data = MT_DIGITS_DATA,
                  .epochs = 12,
                  .batch = 32,
                  .lr = 3e-3,
                  .dropout = 0.25,
                  .seed = 1,
                  .dev = MT_CPU};
    sample_opts_parse(argc, argv, opts, (int)(sizeof opts / sizeof *opts), usage, false);
    c->dev = resolve_device(true, c->dev);
}

/* Reads the file of tools/dump_digits.py: "digits N 64", then N lines "label p0 .. p63".
   Pixels (0..16) become floats in [0, 1]. Exits with a message on a malformed file. */
static int64_t load_digits(const char *path, float **images, int64_t **labels) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "digits_cnn: cannot open %s: %s (it is made at build time by "
                "tools/dump_digits.py, which needs python3-sklearn)\n",
                path, strerror(errno));
        exit(1);
    }
    long n = 0, p = 0;
    if (fscanf(f, "digits %ld %ld", &n, &p) != 2 || n <= TEST_IMAGES || n > 1000000 ||
        p != PIXELS) {
        fprintf(stderr, "digits_cnn: %s: not a digits file (expected \"digits N 64\")\n", path);
        exit(1);
    }
    *images = malloc((size_t)n * PIXELS * sizeof **images);
    *labels = malloc((size_t)n * sizeof **labels);
    if (!*images || !*labels) {
        fprintf(stderr, "digits_cnn: out of memory\n");
        exit(1);
    }
    for (long i = 0; i < n; i++) {
        long label;
        if (fscanf(f, "%ld", &label) != 1 || label < 0 || label >= CLASSES) goto bad;
        (*labels)[i] = label;
        for (int k = 0; k < PIXELS; k++) {
            int v;
            if (fscanf(f, "%d", &v) != 1 || v < 0 || v > 16) goto bad;
            (*images)[i * PIXELS + k] = (float)v / 16.0f;
        }
        continue;
    bad:
        fprintf(stderr, "digits_cnn: %s: image %ld: expected a label 0-9 and 64 pixels 0-16\n",
                path, i);
        exit(1);
    }
    fclose(f);
    return n;
}

static void model_init(model *m, const config *c, mt_tensor **params) {
    mt_manual_seed(c->seed);
    mt_conv2d_opts same = {.padding = {1, 1}};
    mt_conv2d_layer_init(&m->conv1, 1, 16, 3, 3, &same, false, MT_F32, c->dev);
    mt_batch_norm2d_layer_init(&m->bn1, 16, MT_F32, c->dev);
    mt_conv2d_layer_init(&m->conv2, 16, 32, 3, 3, &same, false, MT_F32, c->dev);
    mt_batch_norm2d_layer_init(&m->bn2, 32, MT_F32, c->dev);
    mt_dropout_layer_init(&m->drop, c->dropout);
    mt_linear_layer_init(&m->fc, 32 * 4 * 4, CLASSES, true, MT_F32, c->dev);
    check("making the model");
    mt_tensor *p[N_PARAMS] = {m->conv1.weight, m->bn1.weight, m->bn1.bias,  m->conv2.weight,
                              m->bn2.weight,   m->bn2.bias,   m->fc.weight, m->fc.bias};
    memcpy(params, p, sizeof p);
}

static void model_free(model *m) {
    mt_conv2d_layer_free(&m->conv1);
    mt_conv2d_layer_free(&m->conv2);
    mt_batch_norm2d_layer_free(&m->bn1);
    mt_batch_norm2d_layer_free(&m->bn2);
    mt_linear_layer_free(&m->fc);
}

static void model_set_training(model *m, bool on) {
    m->bn1.training = m->bn2.training = m->drop.training = on;
}

static mt_tensor *bn_relu(mt_batch_norm2d_layer *l, mt_tensor *x) {
    return mt_batch_norm_act(x, l->running_mean, l->running_var, l->weight, l->bias, NULL,
                             l->training, l->momentum, l->eps, MT_ACT_RELU);
}

/* x [N, 1, 8, 8] -> logits [N, 10] (in the scope of the caller). */
static mt_tensor *model_forward(model *m, mt_tensor *x) {
    mt_tensor *h = bn_relu(&m->bn1, mt_conv2d_layer_forward(&m->conv1, x));
    h = bn_relu(&m->bn2, mt_conv2d_layer_forward(&m->conv2, h));
    h = mt_max_pool2d(h, &(mt_pool2d_opts){.kernel = {2, 2}});
    h = mt_reshape(h, MT_SHAPE(-1, 32 * 4 * 4));
    h = mt_dropout_layer_forward(&m->drop, h);
    return mt_linear_layer_forward(&m->fc, h);
}

typedef struct {
    mt_tensor *x_train, *y_train, *x_test, *y_test; /* on the training device */
    int64_t n_train, n_test;
} dataset;

/* The fixed split: a permutation under SPLIT_SEED; its first TEST_IMAGES are the test set. */
static void make_split(const config *c, const float *images, const int64_t *labels, int64_t n,
                       dataset *d) {
    mt_scope_begin();
    mt_tensor *x = mt_from_data(images, MT_F32, 4, (int64_t[]){n, 1, SIDE, SIDE}, MT_CPU);
    mt_tensor *y = mt_from_data(labels, MT_I64, 1, (int64_t[]){n}, MT_CPU);
    mt_manual_seed(SPLIT_SEED);
    mt_tensor *perm = mt_randperm(n, MT_CPU);
    mt_tensor *test = mt_narrow(perm, 0, 0, TEST_IMAGES);
    mt_tensor *train = mt_narrow(perm, 0, TEST_IMAGES, n - TEST_IMAGES);
    d->x_train = mt_retain(mt_to(mt_index_select(x, 0, train), c->dev));
    d->y_train = mt_retain(mt_to(mt_index_select(y, 0, train), c->dev));
    d->x_test = mt_retain(mt_to(mt_index_select(x, 0, test), c->dev));
    d->y_test = mt_retain(mt_to(mt_index_select(y, 0, test), c->dev));
    mt_scope_end();
    check("splitting the data");
    d->n_train = n - TEST_IMAGES;
    d->n_test = TEST_IMAGES;
}

static mt_dtype low_dtype(const config *c) {
    /* CPUs compute BF16 natively (oneDNN, AVX512-BF16/AMX) but FP16 only through FP32 */
    return c->dev.type == MT_DEVICE_CPU ? MT_BF16 : MT_F16;
}

static void autocast_begin(const config *c) {
    if (c->amp != AMP_OFF)
        mt_autocast_begin(low_dtype(c), c->amp == AMP_O2 ? MT_AMP_O2 : MT_AMP_O1);
}

static void autocast_end(const config *c) {
    if (c->amp != AMP_OFF) mt_autocast_end();
}

/* One epoch over the training images in a fresh random order; returns the mean loss. */
static double train_epoch(const config *c, model *m, const dataset *d, mt_optimizer *opt,
                          mt_grad_scaler *scaler) {
    model_set_training(m, true);
    mt_tensor *perm = mt_randperm(d->n_train, c->dev);
    check("mt_randperm");
    double loss_sum = 0;
    for (int64_t start = 0; start < d->n_train; start += c->batch) {
        int64_t len = d->n_train - start < c->batch ? d->n_train - start : c->batch;
        mt_scope_begin();
        mt_tensor *idx = mt_narrow(perm, 0, start, len);
        mt_tensor *xb = mt_index_select(d->x_train, 0, idx);
        mt_tensor *yb = mt_index_select(d->y_train, 0, idx);
        autocast_begin(c);
        mt_tensor *loss = mt_cross_entropy(model_forward(m, xb), yb);
        autocast_end(c);
        if (scaler) {
            mt_backward(mt_grad_scaler_scale(scaler, loss), NULL);
            mt_grad_scaler_minimize(scaler, opt);
        } else {
            mt_backward(loss, NULL);
            mt_optimizer_step(opt);
        }
        mt_optimizer_zero_grad(opt);
        loss_sum += mt_item(loss) * (double)len;
        mt_scope_end();
        check("a training step");
    }
    mt_release(perm);
    return loss_sum / (double)d->n_train;
}

/* Test images classified correctly: batch norm on running statistics, dropout off, no tape. */
static int64_t evaluate(const config *c, model *m, const dataset *d) {
    model_set_training(m, false);
    bool grad_was = mt_set_grad_enabled(false);
    double correct = 0;
    for (int64_t start = 0; start < d->n_test; start += 256) {
        int64_t len = d->n_test - start < 256 ? d->n_test - start : 256;
        mt_scope_begin();
        autocast_begin(c);
        mt_tensor *logits = model_forward(m, mt_narrow(d->x_test, 0, start, len));
        autocast_end(c);
        mt_tensor *hit = mt_eq(mt_argmax(logits, 1, false), mt_narrow(d->y_test, 0, start, len));
        correct += mt_item(mt_sum_all(mt_cast(hit, MT_F32)));
        mt_scope_end();
        check("evaluating");
    }
    mt_set_grad_enabled(grad_was);
    return (int64_t)correct;
}

static const char *amp_name(amp_mode a) {
    return a == AMP_O1 ? "o1" : a == AMP_O2 ? "o2" : "off";
}

int main(int argc, char **argv) {
    config c;
    parse_args(argc, argv, &c);
    if (c.threads > 0) mt_set_num_threads(c.threads);
    float *images;
    int64_t *labels;
    int64_t n = load_digits(c.data, &images, &labels);
    dataset d;
    make_split(&c, images, labels, n, &d);
    free(images);
    free(labels);

    model m = {0};
    mt_tensor *params[N_PARAMS];
    model_init(&m, &c, params);
    if (c.amp == AMP_O2) {
        mt_amp_decorate(params, N_PARAMS, low_dtype(&c), NULL); /* batch norm's stay FP32 */
        check("mt_amp_decorate");
    }
    mt_optimizer *opt = mt_adam_new(
        params, N_PARAMS, &(mt_adam_opts){.lr = MT_SET(c.lr), .multi_precision = c.amp == AMP_O2});
    mt_grad_scaler *scaler = NULL;
    if (c.amp != AMP_OFF && low_dtype(&c) == MT_F16)
        scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
    check("making the optimizer");

    if (!c.json)
        printf("digits: %lld training and %lld test images of 8x8; batch %lld, Adam lr %g, "
               "amp %s%s, %s, %d threads\n",
               (long long)d.n_train, (long long)d.n_test, (long long)c.batch, c.lr, amp_name(c.amp),
               c.amp == AMP_OFF           ? ""
               : low_dtype(&c) == MT_BF16 ? " (BF16)"
                                          : " (FP16)",
               c.dev.type == MT_DEVICE_CUDA ? "cuda" : "cpu", mt_get_num_threads());
    double t0 = now_s();
    int64_t correct = 0;
    for (int e = 1; e <= c.epochs; e++) {
        double loss = train_epoch(&c, &m, &d, opt, scaler);
        correct = evaluate(&c, &m, &d);
        double acc = (double)correct / (double)d.n_test;
        if (c.json)
            printf("{\"epoch\": %d, \"train_loss\": %.6f, \"eval_accuracy\": %.6f, "
                   "\"seconds\": %.3f}\n",
                   e, loss, acc, now_s() - t0);
        else
            printf("epoch %3d  train loss %.4f  test accuracy %.2f%%  (%.1f s)\n", e, loss,
                   100 * acc, now_s() - t0);
        fflush(stdout);
    }
    double acc = (double)correct / (double)d.n_test;
    if (c.json)
        printf("{\"test_accuracy\": %.6f, \"correct\": %lld, \"test_images\": %lld, "
               "\"train_images\": %lld, \"epochs\": %d, \"batch\": %lld, \"amp\": \"%s\", "
               "\"device\": \"%s\", \"skipped_steps\": %lld, \"seconds\": %.3f}\n",
               acc, (long long)correct, (long long)d.n_test, (long long)d.n_train, c.epochs,
               (long long)c.batch, amp_name(c.amp), c.dev.type == MT_DEVICE_CUDA ? "cuda" : "cpu",
               (long long)(scaler ? mt_grad_scaler_skipped_steps(scaler) : 0), now_s() - t0);
    else
        printf("test accuracy %.2f%% (%lld of %lld)\n", 100 * acc, (long long)correct,
               (long long)d.n_test);

    mt_grad_scaler_free(scaler);
    mt_optimizer_free(opt);
    model_free(&m);
    mt_release(d.x_train);
    mt_release(d.y_train);
    mt_release(d.x_test);
    mt_release(d.y_test);
    check("cleaning up");
    return 0;
}

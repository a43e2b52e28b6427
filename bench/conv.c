/* mt_conv2d against torch.nn.functional.conv2d in the same run on this machine: forward +
   backward (input, weight and bias gradients; a cotangent of ones made once, in the output's
   format) for ResNet-like shapes, F32
   and BF16, NCHW and channels-last. Best of --reps after a warm-up, each side; torch runs as
   a child (bench/conv.py). Prints a table of ms per step and the ratio mixtape / torch
   (below 1: mixtape faster).
   Usage: conv [--reps N] [--threads N] [--python PATH] [--no-torch] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "mixtape.h"

typedef struct {
    const char *name;
    int64_t n, c, h, w, oc, k, stride, pad;
} shape;

/* the same list as bench/conv.py */
static const shape shapes[] = {
    {"stem7x7", 4, 3, 112, 112, 64, 7, 2, 3},        {"res3x3_64", 4, 64, 56, 56, 64, 3, 1, 1},
    {"res3x3_128", 4, 128, 28, 28, 128, 3, 1, 1},    {"res3x3_256", 4, 256, 14, 14, 256, 3, 1, 1},
    {"res1x1_256to64", 4, 256, 56, 56, 64, 1, 1, 0},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))
#define NCONF   (NSHAPES * 4)

/* Best ms per forward + backward step of one configuration, or a negative value. */
static double time_mixtape(const shape *s, mt_dtype dt, bool cl, int reps) {
    mt_tensor *x0 = mt_randn(MT_SHAPE(s->n, s->c, s->h, s->w), MT_F32, MT_CPU);
    mt_tensor *w0 = mt_randn(MT_SHAPE(s->oc, s->c, s->k, s->k), MT_F32, MT_CPU);
    mt_tensor *xc = mt_cast(x0, dt), *wc = mt_cast(w0, dt);
    mt_tensor *x = cl ? mt_to_channels_last(xc) : mt_retain(xc);
    mt_tensor *w = cl ? mt_to_channels_last(wc) : mt_retain(wc);
    mt_tensor *b = mt_zeros(MT_SHAPE(s->oc), dt, MT_CPU);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_conv2d_opts o = {.stride = {s->stride, s->stride}, .padding = {s->pad, s->pad}};
    /* the cotangent, made once in the output's format (as torch's ones_like keeps it) */
    int64_t oh = (s->h + 2 * s->pad - s->k) / s->stride + 1,
            ow = (s->w + 2 * s->pad - s->k) / s->stride + 1;
    mt_tensor *g1 = mt_ones(MT_SHAPE(s->n, s->oc, oh, ow), dt, MT_CPU);
    mt_tensor *g = cl ? mt_to_channels_last(g1) : mt_retain(g1);
    double best = 1e30;
    for (int r = 0; r < reps + 1 && best >= 0; r++) {
        mt_scope_begin();
        double t0 = mt_bench_now_s();
        mt_tensor *y = mt_conv2d(x, w, b, &o);
        int rc = y ? mt_backward(y, g) : -1;
        double t1 = mt_bench_now_s();
        mt_scope_end();
        mt_zero_grad(x), mt_zero_grad(w), mt_zero_grad(b);
        if (rc) {
            fprintf(stderr, "%s: %s\n", s->name, mt_last_error());
            best = -1;
        } else if (r && t1 - t0 < best) {
            best = t1 - t0;
        }
    }
    mt_release(x0), mt_release(w0), mt_release(xc), mt_release(wc);
    mt_release(x), mt_release(w), mt_release(b), mt_release(g), mt_release(g1);
    return best < 0 ? best : best * 1e3;
}

static int conf_index(const char *name, const char *dt, const char *fmt) {
    for (int i = 0; i < NSHAPES; i++)
        if (strcmp(shapes[i].name, name) == 0)
            return i * 4 + (strcmp(dt, "bf16") == 0) * 2 + (strcmp(fmt, "nhwc") == 0);
    return -1;
}

/* Runs bench/conv.py and fills torch_ms[] from its JSON lines. */
static void run_torch(const char *python, int reps, int threads, double *torch_ms) {
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "%s %s/conv.py --reps %d --threads %d", python, MT_BENCH_DIR, reps,
             threads);
    FILE *f = popen(cmd, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char name[64], dt[16], fmt[16];
        double ms;
        if (sscanf(line,
                   "{\"name\": \"%63[^\"]\", \"dtype\": \"%15[^\"]\", \"format\": "
                   "\"%15[^\"]\", \"ms\": %lf}",
                   name, dt, fmt, &ms) == 4) {
            int i = conf_index(name, dt, fmt);
            if (i >= 0) torch_ms[i] = ms;
        }
    }
    pclose(f);
}

int main(int argc, char **argv) {
    int reps = 5, threads = 0;
    const char *python = MT_TORCH_PYTHON;
    bool torch = true;
    for (int i = 1; i < argc; i++) {
        bool ok = true;
        if (mt_bench_is_help(argv[i])) {
            printf("usage: %s [--reps N] [--threads N] [--python PATH] [--no-torch]\n", argv[0]);
            return 0;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            ok = mt_bench_parse_int(argv[0], "--reps", argv[++i], 1, 100000, &reps);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            ok = mt_bench_parse_int(argv[0], "--threads", argv[++i], 0, 4096, &threads);
        else if (strcmp(argv[i], "--python") == 0 && i + 1 < argc)
            python = argv[++i];
        else if (strcmp(argv[i], "--no-torch") == 0)
            torch = false;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "usage: %s [--reps N] [--threads N] [--python PATH] [--no-torch]\n",
                    argv[0]);
            return 2;
        }
    }
    if (threads > 0) mt_set_num_threads(threads);
    threads = mt_get_num_threads();
    mt_manual_seed(0);
    double mt_ms[NCONF], torch_ms[NCONF];
    for (int i = 0; i < NCONF; i++) {
        const shape *s = &shapes[i / 4];
        mt_ms[i] = time_mixtape(s, (i / 2) % 2 ? MT_BF16 : MT_F32, i % 2, reps);
        torch_ms[i] = -1;
    }
    if (torch) run_torch(python, reps, threads, torch_ms);
    printf("conv2d forward + backward, best of %d, %d threads (ms per step)\n\n", reps, threads);
    printf("| shape | dtype | format | mixtape | torch | mixtape / torch |\n");
    printf("|---|---|---|---:|---:|---:|\n");
    for (int i = 0; i < NCONF; i++) {
        printf("| %s | %s | %s | %.2f | ", shapes[i / 4].name, (i / 2) % 2 ? "bf16" : "f32",
               i % 2 ? "nhwc" : "nchw", mt_ms[i]);
        if (torch_ms[i] > 0 && mt_ms[i] > 0)
            printf("%.2f | %.2f |\n", torch_ms[i], mt_ms[i] / torch_ms[i]);
        else
            printf("- | - |\n");
    }
    return 0;
}

/* Time of single ops on a [4096, 1024] tensor (F32 unless named): reductions, softmax,
   transcendental and plain elementwise ops, casts, dropout, layer norm, random draws and an
   AdamW step, best of N calls. The numbers show whether the CPU backend's loops run as vector
   code for this CPU (their AVX2/AVX-512 clones) and how they compare with PyTorch's
   (bench/ops.py prints the same lines).
   Usage: ops [reps] [threads] */
#include <stdio.h>
#include <stdlib.h>
#include "bench_util.h"
#include "mixtape.h"

static mt_tensor *x, *xh, *xb, *param;
static mt_optimizer *adamw;

static mt_tensor *run(int k) {
    switch (k) {
    case 0:
        return mt_sum_all(x);
    case 1:
        return mt_sum(x, MT_DIMS(1), false);
    case 2:
        return mt_sum(x, MT_DIMS(0), false);
    case 3:
        return mt_max(x, MT_DIMS(1), false);
    case 4:
        return mt_softmax(x, -1);
    case 5:
        return mt_log_softmax(x, -1);
    case 6:
        return mt_exp(x);
    case 7:
        return mt_sigmoid(x);
    case 8:
        return mt_gelu(x);
    case 9:
        return mt_gelu_tanh(x);
    case 10:
        return mt_mul(x, x);
    case 11:
        return mt_add(xh, xh);
    case 12:
        return mt_add(xb, xb);
    case 13:
        return mt_cast(x, MT_F16);
    case 14:
        return mt_dropout(x, 0.1, true);
    case 15:
        return mt_dropout(xb, 0.1, true);
    case 16:
        return mt_layer_norm(x, 1, NULL, NULL, 1e-5);
    case 17:
        return mt_rand(MT_SHAPE(4096, 1024), MT_F32, MT_CPU);
    case 18:
        return mt_randn(MT_SHAPE(4096, 1024), MT_F32, MT_CPU);
    default: /* an AdamW step over one [4096, 1024] parameter (x stands for its result) */
        return mt_optimizer_step(adamw) == 0 ? x : NULL;
    }
}

static const char *const names[] = {
    "sum_all", "sum dim 1",    "sum dim 0",  "max dim 1", "softmax", "log_softmax", "exp",
    "sigmoid", "gelu",         "gelu_tanh",  "mul",       "add f16", "add bf16",    "cast to f16",
    "dropout", "dropout bf16", "layer_norm", "rand",      "randn",   "adamw step"};
#define N_OPS ((int)(sizeof names / sizeof names[0]))

int main(int argc, char **argv) {
    if (argc > 1 && mt_bench_is_help(argv[1])) {
        printf("usage: %s [reps > 0] [threads > 0]\n", argv[0]);
        return 0;
    }
    int reps = 20, threads = 2;
    if (argc > 3 ||
        (argc > 1 && !mt_bench_parse_int(argv[0], "reps", argv[1], 1, 1000000, &reps)) ||
        (argc > 2 && !mt_bench_parse_int(argv[0], "threads", argv[2], 1, 4096, &threads))) {
        fprintf(stderr, "usage: %s [reps > 0] [threads > 0]\n", argv[0]);
        return 2;
    }
    mt_set_num_threads(threads);
    mt_manual_seed(1);
    x = mt_randn(MT_SHAPE(4096, 1024), MT_F32, MT_CPU);
    xh = mt_cast(x, MT_F16);
    xb = mt_cast(x, MT_BF16);
    param = mt_randn(MT_SHAPE(4096, 1024), MT_F32, MT_CPU);
    mt_set_requires_grad(param, true);
    adamw = mt_adamw_new(&param, 1, &(mt_adam_opts){.lr = MT_SET(1e-3)});
    if (!x || !xh || !xb || !adamw || mt_backward(mt_sum_all(param), NULL) != 0) {
        fprintf(stderr, "setup failed: %s\n", mt_last_error());
        return 1;
    }
    printf("mixtape ops on [4096, 1024], %d thread(s), best of %d (ms)\n", threads, reps);
    for (int k = 0; k < N_OPS; k++) {
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first call warms caches and pages */
            mt_scope_begin();
            double t0 = mt_bench_now_s();
            mt_tensor *y = run(k);
            double t = mt_bench_now_s() - t0;
            mt_scope_end();
            if (!y) {
                fprintf(stderr, "%s failed: %s\n", names[k], mt_last_error());
                return 1;
            }
            if (r > 0 && t < best) best = t;
        }
        printf("%-12s %8.3f\n", names[k], best * 1e3);
    }
    return 0;
}

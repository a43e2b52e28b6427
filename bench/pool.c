/* Pooling: mt_max_pool2d (3x3, stride 2, padding 1: ResNet's stem pool) and mt_avg_pool2d
   (2x2, stride 2) forward + backward on [16, 64, 32, 32], F32, BF16 and F16, NCHW and
   channels-last (input and cotangent), best of N steps. bench/pool.py times the same cases
   in PyTorch; run both on the same machine and compare.
   Usage: pool [reps] [threads] */
#include <stdio.h>
#include <stdlib.h>
#include "bench_util.h"
#include "mixtape.h"

static const char *dtype_name(mt_dtype dt) {
    return dt == MT_F32 ? "f32" : dt == MT_BF16 ? "bf16" : "f16";
}

static int run(bool max, bool cl, mt_dtype dt, int reps) {
    int64_t xs[4] = {16, 64, 32, 32}, ys[4] = {16, 64, 16, 16};
    mt_pool2d_opts o = max ? (mt_pool2d_opts){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}
                           : (mt_pool2d_opts){.kernel = {2, 2}, .stride = {2, 2}};
    mt_scope_begin();
    mt_tensor *leaf = mt_randn(4, xs, dt, MT_CPU), *cot = mt_ones(4, ys, dt, MT_CPU);
    mt_set_requires_grad(leaf, true);
    double best = 1e30;
    int rc = 0;
    for (int r = 0; r < reps + 1 && rc == 0; r++) {
        mt_scope_begin();
        mt_tensor *x = cl ? mt_to_channels_last(mt_detach(leaf)) : mt_detach(leaf);
        mt_tensor *c = cl ? mt_to_channels_last(cot) : cot;
        mt_set_requires_grad(x, true);
        double t0 = mt_bench_now_s();
        mt_tensor *y = max ? mt_max_pool2d(x, &o) : mt_avg_pool2d(x, &o);
        rc = y ? mt_backward(y, c) : -1;
        double t = mt_bench_now_s() - t0;
        mt_scope_end();
        if (r > 0 && t < best) best = t;
    }
    mt_scope_end();
    if (rc) {
        fprintf(stderr, "failed: %s\n", mt_last_error());
        return 1;
    }
    printf("%-8s %-4s %-4s [16, 64, 32, 32] fwd+bwd best of %d: %8.3f ms\n",
           max ? "max3s2p1" : "avg2s2", dtype_name(dt), cl ? "nhwc" : "nchw", reps, best * 1e3);
    return 0;
}

int main(int argc, char **argv) {
    int reps;
    if (!mt_bench_kernel_start(argc, argv, &reps)) return 2;
    const mt_dtype dts[] = {MT_F32, MT_BF16, MT_F16};
    int rc = 0;
    for (int max = 1; max >= 0; max--)
        for (int cl = 0; cl < 2; cl++)
            for (int k = 0; k < 3; k++) rc |= run(max, cl, dts[k], reps);
    return rc;
}

/* Normalisation kernels: mt_batch_norm (training, forward + backward) on [N, C, H, W] and
   mt_layer_norm (forward + backward) on [rows, D], F32 and BF16 activations (FP32
   parameters), best of N steps. Batch norm also on a channels-last input: natively (the
   NHWC kernels, output channels-last) and the way it ran before them (a copy to NCHW, then
   the NCHW kernels: "nhwc-copy"). bench/norm.py times the same shapes in PyTorch (batch norm
   also with torch.channels_last); run both on the same machine and compare.
   Usage: norm [reps] [threads] */
#include <stdio.h>
#include <stdlib.h>
#include "bench_util.h"
#include "mixtape.h"

enum { NCHW, NHWC, NHWC_COPY };
static const char *const layout_names[] = {"nchw", "nhwc", "nhwc-copy"};

/* one step: y = op(x), backward with a ones cotangent; returns seconds or -1 */
static double step(bool bn, int layout, mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_tensor *rm,
                   mt_tensor *rv, mt_tensor *cot) {
    mt_scope_begin();
    double t0 = mt_bench_now_s();
    mt_tensor *xin = layout == NHWC_COPY ? mt_contiguous(x) : x;
    mt_tensor *y =
        bn ? mt_batch_norm(xin, rm, rv, w, b, true, 0.1, 1e-5) : mt_layer_norm(x, 1, w, b, 1e-5);
    int rc = y ? mt_backward(y, cot) : -1;
    double t = mt_bench_now_s() - t0;
    mt_scope_end();
    return rc == 0 ? t : -1;
}

static int run(bool bn, int layout, mt_dtype dt, int reps) {
    int64_t s4[4] = {16, 64, 32, 32}, s2[2] = {4096, 1024};
    int64_t C = bn ? s4[1] : s2[1];
    mt_tensor *x = bn ? mt_randn(4, s4, dt, MT_CPU) : mt_randn(2, s2, dt, MT_CPU);
    mt_tensor *cot = bn ? mt_ones(4, s4, dt, MT_CPU) : mt_ones(2, s2, dt, MT_CPU);
    if (layout != NCHW) { /* the input and the cotangent channels-last */
        mt_tensor *xc = mt_to_channels_last(x), *cc = mt_to_channels_last(cot);
        mt_release(x);
        mt_release(cot);
        x = xc;
        cot = cc;
    }
    mt_tensor *w = mt_ones(1, &C, MT_F32, MT_CPU), *b = mt_zeros(1, &C, MT_F32, MT_CPU);
    mt_tensor *rm = mt_zeros(1, &C, MT_F32, MT_CPU), *rv = mt_ones(1, &C, MT_F32, MT_CPU);
    mt_set_requires_grad(x, true);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t = step(bn, layout, x, w, b, rm, rv, cot);
        if (t < 0) {
            fprintf(stderr, "failed: %s\n", mt_last_error());
            return 1;
        }
        if (r > 0 && t < best) best = t;
        mt_zero_grad(x);
        mt_zero_grad(w);
        mt_zero_grad(b);
    }
    printf("%-10s %-4s %s %-9s fwd+bwd best of %d: %8.3f ms\n", bn ? "batch_norm" : "layer_norm",
           dt == MT_F32 ? "f32" : "bf16", bn ? "[16, 64, 32, 32]" : "[4096, 1024]    ",
           bn ? layout_names[layout] : "", reps, best * 1e3);
    mt_tensor *ts[7] = {x, cot, w, b, rm, rv, NULL};
    for (int i = 0; ts[i]; i++) mt_release(ts[i]);
    return 0;
}

int main(int argc, char **argv) {
    int reps;
    if (!mt_bench_kernel_start(argc, argv, &reps)) return 2;
    int rc = 0;
    for (int bn = 1; bn >= 0; bn--)
        for (int layout = 0; layout < (bn ? 3 : 1); layout++)
            for (int k = 0; k < 2; k++) rc |= run(bn, layout, k ? MT_BF16 : MT_F32, reps);
    return rc;
}

/* mt_linear_act(x, w, b, MT_ACT_RELU) against the unfused mt_relu(mt_linear(x, w, b)) and
   against PyTorch's relu(F.linear(x, w, b)) (bench/linear_act.py, run as a child in the same
   run), F32 and BF16, forward alone (no grad) and forward + backward. Best of N repetitions,
   fused and unfused alternated.
   Prints ms and the ratios fused / unfused and fused / torch (below 1: faster).
   Usage: linear_act [reps] [threads] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "mixtape.h"

static const int64_t shapes[][3] = {{512, 1024, 1024}, {4096, 256, 256}, {64, 4096, 4096}};
#define N_SHAPES 3

typedef struct {
    double fwd, fwd_bwd; /* ms, best */
} timing;

/* One step: y = f(x, w, b) (and its backward when grad). 0 or -1. */
static int step(bool fused, bool grad, mt_tensor *x, mt_tensor *w, mt_tensor *b) {
    mt_scope_begin();
    bool prev = mt_set_grad_enabled(grad);
    mt_tensor *y = fused ? mt_linear_act(x, w, b, MT_ACT_RELU) : mt_relu(mt_linear(x, w, b));
    int rc = y ? 0 : -1;
    if (grad && y) rc = mt_backward(mt_sum_all(y), NULL);
    if (!grad && y) mt_synchronize(mt_device_of(y));
    mt_set_grad_enabled(prev);
    mt_scope_end();
    return rc < 0 ? -1 : 0;
}

/* best times (ms) of the fused and the unfused step, alternated rep by rep so that both
   see the same machine load (the machine may be shared) */
static void best_pair(int reps, bool grad, mt_tensor *x, mt_tensor *w, mt_tensor *b, double *fused,
                      double *unfused) {
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < reps + 1; r++) /* the first warms caches, threads, primitives */
        for (int f = 0; f < 2; f++) {
            double t0 = mt_bench_now_s();
            if (step(f == 0, grad, x, w, b)) {
                fprintf(stderr, "mt_linear_act bench failed: %s\n", mt_last_error());
                exit(1);
            }
            double t = mt_bench_now_s() - t0;
            if (r > 0 && t < best[f]) best[f] = t;
        }
    *fused = best[0] * 1e3;
    *unfused = best[1] * 1e3;
}

/* torch's timings, by shape and dtype (index 0 f32, 1 bf16); -1 where it did not run */
static void run_torch(int reps, int threads, timing torch_t[N_SHAPES][2]) {
    for (int s = 0; s < N_SHAPES; s++) torch_t[s][0] = torch_t[s][1] = (timing){-1, -1};
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s/linear_act.py --reps %d --threads %d 2>/dev/null",
             MT_TORCH_PYTHON, MT_BENCH_DIR, reps, threads);
    FILE *f = popen(cmd, "r");
    if (!f) return;
    char line[256], dt[16];
    long long r, i, o;
    double fwd, fb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "torch %lld %lld %lld %15s %lf %lf", &r, &i, &o, dt, &fwd, &fb) == 6)
            for (int s = 0; s < N_SHAPES; s++)
                if (shapes[s][0] == r && shapes[s][1] == i && shapes[s][2] == o)
                    torch_t[s][strcmp(dt, "bf16") == 0] = (timing){fwd, fb};
    pclose(f);
}

int main(int argc, char **argv) {
    int reps, threads;
    if (!mt_bench_reps_threads(argc, argv, 2, 1, &reps, &threads)) return 2;
    mt_set_num_threads(threads);
    timing torch_t[N_SHAPES][2];
    run_torch(reps, threads, torch_t);
    mt_manual_seed(1);
    const mt_dtype dts[2] = {MT_F32, MT_BF16};
    printf("linear + relu, best of %d, %d threads (ms; ratios below 1: fused faster)\n", reps,
           threads);
    printf("%-16s %-4s | %9s %9s %9s | %9s %9s %9s | %7s %7s %7s %7s\n", "rows x in x out", "dt",
           "fused", "unfused", "torch", "fused+bw", "unf+bw", "torch+bw", "f/unf", "f/torch",
           "fb/unfb", "fb/tb");
    for (int s = 0; s < N_SHAPES; s++)
        for (int d = 0; d < 2; d++) {
            const int64_t *sh = shapes[s];
            mt_tensor *x = mt_randn(MT_SHAPE(sh[0], sh[1]), dts[d], MT_CPU);
            mt_tensor *w = mt_randn(MT_SHAPE(sh[2], sh[1]), dts[d], MT_CPU);
            mt_tensor *b = mt_randn(MT_SHAPE(sh[2]), dts[d], MT_CPU);
            if (!x || !w || !b) {
                fprintf(stderr, "setup failed: %s\n", mt_last_error());
                return 1;
            }
            mt_set_requires_grad(w, true);
            mt_set_requires_grad(b, true);
            timing fu, un;
            best_pair(reps, false, x, w, b, &fu.fwd, &un.fwd);
            best_pair(reps, true, x, w, b, &fu.fwd_bwd, &un.fwd_bwd);
            timing t = torch_t[s][d];
            char name[48];
            snprintf(name, sizeof name, "%lldx%lldx%lld", (long long)sh[0], (long long)sh[1],
                     (long long)sh[2]);
            printf("%-16s %-4s | %9.3f %9.3f %9.3f | %9.3f %9.3f %9.3f | %7.3f %7.3f %7.3f %7.3f\n",
                   name, mt_dtype_name(dts[d]), fu.fwd, un.fwd, t.fwd, fu.fwd_bwd, un.fwd_bwd,
                   t.fwd_bwd, fu.fwd / un.fwd, t.fwd > 0 ? fu.fwd / t.fwd : -1,
                   fu.fwd_bwd / un.fwd_bwd, t.fwd_bwd > 0 ? fu.fwd_bwd / t.fwd_bwd : -1);
            mt_release(x);
            mt_release(w);
            mt_release(b);
        }
    return 0;
}

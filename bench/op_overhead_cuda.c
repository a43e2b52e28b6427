/* op_overhead --device cuda[:N]: the host time per call of tiny eager ops on a CUDA device,
   side by side with PyTorch on the same device (bench/op_overhead.py --device ...).

   Issue 6's goal: mixtape's per-op host time <= 0.5x PyTorch's. Two figures per op, measured
   the same way on both sides (mixtape here, torch in op_overhead.py cuda_main), both with the
   monotonic wall clock (mt_bench_now_s; time.perf_counter):

   host us (JSON "mixtape_us", "torch_us", and "ratio" = mixtape_us / torch_us: the goal's
     figure): synchronize the device (untimed), time a burst of `burst` calls (--burst, default
     32) with no synchronization inside, stopping the clock when the last call returns, then
     synchronize (untimed). The per-call time of the best (smallest) of reps * 20 bursts. A
     burst is short enough that the launch queue never fills (the linear steps launch about
     10-15 kernels per call: at most ~500 launches in a burst of 32), so every launch returns
     as soon as it is queued, and the figure is the library's host cost per op (validation,
     dispatch, allocation, launch, autograd recording), whatever the kernels cost on the
     device.

   wall us (JSON "mixtape_wall_us", "torch_wall_us"): `iters` calls back to back (--iters,
     default 2000), then one synchronization; the wall time over calls and synchronization
     divided by `iters`, best of `reps` runs. Thousands of launches fill the CUDA launch queue
     (about 1024 entries); from then on each launch waits for a slot, and the loop runs at the
     device's rate for back-to-back tiny kernels rather than the host's. Wall well above host
     therefore means the device, not the host, bounded the long run (marked * in the table);
     the wall figure alone would hide the host cost the goal is about (on an H200 mixtape's
     add, mul, relu and sum all measured ~4.8 us that way).

   Ops: add, mul, relu (8 F32 elements), matmul 8x8, sum (8 elements to a scalar), and a
   training step of a tiny linear layer (x [8,8], w [8,8], b [8]: forward, sum, backward) in
   FP32 and under FP16 autocast (O1). One JSON line per op, then a table. Without a CUDA
   device: a message and exit status 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "gpu_bench.h"
#include "mixtape.h"

int op_overhead_cuda(const char *device, int iters, int burst, int reps, const char *python,
                     const char *script);

static mt_tensor *a8, *b8, *m1, *m2, *x, *w, *bias;

static mt_tensor *op_add(void) {
    return mt_add(a8, b8);
}
static mt_tensor *op_mul(void) {
    return mt_mul(a8, b8);
}
static mt_tensor *op_relu(void) {
    return mt_relu(a8);
}
static mt_tensor *op_matmul(void) {
    return mt_matmul(m1, m2);
}
static mt_tensor *op_sum(void) {
    return mt_sum_all(a8);
}
/* forward, loss, backward in a scope (its intermediates freed at once); the status stands in
   for a tensor so that every op has one shape */
static mt_tensor *linear_step(bool autocast) {
    mt_scope_begin();
    if (autocast) mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_tensor *loss = mt_sum_all(mt_linear(x, w, bias));
    if (autocast) mt_autocast_end();
    int rc = mt_backward(loss, NULL);
    mt_scope_end();
    return rc == MT_OK ? mt_retain(a8) : NULL;
}
static mt_tensor *op_linear(void) {
    return linear_step(false);
}
static mt_tensor *op_linear_amp(void) {
    return linear_step(true);
}

typedef struct {
    const char *name, *label;
    mt_tensor *(*fn)(void);
    double mt_us, torch_us;           /* host time per call of a burst (the goal's figure) */
    double mt_wall_us, torch_wall_us; /* wall time per call of `iters` calls + a synchronize */
} tiny_op;

static tiny_op OPS[] = {
    {"add", "add (8 F32)", op_add, NAN, NAN, NAN, NAN},
    {"mul", "mul (8 F32)", op_mul, NAN, NAN, NAN, NAN},
    {"relu", "relu (8 F32)", op_relu, NAN, NAN, NAN, NAN},
    {"matmul", "matmul 8x8 F32", op_matmul, NAN, NAN, NAN, NAN},
    {"sum", "sum_all (8 F32)", op_sum, NAN, NAN, NAN, NAN},
    {"linear_step", "linear 8x8 fwd + sum + bwd", op_linear, NAN, NAN, NAN, NAN},
    {"linear_step_amp", "same under FP16 autocast (O1)", op_linear_amp, NAN, NAN, NAN, NAN},
};
enum { N_OPS = sizeof OPS / sizeof OPS[0] };

/* Microseconds per call of `n` calls made after a synchronize, followed by another one; NAN
   on an error. with_sync: the clock runs through that last synchronize (the wall figure);
   else it stops when the last call returns (the host figure of a burst). */
static double time_calls(const tiny_op *op, mt_device dev, int n, bool with_sync) {
    if (mt_synchronize(dev) != MT_OK) return NAN;
    double t0 = mt_bench_now_s();
    for (int i = 0; i < n; i++) {
        mt_tensor *y = op->fn();
        if (!y) return NAN;
        mt_release(y);
    }
    double host = mt_bench_now_s() - t0;
    if (mt_synchronize(dev) != MT_OK) return NAN;
    return (with_sync ? mt_bench_now_s() - t0 : host) / n * 1e6;
}

static bool setup(mt_device dev) {
    mt_manual_seed(1);
    a8 = mt_rand(MT_SHAPE(8), MT_F32, dev);
    b8 = mt_rand(MT_SHAPE(8), MT_F32, dev);
    m1 = mt_rand(MT_SHAPE(8, 8), MT_F32, dev);
    m2 = mt_rand(MT_SHAPE(8, 8), MT_F32, dev);
    x = mt_rand(MT_SHAPE(8, 8), MT_F32, dev);
    w = mt_rand(MT_SHAPE(8, 8), MT_F32, dev);
    bias = mt_rand(MT_SHAPE(8), MT_F32, dev);
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(bias, true);
    return mt_last_status() == MT_OK;
}

static void teardown(void) {
    mt_tensor **all[] = {&a8, &b8, &m1, &m2, &x, &w, &bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        mt_release(*all[i]);
        *all[i] = NULL;
    }
}

/* torch's figures: `NAME_us HOST` and `NAME_wall_us WALL` lines and one `gpu NAME` line from
   op_overhead.py; the number of figures read */
static int run_torch(const char *python, const char *script, const char *device, int iters,
                     int burst, int reps, char *gpu, size_t cap) {
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --device %s %d %d %d 2>&1", python, script, device, iters,
             reps, burst);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    int found = 0;
    while (fgets(line, sizeof line, p)) {
        char key[64];
        double v;
        if (!strncmp(line, "gpu ", 4)) {
            snprintf(gpu, cap, "%.150s", line + 4); /* long names cut */
            gpu[strcspn(gpu, "\n")] = 0;
            continue;
        }
        bool matched = false;
        if (sscanf(line, "%63s %lf", key, &v) == 2)
            for (int i = 0; i < N_OPS && !matched; i++) {
                char host[64], wall[64];
                snprintf(host, sizeof host, "%s_us", OPS[i].name);
                snprintf(wall, sizeof wall, "%s_wall_us", OPS[i].name);
                if (!strcmp(key, host)) OPS[i].torch_us = v, found++, matched = true;
                if (!strcmp(key, wall)) OPS[i].torch_wall_us = v, found++, matched = true;
            }
        if (!matched) fprintf(stderr, "torch: %s", line);
    }
    if (pclose(p) != 0) fprintf(stderr, "op_overhead: the PyTorch side failed (%s)\n", cmd);
    return found;
}

/* A wall figure at least this many times the host figure of the same side: the device, not
   the host, bounded the long run (marked * in the table). */
#define DEVICE_BOUND 1.5

static void print_wall(double wall, double host) {
    printf(" %.2f%s |", wall, wall >= DEVICE_BOUND * host ? " *" : "");
}

static void print_results(const char *gpu, int iters, int burst, int reps, const char *torch_gpu) {
    for (int i = 0; i < N_OPS; i++) {
        const tiny_op *o = &OPS[i];
        printf("{\"bench\": \"op_overhead\", \"device\": \"%s\", \"emulated\": %s, \"op\": \"%s\"",
               gpu, mt_gpu_bench_emulated() ? "true" : "false", o->name);
        double v[5] = {o->mt_us, o->torch_us, o->mt_us / o->torch_us, o->mt_wall_us,
                       o->torch_wall_us};
        const char *keys[5] = {"mixtape_us", "torch_us", "ratio", "mixtape_wall_us",
                               "torch_wall_us"};
        for (int k = 0; k < 5; k++)
            printf(isnan(v[k]) ? ", \"%s\": null" : ", \"%s\": %.4g", keys[k], v[k]);
        printf("}\n");
    }
    printf("\nper-op time on %s, microseconds per call\n"
           "host: %d calls, no synchronize inside the timed region (best of %d bursts); the "
           "goal's figure\n"
           "wall: %d calls + one synchronize (best of %d runs); * = wall >= %.1fx host: the "
           "device, not the host, bounded that run\n",
           gpu, burst, reps * 20, iters, reps, DEVICE_BOUND);
    if (torch_gpu[0]) printf("torch: %s\n", torch_gpu);
    printf("| op | mixtape us | torch us | mixtape / torch (goal <= 0.5) | mixtape wall us (%d "
           "calls + sync) | torch wall us (%d calls + sync) |\n|---|---|---|---|---|---|\n",
           iters, iters);
    for (int i = 0; i < N_OPS; i++) {
        const tiny_op *o = &OPS[i];
        printf("| %s | %.2f | %.2f | %.2f |", o->label, o->mt_us, o->torch_us,
               o->mt_us / o->torch_us);
        print_wall(o->mt_wall_us, o->mt_us);
        print_wall(o->torch_wall_us, o->torch_us);
        printf("\n");
    }
}

/* python: the interpreter with PyTorch, or NULL for mixtape alone */
int op_overhead_cuda(const char *device, int iters, int burst, int reps, const char *python,
                     const char *script) {
    bool torch = python != NULL;
    int index = mt_gpu_bench_parse_device(device);
    if (index < 0 || strchr(script, '\'') || (python && strchr(python, '\''))) {
        fprintf(stderr, "op_overhead: --device: expected cpu or cuda[:N], got \"%s\"\n", device);
        return 2;
    }
    if (!mt_gpu_bench_have_device("op_overhead", index)) return MT_GPU_BENCH_NO_DEVICE;
    char gpu[320], torch_gpu[160] = "";
    mt_gpu_bench_device_name(index, gpu, sizeof gpu);
    mt_device dev = MT_CUDA(index);
    if (!setup(dev)) {
        fprintf(stderr, "op_overhead: setup on %s failed: %s\n", device, mt_last_error());
        teardown();
        return 1;
    }
    /* mixtape before and after torch, the better run counting (a busy spell on a shared
       host then does not land on one side only) */
    for (int pass = 0; pass < (torch ? 2 : 1); pass++) {
        for (int i = 0; i < N_OPS; i++) {
            tiny_op *o = &OPS[i];
            time_calls(o, dev, iters / 10 + 1, true); /* warm the caching allocator */
            for (int r = 0; r < reps * 20; r++)
                o->mt_us = fmin(o->mt_us, time_calls(o, dev, burst, false));
            for (int r = 0; r < reps; r++)
                o->mt_wall_us = fmin(o->mt_wall_us, time_calls(o, dev, iters, true));
        }
        if (torch && pass == 0 &&
            run_torch(python, script, device, iters, burst, reps, torch_gpu, sizeof torch_gpu) == 0)
            fprintf(stderr,
                    "op_overhead: no torch results (is PyTorch with CUDA installed for "
                    "%s?)\n",
                    python);
    }
    bool ok = mt_last_status() == MT_OK;
    for (int i = 0; i < N_OPS; i++) ok &= !isnan(OPS[i].mt_us) && !isnan(OPS[i].mt_wall_us);
    if (!ok) fprintf(stderr, "op_overhead: mixtape failed: %s\n", mt_last_error());
    print_results(gpu, iters, burst, reps, torch_gpu);
    teardown();
    return ok ? 0 : 1;
}

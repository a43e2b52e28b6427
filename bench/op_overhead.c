/* Per-op overhead of tiny eager ops, and the bandwidth of a large F32 add, side by side with
   PyTorch in one run.

   usage: op_overhead [--device cpu|cuda[:N]] [--iters N (calls per run)] [--reps N]
                      [--burst N (CUDA: calls per host-time burst, default 32)]
                      [--python PATH (with PyTorch)] [--no-torch] [path/to/op_overhead.py]

   --device cuda[:N]: tiny ops on a CUDA device instead, host time per call against PyTorch on
   the same device (bench/op_overhead_cuda.c; --iters defaults to 2000 there, --reps, the runs
   per op, to 10).

   Tiny ops are 8-element F32 tensors: the time is the library's fixed cost per call
   (validation, dispatch, allocation, autograd recording, scope bookkeeping), not arithmetic.
   The large add is 16M floats (64 MiB per operand); its bandwidth counts the bytes it moves
   (two reads, one write) and is compared with the best memcpy of the same size measured in
   the same program, single-threaded and split over the threads our kernels use. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench_util.h"
#include "mixtape.h"

int op_overhead_cuda(const char *device, int iters, int burst, int reps, const char *python,
                     const char *script);

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* wall clock for the multi-threaded bandwidth runs */
static double now_s(void) {
    return clock_s(CLOCK_MONOTONIC);
}
/* the calling thread's CPU time for the single-threaded tiny ops: on a shared machine it
   does not count the time other processes hold the core (PyTorch's side uses the same
   clock, time.thread_time) */
static double cpu_s(void) {
    return clock_s(CLOCK_THREAD_CPUTIME_ID);
}

#define REPS 30 /* runs per measurement; the best one counts */

static mt_tensor *a, *b, *ag, *bg;

static void add_nograd(int n) {
    for (int i = 0; i < n; i++) mt_release(mt_add(a, b));
}

static void add_grad(int n) {
    for (int i = 0; i < n; i++) mt_release(mt_add(ag, bg));
}

/* One training-step shape: forward, loss, backward, all inside a scope. */
static void mul_sum_backward(int n) {
    for (int i = 0; i < n; i++) {
        mt_scope_begin();
        mt_backward(mt_sum_all(mt_mul(ag, bg)), NULL);
        mt_scope_end();
    }
}

/* Best of `reps` short runs of the mean time per call, in microseconds: on a shared machine
   the minimum over many short runs is the number least disturbed by other processes. */
static double per_call_us(void (*fn)(int), int iters, int reps) {
    fn(iters / 10 + 1); /* warm caches and the allocator */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s();
        fn(iters);
        double us = (cpu_s() - t0) / iters * 1e6;
        if (us < best) best = us;
    }
    return best;
}

/* ---- PyTorch side */
typedef struct {
    char version[64];
    double add_nograd, add_grad, step, large_add, large_add_out;
    bool ok;
} torch_results;

static torch_results run_torch(const char *python, const char *script, int iters) {
    torch_results r = {0};
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s %d %d %d 2>&1", python, script, iters, mt_get_num_threads(),
             REPS);
    FILE *p = popen(cmd, "r");
    if (!p) return r;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, p)) {
        char key[64];
        double v;
        if (sscanf(line, "torch_version %63s", r.version) == 1) continue;
        if (sscanf(line, "%63s %lf", key, &v) != 2) {
            fprintf(stderr, "torch: %s", line);
            continue;
        }
        if (!strcmp(key, "add_nograd_us"))
            r.add_nograd = v, found++;
        else if (!strcmp(key, "add_grad_us"))
            r.add_grad = v, found++;
        else if (!strcmp(key, "mul_sum_backward_us"))
            r.step = v, found++;
        else if (!strcmp(key, "large_add_gbs"))
            r.large_add = v, found++;
        else if (!strcmp(key, "large_add_out_gbs"))
            r.large_add_out = v, found++;
    }
    r.ok = pclose(p) == 0 && found == 5;
    return r;
}

/* ---- bandwidth */
static double memcpy_once(char *dst, const char *src, size_t bytes, int threads) {
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t per = (bytes / (size_t)nt + 4095) & ~(size_t)4095;
        size_t lo = per * (size_t)id, hi = lo + per < bytes ? lo + per : bytes;
        if (lo < hi) memcpy(dst + lo, src + lo, hi - lo);
    }
    return now_s() - t0;
}

typedef struct {
    double copy1, copyn, add; /* GB/s: memcpy on 1 and on n threads, our add */
} bandwidth;

/* Rounds of memcpy (1 thread, n threads) and mt_add, interleaved so that all three see the
   same machine; the best round of each counts. The add's output comes from the block cache
   after the first call, like a training loop's activations. */
static bandwidth measure_bandwidth(int rounds) {
    bandwidth r = {0};
    const int64_t n = 16 << 20;
    const size_t bytes = (size_t)n * sizeof(float);
    mt_tensor *x = mt_rand(MT_SHAPE(n), MT_F32, MT_CPU), *y = mt_rand(MT_SHAPE(n), MT_F32, MT_CPU);
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!x || !y || !src || !dst) {
        fprintf(stderr, "bandwidth: out of memory\n");
        goto done;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    mt_release(mt_add(x, y));
    int threads = mt_get_num_threads();
    double t1 = 1e30, tn = 1e30, ta = 1e30;
    for (int i = 0; i < rounds; i++) {
        double t = memcpy_once(dst, src, bytes, 1);
        t1 = t < t1 ? t : t1;
        t = memcpy_once(dst, src, bytes, threads);
        tn = t < tn ? t : tn;
        double t0 = now_s();
        mt_tensor *z = mt_add(x, y);
        t = now_s() - t0;
        mt_release(z);
        ta = t < ta ? t : ta;
    }
    r.copy1 = 2.0 * (double)bytes / t1 / 1e9; /* one read, one write */
    r.copyn = 2.0 * (double)bytes / tn / 1e9;
    r.add = 3.0 * (double)bytes / ta / 1e9; /* two reads, one write */
done:
    free(src);
    free(dst);
    mt_release(x);
    mt_release(y);
    return r;
}

static void row(const char *name, double ours, double torch, bool have_torch) {
    if (have_torch)
        printf("%-34s %10.3f %10.3f %9.1fx\n", name, ours, torch, torch / ours);
    else
        printf("%-34s %10.3f %10s %10s\n", name, ours, "-", "-");
}

static void usage(FILE *f) {
    fprintf(f, "usage: op_overhead [--device cpu|cuda[:N]] [--iters N (calls per run, >= 10)] "
               "[--reps N]\n"
               "                   [--burst N (CUDA: calls per host-time burst, default 32)]\n"
               "                   [--python PATH (with PyTorch)] [--no-torch] "
               "[path/to/op_overhead.py]\n");
}

/* The PyTorch script argument: a .py path, or a file that is there. Anything else is a
   mistyped option or value, not a script to hand to python. */
static bool is_script(const char *arg) {
    size_t n = strlen(arg);
    return arg[0] != '-' && ((n > 3 && strcmp(arg + n - 3, ".py") == 0) || access(arg, R_OK) == 0);
}

int main(int argc, char **argv) {
    int iters = 0, reps = 10; /* calls per run (20000; CUDA 2000); runs per op (CUDA) */
    int burst = 32;           /* CUDA: calls per host-time burst (bench/op_overhead_cuda.c) */
    bool want_torch = true;
    const char *device = "cpu", *python = MT_TORCH_PYTHON;
    /* the PyTorch script: from the repository root (build/bench/op_overhead) or from the
       build directory (bench/op_overhead), unless given */
    const char *script = access("bench/op_overhead.py", R_OK) == 0 ? "bench/op_overhead.py"
                                                                   : "../bench/op_overhead.py";
    const char *who = "op_overhead";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes_value = !strcmp(a, "--iters") || !strcmp(a, "--burst") || !strcmp(a, "--reps") ||
                           !strcmp(a, "--python") || !strcmp(a, "--device");
        if (mt_bench_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (takes_value && !v) {
            fprintf(stderr, "%s: %s needs a value\n", who, a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--iters")) {
            if (!mt_bench_parse_int(who, a, argv[++i], 10, 100000000, &iters)) return 2;
        } else if (!strcmp(a, "--burst")) {
            if (!mt_bench_parse_int(who, a, argv[++i], 1, 1000000, &burst)) return 2;
        } else if (!strcmp(a, "--reps")) {
            if (!mt_bench_parse_int(who, a, argv[++i], 1, 100000, &reps)) return 2;
        } else if (!strcmp(a, "--python")) {
            python = argv[++i];
        } else if (!strcmp(a, "--device")) {
            device = argv[++i];
        } else if (!strcmp(a, "--no-torch")) {
            want_torch = false;
        } else if (is_script(a)) {
            script = a;
        } else {
            fprintf(stderr, "%s: %s \"%s\"\n", who,
                    a[0] == '-' ? "unknown option" : "not an option nor a .py script", a);
            usage(stderr);
            return 2;
        }
    }
    if (iters == 0) iters = strcmp(device, "cpu") != 0 ? 2000 : 20000;
    if (strcmp(device, "cpu") != 0)
        return op_overhead_cuda(device, iters, burst, reps, want_torch ? python : NULL, script);

    a = mt_rand(MT_SHAPE(8), MT_F32, MT_CPU);
    b = mt_rand(MT_SHAPE(8), MT_F32, MT_CPU);
    ag = mt_rand(MT_SHAPE(8), MT_F32, MT_CPU);
    bg = mt_rand(MT_SHAPE(8), MT_F32, MT_CPU);
    mt_set_requires_grad(ag, true);
    mt_set_requires_grad(bg, true);
    if (mt_last_status() != MT_OK) {
        fprintf(stderr, "setup failed: %s\n", mt_last_error());
        return 1;
    }

    /* mixtape's tiny ops are measured before and after PyTorch's, and the better of the two
       counts, so a busy spell on a shared machine does not land on one side only */
    double us_add = per_call_us(add_nograd, iters, REPS);
    double us_add_grad = per_call_us(add_grad, iters, REPS);
    double us_step = per_call_us(mul_sum_backward, iters / 4, REPS);
    bandwidth bw = measure_bandwidth(15);
    torch_results t = {0};
    if (want_torch) {
        t = run_torch(python, script, iters / 10);
        if (!t.ok) fprintf(stderr, "PyTorch side failed (%s %s); mixtape only\n", python, script);
        double u = per_call_us(add_nograd, iters, REPS);
        us_add = u < us_add ? u : us_add;
        u = per_call_us(add_grad, iters, REPS);
        us_add_grad = u < us_add_grad ? u : us_add_grad;
        u = per_call_us(mul_sum_backward, iters / 4, REPS);
        us_step = u < us_step ? u : us_step;
    }
    if (mt_last_status() != MT_OK) {
        fprintf(stderr, "mixtape failed: %s\n", mt_last_error());
        return 1;
    }
    int threads = mt_get_num_threads();
    double copy = bw.copy1 > bw.copyn ? bw.copy1 : bw.copyn;

    printf("per-op overhead, 8-element F32 tensors, microseconds of thread CPU time per call "
           "(best of %d runs)\n",
           REPS);
    if (t.ok) printf("torch %s, 1 thread\n", t.version);
    printf("%-34s %10s %10s %10s\n", "", "mixtape", "torch", "ratio");
    row("add, no autograd", us_add, t.add_nograd, t.ok);
    row("add, recording (inputs need grad)", us_add_grad, t.add_grad, t.ok);
    row("mul + sum_all + backward (scope)", us_step, t.step, t.ok);
    printf("\nlarge contiguous F32 add, 16M elements (64 MiB per operand), %d threads\n", threads);
    printf(
        "memcpy 64 MiB: %.2f GB/s (1 thread), %.2f GB/s (%d threads); copy bandwidth %.2f GB/s\n",
        bw.copy1, bw.copyn, threads, copy);
    printf("mixtape add: %.2f GB/s moved (3 x 64 MiB / time) = %.0f%% of copy bandwidth\n", bw.add,
           100.0 * bw.add / copy);
    if (t.ok)
        printf("torch add:   %.2f GB/s (new output), %.2f GB/s (out=) = %.0f%% / %.0f%% of copy\n",
               t.large_add, t.large_add_out, 100.0 * t.large_add / copy,
               100.0 * t.large_add_out / copy);
    mt_release(a);
    mt_release(b);
    mt_release(ag);
    mt_release(bg);
    return mt_last_status() == MT_OK ? 0 : 1;
}

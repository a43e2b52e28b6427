/* SimpleNet side by side: mixtape (samples/simplenet_amp) and PyTorch (bench/simplenet.py),
 * the same network, sizes and loop, on the CPU (the default) or on one CUDA GPU
 * (--device cuda[:N], below), in the same run.
 *
 * Every (implementation, mode, thread count) runs in its own child process, so that each
 * resident-set figure is its own. The sweep runs --repeat times (default 3), mixtape and torch
 * interleaved round by round; for each mode the fastest (thread count, round) is reported.
 * Output: a Markdown table of the median step time (first step excluded) and memory, then
 * the ratios
 *   mixtape FP32 / torch FP32, mixtape O1-FP16 / mixtape FP32, mixtape O2-FP16 / mixtape FP32,
 *   torch BF16 autocast / mixtape O1-BF16.
 * Memory: "lib peak" is mixtape's own counter (mt_peak_bytes during the mode minus the data
 * set); "RSS growth" is ru_maxrss after training minus ru_maxrss after the data were made, for
 * both implementations (it also counts allocator caching and library pages first touched).
 *
 * --device cuda[:N]: the AMP guide's sizes by default (hidden 4096, batch 512, 50 batches x 5
 * epochs), --warmup steps (default 5) untimed on both sides. Each round runs every mixtape mode
 * in its own child process and all torch modes (CUDA autocast FP16 + GradScaler, model.half()
 * with FP32 master weights + GradScaler, autocast BF16, FP32; TF32 off on both sides) in one
 * child; ms/step is the mean between two device synchronizations (mt_synchronize,
 * torch.cuda.synchronize); for each mode the fastest round is reported. Memory: the GPU's
 * peak during the mode minus the data set (mixtape: mt_memory_stats_get; torch:
 * torch.cuda.max_memory_allocated minus torch.cuda.memory_allocated before the model).
 * Ratios: mixtape / torch ms per step and GPU peak for each mode, mixtape's AMP speedups over
 * its FP32, and torch's for reference.
 *
 * Usage: simplenet [--device cpu|cuda[:N]] [--hidden N] [--batch N] [--steps N] [--epochs N]
 *                  [--threads 1,2] [--warmup N] [--repeat N] [--python PATH] [--no-torch] */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_util.h"
#include "mixtape.h"

#ifndef MT_SIMPLENET_AMP
#define MT_SIMPLENET_AMP "samples/simplenet_amp"
#endif

enum { MAX_ROWS = 128 };

typedef struct {
    mt_bench_row h;
    double ms, loss;
    double lib_peak, rss; /* bytes; NAN when not measured */
    double syncs;         /* host syncs per timed step (mixtape); NAN when not reported */
} row;

typedef struct {
    row rows[MAX_ROWS];
    int n;
    char gpu[128]; /* the GPU's name, as torch reported it */
} table;

/* A row from a child's JSON line (mt_bench_run_child's add). */
typedef struct {
    table *t;
    const char *impl;
} adding;

static bool add_row(const char *line, void *ctx) {
    adding *a = ctx;
    table *t = a->t;
    if (t->n == MAX_ROWS) return false;
    row *r = &t->rows[t->n];
    *r = (row){.lib_peak = NAN, .rss = NAN, .syncs = NAN};
    if (!mt_bench_row_parse(line, a->impl, &r->h)) return false;
    /* The median step resists other processes on a shared machine; the mean is the
       fallback (GPU runs, which time whole runs only). */
    r->ms = mt_bench_json_num(line, "ms_median");
    if (!isfinite(r->ms)) r->ms = mt_bench_json_num(line, "ms_per_step");
    r->loss = mt_bench_json_num(line, "loss");
    r->rss = mt_bench_json_num(line, "rss_delta_bytes");
    double peak = mt_bench_json_num(line, "peak_bytes"),
           data = mt_bench_json_num(line, "data_bytes");
    if (isfinite(peak) && isfinite(data)) r->lib_peak = peak - data;
    r->syncs = mt_bench_json_num(line, "host_syncs_per_step");
    if (!t->gpu[0]) mt_bench_json_get(line, "gpu", t->gpu, sizeof t->gpu);
    t->n++;
    return true;
}

/* Runs cmd (stderr joined to stdout) and adds a row per JSON line; when the command fails
   without any, adds one row for `mode` that carries its last message. Returns rows added. */
static int run_json(const char *cmd, const char *impl, const char *mode, table *t) {
    mt_bench_child ch;
    adding a = {t, impl};
    if (!mt_bench_run_child("simplenet bench", cmd, impl, mode, add_row, &a, &ch)) return 0;
    if (ch.status != 0 && ch.added == 0 && mode && t->n < MAX_ROWS) {
        row *r = &t->rows[t->n++];
        *r = (row){.lib_peak = NAN, .rss = NAN, .syncs = NAN};
        mt_bench_row_failed(&r->h, impl, mode, ch.last_msg);
        ch.added++;
    }
    return ch.added;
}

/* The fastest supported row of impl/mode, or an unsupported one to explain why, or NULL. */
static const row *best(const table *t, const char *impl, const char *mode) {
    const row *b = NULL, *why = NULL;
    for (int i = 0; i < t->n; i++) {
        const row *r = &t->rows[i];
        if (!mt_bench_row_is(&r->h, impl, mode)) continue;
        if (!r->h.supported) {
            why = r;
        } else if (isfinite(r->ms) && (!b || r->ms < b->ms)) {
            b = r;
        }
    }
    return b ? b : why;
}

static void print_mib(double bytes) {
    if (isfinite(bytes))
        printf(" %.1f |", bytes / (1 << 20));
    else
        printf(" - |");
}

static void print_ratio(const char *what, const row *num, const row *den, const char *meaning) {
    printf("| %s |", what);
    if (num && den && num->h.supported && den->h.supported && den->ms > 0)
        printf(" %.2f | %s |\n", num->ms / den->ms, meaning);
    else
        printf(" - | not measured |\n");
}

/* Ratio of the two rows' peak memory (lib peak: data set excluded). */
static void print_mem_ratio(const char *what, const row *num, const row *den) {
    printf("| %s |", what);
    if (num && den && num->h.supported && den->h.supported && isfinite(num->lib_peak) &&
        isfinite(den->lib_peak) && den->lib_peak > 0)
        printf(" %.2f | < 1: mixtape uses less |\n", num->lib_peak / den->lib_peak);
    else
        printf(" - | not measured |\n");
}

/* --device cuda: mixtape and torch on the same GPU, same sizes, same warm-up. */
static int run_cuda(const char *device, long hidden, long batch, long steps, long epochs,
                    long warmup, long repeat, const char *python, const char *sample, bool torch) {
    static table t;
    char sizes[160], cmd[2048];
    snprintf(sizes, sizeof sizes, "--hidden %ld --batch %ld --steps %ld --epochs %ld --warmup %ld",
             hidden, batch, steps, epochs, warmup);
    printf("SimpleNet on %s: 3 x Linear(%ld, %ld), ReLU, MSE, SGD; batch %ld; %ld batches x %ld "
           "epochs; %ld warm-up step(s) untimed; best of %ld round(s)\n\n",
           device, hidden, hidden, batch, steps, epochs, warmup, repeat);
    fflush(stdout);
    const char *modes[] = {"fp32", "o1-fp16", "o2-fp16", "o1-bf16"};
    const char *labels[] = {"FP32", "AMP-O1 FP16", "AMP-O2 FP16", "AMP-O1 BF16"};
    enum { NM = 4 };
    for (long round = 1; round <= repeat; round++) {
        for (int m = 0; m < NM; m++) {
            snprintf(cmd, sizeof cmd, "'%s' --json --device %s --modes %s %s", sample, device,
                     modes[m], sizes);
            fprintf(stderr, "round %ld/%ld: mixtape %s on %s...\n", round, repeat, modes[m],
                    device);
            run_json(cmd, "mixtape", modes[m], &t);
        }
        if (torch) {
            snprintf(cmd, sizeof cmd,
                     "'%s' '%s/simplenet.py' --device %s --modes fp32,o1-fp16,o2-fp16,o1-bf16 %s",
                     python, MT_BENCH_DIR, device, sizes);
            fprintf(stderr, "round %ld/%ld: torch fp32, o1-fp16, o2-fp16, o1-bf16 on %s...\n",
                    round, repeat, device);
            if (run_json(cmd, "torch", NULL, &t) == 0)
                fprintf(stderr,
                        "simplenet bench: no torch results (is PyTorch with CUDA installed for "
                        "%s?)\n",
                        python);
        }
    }
    if (t.gpu[0]) printf("GPU: %s\n\n", t.gpu);
    printf("| implementation | mode | ms/step (mean) | final loss | GPU peak MiB (data excluded) "
           "| host syncs/step |\n|---|---|---|---|---|---|\n");
    const char *impls[] = {"mixtape", "torch"};
    for (int k = 0; k < 2; k++) {
        for (int m = 0; m < NM; m++) {
            const row *r = best(&t, impls[k], modes[m]);
            if (!r) continue;
            if (!r->h.supported) {
                printf("| %s | %s | %s | | | |\n", r->h.impl, modes[m], r->h.reason);
                continue;
            }
            printf("| %s | %s | %.3f | %.6g |", r->h.impl, labels[m], r->ms, r->loss);
            print_mib(r->lib_peak);
            if (isfinite(r->syncs))
                printf(" %.2f |\n", r->syncs);
            else
                printf(" - |\n");
        }
    }
    printf("\n| ratio | value | meaning |\n|---|---|---|\n");
    char what[128];
    for (int m = 0; m < NM; m++) {
        snprintf(what, sizeof what, "ms/step mixtape / torch, %s", labels[m]);
        print_ratio(what, best(&t, "mixtape", modes[m]), best(&t, "torch", modes[m]),
                    "< 1: mixtape faster");
    }
    const row *mf = best(&t, "mixtape", "fp32"), *tf = best(&t, "torch", "fp32");
    for (int m = 1; m < NM; m++) {
        snprintf(what, sizeof what, "mixtape %s speedup over mixtape FP32 (FP32 / %s ms)",
                 labels[m], labels[m]);
        print_ratio(what, mf, best(&t, "mixtape", modes[m]), "> 1: AMP faster than FP32");
    }
    for (int m = 1; m < NM; m++) {
        snprintf(what, sizeof what, "torch %s speedup over torch FP32 (reference)", labels[m]);
        print_ratio(what, tf, best(&t, "torch", modes[m]), "> 1: AMP faster than FP32");
    }
    for (int m = 0; m < NM; m++) {
        snprintf(what, sizeof what, "GPU peak mixtape / torch, %s", labels[m]);
        print_mem_ratio(what, best(&t, "mixtape", modes[m]), best(&t, "torch", modes[m]));
    }
    /* Exit status 1 when a mode did not run on either side (what a GPU test run checks). */
    int missing = 0;
    for (int k = 0; k < (torch ? 2 : 1); k++)
        for (int m = 0; m < NM; m++) {
            const row *r = best(&t, impls[k], modes[m]);
            if (!r || !r->h.supported) missing++;
        }
    if (missing) printf("\n%d (implementation, mode) pair(s) did not run.\n", missing);
    return missing ? 1 : 0;
}

/* The CPU run: rounds that interleave mixtape and torch so both see the same neighbours on
   a shared machine (each configuration reports its best round), into t. */
static void run_cpu_rounds(const char *sample, const char *python, const char *threads,
                           const char *sizes, long repeat, bool torch, table *t) {
    static const char *const modes[] = {"fp32", "o1-fp16", "o2-fp16", "o1-bf16"};
    char cmd[2048];
    for (long round = 1; round <= repeat; round++) {
        char tl[64];
        snprintf(tl, sizeof tl, "%s", threads);
        for (char *save = NULL, *th = strtok_r(tl, ",", &save); th;
             th = strtok_r(NULL, ",", &save)) {
            for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
                snprintf(cmd, sizeof cmd, "'%s' --json --device cpu --threads %s --modes %s %s",
                         sample, th, modes[m], sizes);
                fprintf(stderr, "round %ld/%ld: mixtape %s, %s thread(s)...\n", round, repeat,
                        modes[m], th);
                run_json(cmd, "mixtape", modes[m], t);
            }
        }
        if (!torch) continue;
        snprintf(cmd, sizeof cmd,
                 "'%s' '%s/simplenet.py' --threads %s --modes fp32,o1-fp16,o1-bf16 %s", python,
                 MT_BENCH_DIR, threads, sizes);
        fprintf(stderr, "round %ld/%ld: torch fp32, o1-fp16, o1-bf16 for thread counts %s...\n",
                round, repeat, threads);
        if (run_json(cmd, "torch", NULL, t) == 0)
            fprintf(stderr, "simplenet bench: no torch results (is PyTorch installed for %s?)\n",
                    python);
    }
}

/* The CPU tables: every configuration's best round, then the ratios. */
static void print_cpu_tables(const table *t) {
    printf("| implementation | mode | threads | ms/step (median) | final loss | lib peak MiB | RSS "
           "growth MiB |\n|---|---|---|---|---|---|---|\n");
    static const char *const impls[] = {"mixtape", "torch"};
    static const char *const mixtape_modes[] = {"fp32", "o1-fp16", "o2-fp16", "o1-bf16"};
    static const char *const torch_modes[] = {"fp32", "o1-fp16", "o1-bf16"};
    for (int k = 0; k < 2; k++) {
        const char *const *ms = k == 0 ? mixtape_modes : torch_modes;
        int nm = k == 0 ? 4 : 3;
        for (int m = 0; m < nm; m++) {
            const row *r = best(t, impls[k], ms[m]);
            if (!r) continue;
            if (!r->h.supported) {
                printf("| %s | %s | - | %s | | | |\n", r->h.impl, r->h.mode, r->h.reason);
                continue;
            }
            printf("| %s | %s | %d | %.2f | %.6g |", r->h.impl, r->h.mode, r->h.threads, r->ms,
                   r->loss);
            print_mib(r->lib_peak);
            print_mib(r->rss);
            printf("\n");
        }
    }
    const row *mf = best(t, "mixtape", "fp32"), *m1 = best(t, "mixtape", "o1-fp16");
    const row *m2 = best(t, "mixtape", "o2-fp16"), *mb = best(t, "mixtape", "o1-bf16");
    const row *tf = best(t, "torch", "fp32"), *tb = best(t, "torch", "o1-bf16");
    printf("\n| ratio of median ms/step | value | meaning |\n|---|---|---|\n");
    print_ratio("mixtape FP32 / torch FP32", mf, tf, "< 1: mixtape faster");
    print_ratio("mixtape AMP-O1 FP16 / mixtape FP32", m1, mf, "< 1: AMP faster than FP32");
    print_ratio("mixtape AMP-O2 FP16 / mixtape FP32", m2, mf, "< 1: AMP faster than FP32");
    print_ratio("torch BF16 autocast / mixtape AMP-O1 BF16", tb, mb, "> 1: mixtape faster");
}

/* "cuda" or "cuda:N" */
static bool is_cuda_device(const char *device) {
    return strncmp(device, "cuda", 4) == 0 &&
           (device[4] == 0 || (device[4] == ':' && device[5] &&
                               strspn(device + 5, "0123456789") == strlen(device + 5)));
}

int main(int argc, char **argv) {
    long hidden = 0, batch = 0, steps = 0, epochs = 0, warmup = -1; /* 0, -1: the default */
    long repeat = 3;
    const char *threads = "1,2", *python = MT_TORCH_PYTHON, *sample = MT_SIMPLENET_AMP;
    const char *device = "cpu";
    bool torch = true;
    /* The ranges of samples/simplenet_amp's options (--repeat: the bench's own). */
    const mt_bench_opt opts[] = {
        {"--hidden", &hidden, .lo = 1, .hi = 1 << 16},
        {"--batch", &batch, .lo = 1, .hi = 1 << 20},
        {"--steps", &steps, .lo = 1, .hi = 1 << 20},
        {"--epochs", &epochs, .lo = 1, .hi = 1 << 20},
        {"--warmup", &warmup, .lo = 0, .hi = 1 << 20},
        {"--repeat", &repeat, .lo = 1, .hi = 8},
        {"--threads", .word = &threads},
        {"--device", .word = &device},
        {"--python", .word = &python},
        {"--no-torch", .clear = &torch},
    };
    int rc =
        mt_bench_opts_parse(argc, argv, opts, (int)(sizeof opts / sizeof *opts), "simplenet bench");
    if (rc == MT_BENCH_OPTS_HELP || rc == MT_BENCH_OPTS_MISSING)
        fprintf(rc == MT_BENCH_OPTS_HELP ? stdout : stderr,
                "usage: simplenet [--device cpu|cuda[:N]] [--hidden N] [--batch N] "
                "[--steps N] [--epochs N] [--threads 1,2] [--warmup N] [--repeat N] "
                "[--python PATH] [--no-torch]\n");
    if (rc == MT_BENCH_OPTS_HELP) return 0;
    if (rc) return 2;
    bool cuda = is_cuda_device(device);
    if (!cuda && strcmp(device, "cpu") != 0) {
        fprintf(stderr, "simplenet bench: --device: expected cpu or cuda[:N], got \"%s\"\n",
                device);
        return 2;
    }
    /* The AMP guide's sizes on a GPU; the CPU's scaled-down run as before. */
    hidden = hidden ? hidden : (cuda ? 4096 : 1024);
    batch = batch ? batch : (cuda ? 512 : 256);
    steps = steps ? steps : (cuda ? 50 : 10);
    epochs = epochs ? epochs : (cuda ? 5 : 2);
    if (warmup < 0) warmup = cuda ? 5 : 1;
    if (cuda && warmup >= steps * epochs) {
        fprintf(stderr, "simplenet bench: --warmup must be below --steps x --epochs\n");
        return 2;
    }
    if (!mt_bench_thread_list_ok(threads)) {
        fprintf(stderr,
                "simplenet bench: --threads: expected a comma list of thread counts (1..4096), "
                "got \"%s\"\n",
                threads);
        return 2;
    }
    if (!mt_bench_safe_for_shell(python) || !mt_bench_safe_for_shell(sample)) {
        fprintf(stderr, "simplenet bench: paths with quotes are not supported\n");
        return 2;
    }
    if (access(sample, X_OK) != 0) {
        fprintf(stderr, "simplenet bench: %s not found; build it first (ninja -C <build dir>)\n",
                sample);
        return 1;
    }
    if (cuda)
        return run_cuda(device, hidden, batch, steps, epochs, warmup, repeat, python, sample,
                        torch);
    if (warmup != 1) {
        fprintf(stderr, "simplenet bench: --warmup is for --device cuda (the CPU runs time all "
                        "but the first step)\n");
        return 2;
    }
    static table t;
    char sizes[128];
    snprintf(sizes, sizeof sizes, "--hidden %ld --batch %ld --steps %ld --epochs %ld", hidden,
             batch, steps, epochs);
    printf("SimpleNet on the CPU: 3 x Linear(%ld, %ld), ReLU, MSE, SGD; batch %ld; %ld batches x "
           "%ld epochs; first step untimed; threads tried: %s; %ld cores online\n\n",
           hidden, hidden, batch, steps, epochs, threads, sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    run_cpu_rounds(sample, python, threads, sizes, repeat, torch, &t);
    print_cpu_tables(&t);
    /* Exit status 1 when a mode of mixtape did not run at all (every child failed): a table of
       dashes is no measurement. torch's rows do not count (PyTorch may be absent). */
    static const char *const modes[] = {"fp32", "o1-fp16", "o2-fp16", "o1-bf16"};
    int missing = 0;
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        const row *r = best(&t, "mixtape", modes[m]);
        if (!r || !r->h.supported) missing++;
    }
    if (missing) printf("\n%d mode(s) of mixtape did not run.\n", missing);
    return missing ? 1 : 0;
}

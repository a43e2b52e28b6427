/* ResNet side by side on the CPU or a CUDA GPU: mixtape (samples/resnet_amp) and PyTorch
 * (bench/resnet.py), the same architecture (ResNet-18 or -50, channels-last), sizes, synthetic
 * batch, loss and optimizer, in the same run.
 *
 * Every (implementation, mode, thread count) runs in its own child process. The sweep runs
 * --repeat times (default 3), mixtape and torch interleaved round by round so both see the
 * same neighbours on a shared machine; for each mode the fastest (thread count, round) is
 * reported, from the median step time (first step untimed). Output: a Markdown table of
 * images/s per implementation and mode, then the ratios
 *   mixtape / torch images/s for FP32 and for BF16 autocast (the goal: >= 1),
 *   mixtape's AMP modes over its FP32, torch's BF16 over its FP32 (reference).
 * Then the same comparison in CPU time (each child times its steps in process CPU time too):
 * the 1-thread rows, mixtape / torch CPU ms per step, a figure that other processes on a shared
 * machine skew far less than the wall clock.
 * torch 1.13 has no FP16 autocast on the CPU: its o1-fp16 row says so; mixtape's FP16 modes
 * run there but compute in FP32 (FP16 is a storage format on a CPU).
 *
 * --device cuda: every mode once per round (no thread counts), by default ResNet-50, batch
 * 128, 224x224, 30 steps of which the first 5 are untimed (cuDNN's algorithm choice, the
 * caching allocator); images/s is the mean over the timed steps between two synchronizations
 * (a GPU step returns before the device has run it, so there is no per-step median). torch
 * runs FP32, autocast FP16 + GradScaler and autocast BF16 on CUDA (cudnn.benchmark on). torch
 * has no O2 in core: mixtape's AMP-O2 FP16 is compared with torch's AMP FP16 (autocast +
 * GradScaler), which is issue 9's GPU goal: O2 FP16 images/s >= PyTorch's channels_last AMP.
 * Without a CUDA build of torch the torch rows say so and mixtape's rows still print.
 *
 * Usage: resnet [--device cpu|cuda] [--arch resnet18|resnet50] [--batch N] [--image-size N]
 *               [--steps N] [--warmup N] [--threads 1,2] [--repeat N] [--python PATH]
 *               [--no-torch] */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_util.h"

#ifndef MT_RESNET_AMP
#define MT_RESNET_AMP "samples/resnet_amp"
#endif

enum { MAX_ROWS = 256, N_MODES = 4 };
static const char *MODES[N_MODES] = {"fp32", "o1-fp16", "o2-fp16", "o1-bf16"};
static const char *LABELS[N_MODES] = {"FP32", "AMP-O1 FP16", "AMP-O2 FP16 master weights",
                                      "AMP-O1 BF16"};

typedef struct {
    mt_bench_row h;
    double images_per_s, ms, loss_first, loss;
    double cpu_ms; /* the median step's process CPU time, all threads */
    double batch;
} row;

static row rows[MAX_ROWS];
static int n_rows;
/* On a GPU the rows carry the mean over the timed steps (there is no per-step median). */
static bool on_gpu;

/* A row from a child's JSON line (mt_bench_run_child's add); ctx is the implementation. */
static bool add_row(const char *line, void *impl) {
    if (n_rows == MAX_ROWS) return false;
    row *r = &rows[n_rows];
    *r = (row){0};
    if (!mt_bench_row_parse(line, impl, &r->h)) return false;
    /* the median step resists other processes on a shared machine */
    r->ms = mt_bench_json_num(line, on_gpu ? "ms_per_step" : "ms_median");
    r->images_per_s = mt_bench_json_num(line, on_gpu ? "images_per_s" : "images_per_s_median");
    r->cpu_ms = mt_bench_json_num(line, "cpu_ms_median");
    r->batch = mt_bench_json_num(line, "batch");
    r->loss_first = mt_bench_json_num(line, "loss_first");
    r->loss = mt_bench_json_num(line, "loss");
    if (r->h.supported && !(r->images_per_s > 0)) {
        r->h.supported = false;
        snprintf(r->h.reason, sizeof r->h.reason, "failed: no images/s in its output");
    }
    n_rows++;
    return true;
}

/* Runs cmd and adds a row per JSON line; a failed command without any adds one unsupported
   row for `mode` (when given) carrying its last message. */
static void run_json(const char *cmd, const char *impl, const char *mode) {
    mt_bench_child ch;
    if (!mt_bench_run_child("resnet bench", cmd, impl, mode, add_row, (void *)impl, &ch)) return;
    if (ch.status != 0 && ch.added == 0 && mode && n_rows < MAX_ROWS) {
        rows[n_rows] = (row){0};
        mt_bench_row_failed(&rows[n_rows++].h, impl, mode, ch.last_msg);
    }
}

/* The fastest supported row of impl/mode, else an unsupported one that says why, or NULL. */
static const row *best(const char *impl, const char *mode) {
    const row *b = NULL, *why = NULL;
    for (int i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        if (!mt_bench_row_is(&r->h, impl, mode)) continue;
        if (!r->h.supported)
            why = r;
        else if (!b || r->images_per_s > b->images_per_s)
            b = r;
    }
    return b ? b : why;
}

/* The 1-thread row of impl/mode with the least CPU time per step, or NULL. */
static const row *best_cpu(const char *impl, const char *mode) {
    const row *b = NULL;
    for (int i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        if (!mt_bench_row_is(&r->h, impl, mode) || !r->h.supported || r->h.threads != 1 ||
            !(r->cpu_ms > 0))
            continue;
        if (!b || r->cpu_ms < b->cpu_ms) b = r;
    }
    return b;
}

/* CPU time per step on one thread: what a step costs whatever else the machine runs. */
static void print_cpu_table(void) {
    printf("\n| implementation | mode | CPU ms/step (1 thread, median) | images per CPU-second "
           "|\n|---|---|---|---|\n");
    const char *impls[] = {"mixtape", "torch"};
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < N_MODES; m++) {
            const row *r = best_cpu(impls[k], MODES[m]);
            if (r)
                printf("| %s | %s | %.1f | %.2f |\n", r->h.impl, LABELS[m], r->cpu_ms,
                       1e3 * r->batch / r->cpu_ms);
        }
}

/* torch's CPU ms per step over mixtape's (1 thread): above 1 mixtape needs less. torch_ran:
   torch was run (not --no-torch), so a missing row of it lacks a 1-thread measurement. */
static double print_cpu_ratio(const char *what, const row *mixtape, const row *torch,
                              bool torch_ran) {
    printf("| %s |", what);
    if (!mixtape || !torch) {
        printf(" - | not measured (%s) |\n", !mixtape     ? "no 1-thread mixtape row"
                                             : !torch_ran ? "torch not run: --no-torch"
                                                          : "no 1-thread torch row");
        return NAN;
    }
    double v = torch->cpu_ms / mixtape->cpu_ms;
    printf(" %.2f | >= 1: mixtape needs as little CPU time or less |\n", v);
    return v;
}

static bool measured(const row *r) {
    return r && r->h.supported;
}

/* num / den images/s; returns NAN when either is missing. */
static double print_ratio(const char *what, const row *num, const row *den, const char *meaning) {
    printf("| %s |", what);
    if (!measured(num) || !measured(den)) {
        printf(" - | not measured |\n");
        return NAN;
    }
    double v = num->images_per_s / den->images_per_s;
    printf(" %.2f | %s |\n", v, meaning);
    return v;
}

static void print_table(void) {
    printf("| implementation | mode | threads | images/s (%s) | ms/step (%s) | "
           "first loss | last loss |\n|---|---|---|---|---|---|---|\n",
           on_gpu ? "mean of the timed steps" : "median step", on_gpu ? "mean" : "median");
    const char *impls[] = {"mixtape", "torch"};
    for (int k = 0; k < 2; k++) {
        for (int m = 0; m < N_MODES; m++) {
            const row *r = best(impls[k], MODES[m]);
            if (!r) continue;
            if (!r->h.supported) {
                printf("| %s | %s | - | %s | | | |\n", r->h.impl, MODES[m], r->h.reason);
                continue;
            }
            char threads[16] = "-";
            if (!on_gpu) snprintf(threads, sizeof threads, "%d", r->h.threads);
            printf("| %s | %s | %s | %.2f | %.1f | %.4f | %.4f |\n", r->h.impl, LABELS[m], threads,
                   r->images_per_s, r->ms, r->loss_first, r->loss);
        }
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: resnet [--device cpu|cuda] [--arch resnet18|resnet50] [--batch N] "
               "[--image-size N] [--steps N] [--warmup N] [--threads 1,2] [--repeat N] "
               "[--python PATH] [--no-torch]\n"
               "  defaults: cpu resnet18, batch 16, image 64, 6 steps, warmup 1, 3 rounds; cuda "
               "resnet50, batch 128, image 224, 30 steps, warmup 5, 1 round\n");
}

typedef struct {
    const char *arch, *threads, *python, *sample, *device;
    long batch, image, steps, warmup, repeat; /* 0 (warmup -1): the device's default */
    bool torch;
} options;

/* The defaults of each device: a CPU run of seconds; on a GPU ResNet-50 at ImageNet size, a
   batch that fits an 80 GB H100 in FP32 with room to spare, a few minutes for every mode of
   both implementations. */
static void apply_defaults(options *o) {
    bool gpu = strcmp(o->device, "cuda") == 0;
    if (!o->arch) o->arch = gpu ? "resnet50" : "resnet18";
    if (!o->batch) o->batch = gpu ? 128 : 16;
    if (!o->image) o->image = gpu ? 224 : 64;
    if (!o->steps) o->steps = gpu ? 30 : 6;
    if (o->warmup < 0) o->warmup = gpu ? 5 : 1;
    if (!o->repeat) o->repeat = gpu ? 1 : 3;
}

/* Returns 0, or the exit status for bad options. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.threads = "1,2",
                   .python = MT_TORCH_PYTHON,
                   .sample = MT_RESNET_AMP,
                   .device = "cpu",
                   .warmup = -1,
                   .torch = true};
    /* The ranges of samples/resnet_amp's options (--steps >= 2: a first and a timed step;
       --repeat: the bench's own). */
    const mt_bench_opt opts[] = {
        {"--warmup", &o->warmup, .lo = 0, .hi = 1 << 20},
        {"--batch", &o->batch, .lo = 2, .hi = 1 << 16},
        {"--image-size", &o->image, .lo = 32, .hi = 1 << 12},
        {"--steps", &o->steps, .lo = 2, .hi = 1 << 20},
        {"--repeat", &o->repeat, .lo = 1, .hi = 8},
        {"--arch", .word = &o->arch},
        {"--device", .word = &o->device},
        {"--threads", .word = &o->threads},
        {"--python", .word = &o->python},
        {"--no-torch", .clear = &o->torch},
    };
    int rc =
        mt_bench_opts_parse(argc, argv, opts, (int)(sizeof opts / sizeof *opts), "resnet bench");
    if (rc == MT_BENCH_OPTS_HELP) {
        usage(stdout);
        exit(0);
    }
    if (rc) {
        usage(stderr);
        return 2;
    }
    if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0) {
        fprintf(stderr, "resnet bench: --device: expected cpu or cuda, got \"%s\"\n", o->device);
        return 2;
    }
    apply_defaults(o);
    if ((strcmp(o->arch, "resnet18") != 0 && strcmp(o->arch, "resnet50") != 0) || o->batch < 2 ||
        o->image < 32 || o->steps < 2 || o->warmup < 0 || o->warmup >= o->steps || o->repeat < 1 ||
        o->repeat > 8 || !mt_bench_thread_list_ok(o->threads)) {
        fprintf(stderr, "resnet bench: --arch resnet18|resnet50, --batch >= 2, --image-size >= "
                        "32, --steps >= 2, --warmup 0..steps-1, --repeat 1..8, --threads a "
                        "comma list of thread counts (1..4096)\n");
        return 2;
    }
    if (!mt_bench_safe_for_shell(o->python) || !mt_bench_safe_for_shell(o->sample)) {
        fprintf(stderr, "resnet bench: paths with quotes are not supported\n");
        return 2;
    }
    if (access(o->sample, X_OK) != 0) {
        fprintf(stderr, "resnet bench: %s not found; build it first (ninja -C <build dir>)\n",
                o->sample);
        return 1;
    }
    return 0;
}

/* On a GPU: each round every mixtape mode once, then torch's (no thread counts there). */
static void run_rounds_gpu(const options *o, const char *sizes) {
    char cmd[2048];
    for (long round = 1; round <= o->repeat; round++) {
        for (int m = 0; m < N_MODES; m++) {
            snprintf(cmd, sizeof cmd, "'%s' --json --device cuda --modes %s %s", o->sample,
                     MODES[m], sizes);
            fprintf(stderr, "round %ld/%ld: mixtape %s on cuda...\n", round, o->repeat, MODES[m]);
            run_json(cmd, "mixtape", MODES[m]);
        }
        if (o->torch) {
            /* torch has no O2: its AMP FP16 row is what mixtape's O2 is compared with */
            snprintf(cmd, sizeof cmd,
                     "'%s' '%s/resnet.py' --device cuda --modes fp32,o1-fp16,o1-bf16 %s", o->python,
                     MT_BENCH_DIR, sizes);
            fprintf(stderr, "round %ld/%ld: torch fp32, o1-fp16, o1-bf16 on cuda...\n", round,
                    o->repeat);
            run_json(cmd, "torch", NULL);
        }
    }
}

/* --repeat rounds, each every mixtape mode and thread count, then torch's. */
static void run_rounds(const options *o) {
    char sizes[160], cmd[2048];
    snprintf(sizes, sizeof sizes, "--arch %s --batch %ld --image-size %ld --steps %ld --warmup %ld",
             o->arch, o->batch, o->image, o->steps, o->warmup);
    if (on_gpu) {
        run_rounds_gpu(o, sizes);
        return;
    }
    for (long round = 1; round <= o->repeat; round++) {
        char tl[64];
        snprintf(tl, sizeof tl, "%s", o->threads);
        for (char *save = NULL, *th = strtok_r(tl, ",", &save); th;
             th = strtok_r(NULL, ",", &save)) {
            for (int m = 0; m < N_MODES; m++) {
                snprintf(cmd, sizeof cmd, "'%s' --json --device cpu --threads %s --modes %s %s",
                         o->sample, th, MODES[m], sizes);
                fprintf(stderr, "round %ld/%ld: mixtape %s, %s thread(s)...\n", round, o->repeat,
                        MODES[m], th);
                run_json(cmd, "mixtape", MODES[m]);
            }
        }
        if (o->torch) {
            snprintf(cmd, sizeof cmd, "'%s' '%s/resnet.py' --threads %s %s", o->python,
                     MT_BENCH_DIR, o->threads, sizes);
            fprintf(stderr, "round %ld/%ld: torch fp32, o1-bf16, o1-fp16 for thread counts %s...\n",
                    round, o->repeat, o->threads);
            run_json(cmd, "torch", NULL);
        }
    }
}

/* Says so when no torch row was measured: why, from the first torch row. */
static void print_torch_unavailable(void) {
    for (int i = 0; i < n_rows; i++)
        if (strncmp(rows[i].h.impl, "torch", 5) == 0 && rows[i].h.supported) return;
    const char *why = "no output";
    for (int i = 0; i < n_rows; i++)
        if (strncmp(rows[i].h.impl, "torch", 5) == 0) {
            why = rows[i].h.reason;
            break;
        }
    printf("\nThe PyTorch side is unavailable here (%s): mixtape's rows only.\n", why);
}

/* mixtape's AMP modes over its FP32 (mf). */
static void print_amp_ratios(const row *mf) {
    for (int m = 1; m < N_MODES; m++) {
        char what[96];
        snprintf(what, sizeof what, "mixtape %s / mixtape FP32", LABELS[m]);
        print_ratio(what, best("mixtape", MODES[m]), mf, "> 1: faster than FP32");
    }
}

/* GPU: mixtape / torch per mode; the goal is mixtape's O2 against torch's AMP FP16. */
static void print_gpu_report(const options *o) {
    print_table();
    printf("\ntorch has no O2 (FP16 model, FP32 master weights) in core: its AMP FP16 row "
           "(autocast + GradScaler, channels_last) is the reference for mixtape's AMP-O2.\n");
    if (o->torch) print_torch_unavailable();
    printf("\n| ratio of images/s | value | meaning |\n|---|---|---|\n");
    const row *mf = best("mixtape", "fp32"), *tf = best("torch", "fp32");
    const row *t16 = best("torch", "o1-fp16"), *tb = best("torch", "o1-bf16");
    print_ratio("mixtape FP32 / torch FP32", mf, tf, ">= 1: mixtape as fast or faster");
    print_ratio("mixtape AMP-O1 FP16 / torch AMP FP16", best("mixtape", "o1-fp16"), t16,
                ">= 1: mixtape as fast or faster");
    double r2 = print_ratio("mixtape AMP-O2 FP16 / torch AMP FP16 (autocast + GradScaler)",
                            best("mixtape", "o2-fp16"), t16, ">= 1: the goal");
    print_ratio("mixtape AMP-O1 BF16 / torch BF16 autocast", best("mixtape", "o1-bf16"), tb,
                ">= 1: mixtape as fast or faster");
    print_amp_ratios(mf);
    print_ratio("torch AMP FP16 / torch FP32 (reference)", t16, tf, "> 1: faster than FP32");
    if (o->torch)
        printf("\nGoal (mixtape AMP-O2 FP16 images/s >= torch's channels_last AMP FP16): %s.\n",
               mt_bench_goal(r2, r2));
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    on_gpu = strcmp(o.device, "cuda") == 0;
    if (on_gpu) {
        printf("%s on CUDA, channels-last, synthetic batch %ldx3x%ldx%ld, 1000 classes, SGD "
               "momentum; %ld steps, the first %ld untimed; best of %ld round(s)\n\n",
               strcmp(o.arch, "resnet50") == 0 ? "ResNet-50" : "ResNet-18", o.batch, o.image,
               o.image, o.steps, o.warmup, o.repeat);
        fflush(stdout);
        run_rounds(&o);
        print_gpu_report(&o);
        /* exit status 1 when mixtape could not run FP32 or O2 FP16 */
        return measured(best("mixtape", "fp32")) && measured(best("mixtape", "o2-fp16")) ? 0 : 1;
    }
    char warm[32] = "the first";
    if (o.warmup != 1) snprintf(warm, sizeof warm, "the first %ld", o.warmup);
    printf("%s on the CPU, channels-last, synthetic batch %ldx3x%ldx%ld, 1000 classes, SGD "
           "momentum; %ld steps, %s untimed; threads tried: %s; best of %ld round(s); "
           "%ld cores online\n\n",
           strcmp(o.arch, "resnet50") == 0 ? "ResNet-50" : "ResNet-18", o.batch, o.image, o.image,
           o.steps, warm, o.threads, o.repeat, sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    run_rounds(&o);
    print_table();
    printf("\n| ratio of images/s | value | meaning |\n|---|---|---|\n");
    const row *mf = best("mixtape", "fp32"), *mb = best("mixtape", "o1-bf16");
    const row *tf = best("torch", "fp32"), *tb = best("torch", "o1-bf16");
    double r32 =
        print_ratio("mixtape FP32 / torch FP32", mf, tf, ">= 1: mixtape as fast or faster");
    double r16 = print_ratio("mixtape AMP-O1 BF16 / torch BF16 autocast", mb, tb,
                             ">= 1: mixtape as fast or faster");
    print_amp_ratios(mf);
    print_ratio("torch BF16 autocast / torch FP32 (reference)", tb, tf, "> 1: faster than FP32");
    if (o.torch)
        printf("\nGoal (FP32 and BF16 images/s >= torch's): %s.\n", mt_bench_goal(r32, r16));
    print_cpu_table();
    printf("\n| ratio of CPU time per step, 1 thread | value | meaning |\n|---|---|---|\n");
    double c32 = print_cpu_ratio("torch FP32 / mixtape FP32", best_cpu("mixtape", "fp32"),
                                 best_cpu("torch", "fp32"), o.torch);
    double c16 =
        print_cpu_ratio("torch BF16 autocast / mixtape AMP-O1 BF16", best_cpu("mixtape", "o1-bf16"),
                        best_cpu("torch", "o1-bf16"), o.torch);
    if (o.torch)
        printf("\nThe same goal in CPU time (1 thread; not skewed by other processes on a shared "
               "machine): %s.\n",
               mt_bench_goal(c32, c16));
    /* exit status 1 when mixtape could not run FP32 or BF16 */
    return measured(mf) && measured(mb) ? 0 : 1;
}

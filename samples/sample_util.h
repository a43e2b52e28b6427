/* What the samples share: clocks, the "print and exit" check of the library's status, option
   value parsers (the option tables: sample_opts.h), and the four AMP modes of simplenet_amp and
   resnet_amp. Each sample defines MT_SAMPLE_NAME (its program name, for messages) before including
   this header. */
#ifndef MT_SAMPLE_UTIL_H
#define MT_SAMPLE_UTIL_H
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "mixtape.h"
#include "read_long.h"

#ifndef MT_SAMPLE_NAME
#error "define MT_SAMPLE_NAME before including sample_util.h"
#endif

static inline double sample_clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double now_s(void) {
    return sample_clock_s(CLOCK_MONOTONIC);
}

/* CPU time of every thread of the process: unlike the wall clock, it does not count the time
   other processes on a shared machine hold the cores. */
static inline double cpu_s(void) {
    return sample_clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double median(double *v, int n) { /* sorts v */
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline void print_json_number(double v) {
    if (isfinite(v))
        printf("%.9g", v);
    else
        printf("null"); /* JSON has no inf/nan */
}

/* `, "key": value` for a JSON line. */
static inline void print_json_field(const char *key, double v) {
    printf(", \"%s\": ", key);
    print_json_number(v);
}

/* The library never prints or exits; a sample does both when something went wrong. */
static inline void check(const char *what) {
    if (mt_last_status() == MT_OK) return;
    if (isatty(STDERR_FILENO)) fputc('\n', stderr); /* end a progress line */
    fprintf(stderr, "%s: %s failed: %s (%s)\n", MT_SAMPLE_NAME, what, mt_last_error(),
            mt_status_name(mt_last_status()));
    exit(1);
}

/* check() for a file's load or save: the library's message names the file and the system's
   reason; its status (MT_ERR_INVALID, the library has no I/O status) would read as a bad
   argument, so it is left out. */
static inline void check_file(const char *what) {
    if (mt_last_status() == MT_OK) return;
    if (isatty(STDERR_FILENO)) fputc('\n', stderr); /* end a progress line */
    fprintf(stderr, "%s: %s: %s\n", MT_SAMPLE_NAME, what, mt_last_error());
    exit(1);
}

static inline long parse_long(const char *opt, const char *s, long lo, long hi) {
    long v;
    if (!read_long(s, lo, hi, &v)) {
        fprintf(stderr, "%s: %s: expected an integer in [%ld, %ld], got \"%s\"\n", MT_SAMPLE_NAME,
                opt, lo, hi, s);
        exit(2);
    }
    return v;
}

static inline double parse_double(const char *opt, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s: expected a number in [%g, %g], got \"%s\"\n", MT_SAMPLE_NAME, opt,
                lo, hi, s);
        exit(2);
    }
    return v;
}

/* --save PATH, at the start: exits when the checkpoint could not be written (PATH is a
   directory, its directory is missing or not writable), rather than after the whole run when
   the save fails. A cheap look, not a promise: the save still reports its own failure. */
static inline void check_save_path(const char *opt, const char *path) {
    struct stat st;
    const char *why = NULL;
    if (!path[0]) {
        why = "empty path";
    } else if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            why = "is a directory";
        else if (!S_ISREG(st.st_mode)) /* the library refuses it too, after the training */
            why = "is not a regular file (a device, FIFO or socket)";
        else if (access(path, W_OK) != 0)
            why = strerror(errno);
    }
    if (why) {
        fprintf(stderr, "%s: %s \"%s\": %s\n", MT_SAMPLE_NAME, opt, path, why);
        exit(2);
    }
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1; /* "/x": "/" */
    char *dir = malloc(n + 1);
    if (!dir) exit(1);
    memcpy(dir, slash ? path : ".", n);
    dir[n] = 0;
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "%s: %s \"%s\": cannot write in directory %s: %s\n", MT_SAMPLE_NAME, opt,
                path, dir, strerror(errno));
        free(dir);
        exit(2);
    }
    free(dir);
}

/* --resume PATH, at the start: exits when PATH is not a readable file, rather than after the
   table's header has been printed. The load still checks the file's contents. */
static inline void check_load_path(const char *opt, const char *path) {
    struct stat st;
    const char *why = NULL;
    if (!path[0])
        why = "empty path";
    else if (stat(path, &st) != 0 || access(path, R_OK) != 0)
        why = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "is a directory";
    else if (!S_ISREG(st.st_mode))
        why = "is not a regular file (a device, FIFO or socket)";
    if (why) {
        fprintf(stderr, "%s: %s \"%s\": %s\n", MT_SAMPLE_NAME, opt, path, why);
        exit(2);
    }
}

/* "cpu", "cuda" or "cuda:N" */
static inline mt_device parse_device(const char *s) {
    if (strcmp(s, "cpu") == 0) return MT_CPU;
    if (strncmp(s, "cuda", 4) == 0 && (s[4] == 0 || s[4] == ':'))
        return MT_CUDA(s[4] ? (int)parse_long("--device cuda:N", s + 5, 0, 63) : 0);
    fprintf(stderr, "%s: --device: expected cpu or cuda[:N], got \"%s\"\n", MT_SAMPLE_NAME, s);
    exit(2);
}

/* ---- the AMP modes of the timing samples */
typedef struct {
    const char *name;    /* as given to --modes and printed in JSON */
    const char *label;   /* for the table */
    mt_dtype low;        /* MT_F32: no autocast */
    mt_amp_level level;  /* autocast level */
    bool scaler;         /* FP16 needs loss scaling */
    bool master_weights; /* O2: low-precision parameters with FP32 masters in the optimizer */
} mode_spec;

static const mode_spec MODES[] = {
    {"fp32", "FP32", MT_F32, MT_AMP_O1, false, false},
    {"o1-fp16", "AMP-O1 FP16", MT_F16, MT_AMP_O1, true, false},
    {"o2-fp16", "AMP-O2 FP16 master weights", MT_F16, MT_AMP_O2, true, true},
    {"o1-bf16", "AMP-O1 BF16", MT_BF16, MT_AMP_O1, false, false},
};
enum { N_MODES = sizeof MODES / sizeof MODES[0] };

/* run[k] := mode k is in the comma list */
static inline void parse_modes(const char *list, bool *run) {
    memset(run, 0, N_MODES * sizeof *run);
    bool any = false;
    char *copy = strdup(list);
    if (!copy) exit(1);
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < N_MODES && strcmp(MODES[k].name, tok) != 0) k++;
        if (k == N_MODES) {
            fprintf(stderr,
                    "%s: --modes: unknown mode \"%s\" (known: fp32, o1-fp16, o2-fp16, o1-bf16)\n",
                    MT_SAMPLE_NAME, tok);
            exit(2);
        }
        run[k] = true;
        any = true;
    }
    free(copy);
    if (!any) { /* "" or ",": a run that trains nothing would look like a success */
        fprintf(stderr,
                "%s: --modes: expected at least one of fp32, o1-fp16, o2-fp16, o1-bf16, got "
                "\"%s\"\n",
                MT_SAMPLE_NAME, list);
        exit(2);
    }
}

/* --ddp's per-step trace of backward against the buckets' all-reduces, in ms from the start
   of mt_backward (mt_ddp_stats' times share the samples' CLOCK_MONOTONIC): backward's length,
   when bucket 0's all-reduce started and was seen complete, when the last one was, and how
   many all-reduces were seen complete before backward's last gradient hook returned. Each
   figure is the median over the traced (timed) steps. */
enum {
    DDP_TRACE_BACKWARD,
    DDP_TRACE_FIRST_START,
    DDP_TRACE_FIRST_DONE,
    DDP_TRACE_LAST_DONE,
    DDP_TRACE_DONE_IN_BACKWARD,
    DDP_TRACE_N
};
typedef struct {
    double *v[DDP_TRACE_N];
    int n, cap;
} ddp_trace;

static inline void ddp_trace_init(ddp_trace *t, int cap) {
    t->n = 0;
    t->cap = cap;
    for (int k = 0; k < DDP_TRACE_N; k++)
        if (!(t->v[k] = calloc((size_t)(cap > 0 ? cap : 1), sizeof(double)))) exit(1);
}

/* After mt_ddp_wait: backward ran from bw0 to bw1 (now_s()). */
static inline void ddp_trace_add(ddp_trace *t, mt_ddp *ddp, double bw0, double bw1) {
    mt_ddp_stats st;
    if (t->n >= t->cap || mt_ddp_stats_get(ddp, &st) < 0) return;
    double ms[DDP_TRACE_N] = {
        1e3 * (bw1 - bw0),
        st.first_start_time > 0 ? 1e3 * (st.first_start_time - bw0) : NAN,
        st.first_done_time > 0 ? 1e3 * (st.first_done_time - bw0) : NAN,
        st.last_done_time > 0 ? 1e3 * (st.last_done_time - bw0) : NAN,
        (double)st.done_in_backward,
    };
    for (int k = 0; k < DDP_TRACE_N; k++) t->v[k][t->n] = ms[k];
    t->n++;
}

static inline double ddp_trace_median(ddp_trace *t, int k) {
    return t->n ? median(t->v[k], t->n) : NAN;
}

static inline void ddp_trace_free(ddp_trace *t) {
    for (int k = 0; k < DDP_TRACE_N; k++) {
        free(t->v[k]);
        t->v[k] = NULL;
    }
    t->n = t->cap = 0;
}

/* `, "backward_ms": ..., ...` (the medians) for a JSON line. */
static inline void ddp_trace_print_json(ddp_trace *t) {
    static const char *const names[DDP_TRACE_N] = {
        "backward_ms", "first_allreduce_start_ms", "first_allreduce_done_ms",
        "last_allreduce_done_ms", "allreduce_done_before_backward_end"};
    for (int k = 0; k < DDP_TRACE_N; k++) print_json_field(names[k], ddp_trace_median(t, k));
}

/* --progress hooks|thread */
static inline mt_ddp_progress parse_progress(const char *s) {
    if (strcmp(s, "hooks") == 0) return MT_DDP_PROGRESS_HOOKS;
    if (strcmp(s, "thread") == 0) return MT_DDP_PROGRESS_THREAD;
    fprintf(stderr, "%s: --progress: expected hooks or thread, got \"%s\"\n", MT_SAMPLE_NAME, s);
    exit(2);
}

static inline const char *progress_name(mt_ddp_progress p) {
    return p == MT_DDP_PROGRESS_THREAD ? "thread" : "hooks";
}

/* ---- the --ddp options of simplenet_amp and resnet_amp (the rows: sample_opts.h) */

#define SAMPLE_DDP_USAGE                                                                           \
    "  --ddp            data parallel over the ranks of mpirun -np N\n"                            \
    "  --bucket-mb X    --ddp gradient bucket size in MiB (default 25)\n"                          \
    "  --per-param      --ddp: one all-reduce per parameter (no buckets)\n"                        \
    "  --no-overlap     --ddp: start the all-reduces after backward, not during it\n"              \
    "  --progress P     --ddp on the CPU: hooks (MPI tests from each gradient hook,\n"             \
    "                   default) or thread (a communication thread tests between naps)\n"

/* `, "rank": ..., "allreduce_calls_per_step": ...` and the trace, for a JSON line. */
static inline void print_ddp_json(const mt_ddp_stats *st, const mt_ddp_opts *opts,
                                  ddp_trace *trace) {
    printf(", \"rank\": %d, \"world_size\": %d, \"allreduce_calls_per_step\": %lld, "
           "\"buckets\": %d, \"allreduce_started_in_backward\": %lld, \"ddp_wait_ms\": %.4f, "
           "\"ddp_progress\": \"%s\", \"ddp_overlap\": %s",
           mt_dist_rank(), mt_dist_world_size(), (long long)st->allreduce_calls, st->buckets,
           (long long)st->started_in_backward, 1e3 * st->wait_seconds,
           progress_name(opts->progress), opts->no_overlap ? "false" : "true");
    if (trace) ddp_trace_print_json(trace);
}

/* ---- the training loop pieces of simplenet_amp and resnet_amp */

/* --threads and --ddp, at the start of main. */
static inline void sample_init(int threads, bool ddp) {
    if (threads > 0) mt_set_num_threads(threads);
    if (ddp) {
        mt_dist_init();
        check("mt_dist_init");
    }
}

/* The line that opens the table of a --ddp run. */
static inline void print_ddp_header(int64_t batch, const mt_ddp_opts *opts) {
    printf("data parallel: %d ranks, each batch %lld per rank, %s\n", mt_dist_world_size(),
           (long long)batch,
           opts->per_parameter ? "one all-reduce per parameter" : "gradient buckets (mt_ddp)");
}

/* The trace's medians, the end of a table's --ddp line. */
static inline void print_ddp_trace_text(ddp_trace *t) {
    printf("backward ends %.2f, bucket 0 starts %.2f, done %.2f, last done %.2f; %.0f done before "
           "backward's end\n",
           ddp_trace_median(t, DDP_TRACE_BACKWARD), ddp_trace_median(t, DDP_TRACE_FIRST_START),
           ddp_trace_median(t, DDP_TRACE_FIRST_DONE), ddp_trace_median(t, DDP_TRACE_LAST_DONE),
           ddp_trace_median(t, DDP_TRACE_DONE_IN_BACKWARD));
}

/* --ddp: rank 0's initial weights to every rank (mt_ddp_new) and the scaler's skip decision
   shared; trace holds up to steps traced steps. */
static inline mt_ddp *sample_ddp_new(mt_tensor *const *params, int n, const mt_ddp_opts *opts,
                                     mt_grad_scaler *scaler, ddp_trace *trace, int steps) {
    ddp_trace_init(trace, steps);
    mt_ddp *ddp = mt_ddp_new(params, n, opts);
    check("mt_ddp_new");
    if (scaler) mt_grad_scaler_set_dist(scaler, true);
    check("mt_grad_scaler_set_dist");
    return ddp;
}

/* The step after the forward pass: the (scaled) backward, --ddp's averaged gradients (and the
   trace of a traced step, tr not NULL), the (scaler's) optimizer step. */
static inline void sample_backward_step(mt_tensor *loss, mt_optimizer *opt, mt_grad_scaler *scaler,
                                        mt_ddp *ddp, ddp_trace *tr) {
    double bw0 = now_s();
    mt_backward(scaler ? mt_grad_scaler_scale(scaler, loss) : loss, NULL);
    double bw1 = now_s();
    if (ddp) mt_ddp_wait(ddp); /* averaged gradients before the (scaler's) step */
    if (ddp && tr) ddp_trace_add(tr, ddp, bw0, bw1);
    if (scaler)
        mt_grad_scaler_minimize(scaler, opt); /* unscale, skip on inf/nan, step, update scale */
    else
        mt_optimizer_step(opt);
    mt_optimizer_zero_grad(opt);
}

/* The sum of every parameter in FP64: equal on every rank while the replicas stay in sync. */
static inline double param_checksum(mt_tensor *const *params, int n) {
    double sum = 0;
    mt_scope_begin();
    for (int i = 0; i < n; i++) sum += mt_item(mt_sum_all(mt_cast(params[i], MT_F64)));
    mt_scope_end();
    return sum;
}

/* The end of a JSON line: `, "param_checksum": ...}`. */
static inline void print_json_checksum_end(double checksum) {
    print_json_field("param_checksum", checksum);
    printf("}\n");
    fflush(stdout);
}

/* After a mode: the tensors it made and did not release (tensors_before: mt_live_tensors()
   when it began). */
static inline void warn_live_tensors(const char *mode, int64_t tensors_before) {
    if (mt_live_tensors() != tensors_before)
        fprintf(stderr, "%s: warning: %s left %lld tensor(s) alive\n", MT_SAMPLE_NAME, mode,
                (long long)(mt_live_tensors() - tensors_before));
}

/* --device given, or cuda:0 when there is one, else the CPU; exits on a missing device. */
static inline mt_device resolve_device(bool given, mt_device dev) {
    if (!given && mt_cuda_available()) dev = MT_CUDA(0);
    if (dev.type == MT_DEVICE_CUDA && dev.index >= mt_cuda_device_count()) {
        fprintf(stderr, "%s: --device cuda:%d: %d CUDA device(s) available\n", MT_SAMPLE_NAME,
                dev.index, mt_cuda_device_count());
        exit(1);
    }
    return dev;
}

#endif

/* What the benchmarks share: the clock, the kernel benches' arguments, where the PyTorch side
   lives, and the children of the side-by-side benches (bench/simplenet, bench/resnet): running
   them and reading the flat JSON lines they print (one object per line, no nesting, no
   escapes) into rows. */
#ifndef MT_BENCH_UTIL_H
#define MT_BENCH_UTIL_H
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include "mixtape.h"
#include "../samples/read_long.h"

#ifndef MT_BENCH_DIR
#define MT_BENCH_DIR "bench"
#endif
#ifndef MT_TORCH_PYTHON
#define MT_TORCH_PYTHON "/usr/bin/python3"
#endif

static inline double mt_bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Copies the value of "key" (without quotes) into out; false when the line has no such key. */
static inline bool mt_bench_json_get(const char *line, const char *key, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return false;
    p += strlen(pat);
    while (*p == ' ') p++;
    const char *end;
    if (*p == '"') {
        end = strchr(++p, '"');
        if (!end) return false;
    } else {
        end = p + strcspn(p, ",}");
    }
    size_t n = (size_t)(end - p) < cap - 1 ? (size_t)(end - p) : cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
    return true;
}

/* The number under "key"; NAN when absent or null. */
static inline double mt_bench_json_num(const char *line, const char *key) {
    char buf[64];
    if (!mt_bench_json_get(line, key, buf, sizeof buf) || strcmp(buf, "null") == 0) return NAN;
    return strtod(buf, NULL);
}

/* read_long (samples/read_long.h) for an int; after "<who>: <opt>: expected an integer in [lo, hi],
   got "s"" on stderr when it is not one. */
static inline bool mt_bench_parse_int(const char *who, const char *opt, const char *s, int lo,
                                      int hi, int *v) {
    long r;
    if (read_long(s, lo, hi, &r)) {
        *v = (int)r;
        return true;
    }
    fprintf(stderr, "%s: %s: expected an integer in [%d, %d], got \"%s\"\n", who, opt, lo, hi, s);
    return false;
}

/* --help or -h: a program asked for its usage (on stdout, exit status 0). */
static inline bool mt_bench_is_help(const char *arg) {
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* The "[reps] [threads]" arguments of the kernel benches: reps (default 10) in 1..10^6,
   threads (default threads_default) threads_min..4096 (0: the library's default). --help: the
   usage on stdout and exit 0. False after the message and the usage line on stderr. */
static inline bool mt_bench_reps_threads(int argc, char **argv, int threads_default,
                                         int threads_min, int *reps, int *threads) {
    char usage[160];
    snprintf(usage, sizeof usage, "usage: %s [reps > 0] [threads %s]\n", argv[0],
             threads_min > 0 ? "> 0" : ">= 0");
    if (argc > 1 && mt_bench_is_help(argv[1])) {
        fputs(usage, stdout);
        exit(0);
    }
    *reps = 10;
    *threads = threads_default;
    if (argc <= 3 &&
        (argc <= 1 || mt_bench_parse_int(argv[0], "reps", argv[1], 1, 1000000, reps)) &&
        (argc <= 2 || mt_bench_parse_int(argv[0], "threads", argv[2], threads_min, 4096, threads)))
        return true;
    fputs(usage, stderr);
    return false;
}

/* The start of the kernel benches with [reps] [threads] (threads 0: the library's default):
   the thread count, seed 1 and the "mixtape, N threads" line. False after the usage line. */
static inline bool mt_bench_kernel_start(int argc, char **argv, int *reps) {
    int threads;
    if (!mt_bench_reps_threads(argc, argv, 0, 0, reps, &threads)) return false;
    if (threads) mt_set_num_threads(threads);
    mt_manual_seed(1);
    printf("mixtape, %d threads\n", mt_get_num_threads());
    return true;
}

/* ---- the options of the side-by-side benches: "--name value" pairs and flags */

typedef struct {
    const char *name;  /* with its dashes: "--batch" */
    long *num;         /* the value, a whole integer in [lo, hi]; or */
    const char **word; /* the value as given; or */
    bool *clear;       /* no value: set to false (--no-torch) */
    long lo, hi;       /* num's range */
} mt_bench_opt;

enum {
    MT_BENCH_OPTS_MISSING = 1, /* the last word wants a value */
    MT_BENCH_OPTS_UNKNOWN = 2, /* told on stderr */
    MT_BENCH_OPTS_BAD = 3,     /* a number that is not one, or out of its range; told */
    MT_BENCH_OPTS_HELP = 4,    /* --help or -h: the caller prints its usage on stdout, exit 0 */
};

/* Parses argv by the n rows: 0, or one of the MT_BENCH_OPTS_ statuses. */
static inline int mt_bench_opts_parse(int argc, char **argv, const mt_bench_opt *rows, int n,
                                      const char *who) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const mt_bench_opt *r = NULL;
        for (int k = 0; k < n && !r; k++)
            if (strcmp(rows[k].name, a) == 0) r = &rows[k];
        if (!r && mt_bench_is_help(a)) return MT_BENCH_OPTS_HELP;
        if (r && r->clear) {
            *r->clear = false;
            continue;
        }
        if (!r) {
            fprintf(stderr, "%s: unknown option %s\n", who, a);
            return MT_BENCH_OPTS_UNKNOWN;
        }
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", who, a);
            return MT_BENCH_OPTS_MISSING;
        }
        i++;
        if (r->num && !read_long(v, r->lo, r->hi, r->num)) {
            fprintf(stderr, "%s: %s: expected an integer in [%ld, %ld], got \"%s\"\n", who, a,
                    r->lo, r->hi, v);
            return MT_BENCH_OPTS_BAD;
        }
        if (r->word) *r->word = v;
    }
    return 0;
}

/* A --threads list: thread counts in 1..4096 separated by single commas, at most 60
   characters (the benches copy it into 64-byte buffers). */
static inline bool mt_bench_thread_list_ok(const char *list) {
    if (!list[0] || strlen(list) > 60 || strspn(list, "0123456789,") != strlen(list)) return false;
    for (const char *p = list;;) {
        size_t n = strcspn(p, ",");
        char tok[64];
        long v;
        memcpy(tok, p, n);
        tok[n] = 0;
        if (!read_long(tok, 1, 4096, &v)) return false;
        if (!p[n]) return true;
        p += n + 1;
    }
}

/* ---- the children of the side-by-side benches */

/* What every row of their tables holds: the implementation ("torch 1.13.1" when the line has
   a "version"), the mode, whether it ran (else why not) and its thread count. */
typedef struct {
    char impl[160], mode[32], reason[256];
    bool supported;
    int threads;
} mt_bench_row;

/* Fills r from a JSON line of implementation impl; false when the line has no "mode". */
static inline bool mt_bench_row_parse(const char *line, const char *impl, mt_bench_row *r) {
    *r = (mt_bench_row){.supported = true};
    snprintf(r->impl, sizeof r->impl, "%s", impl);
    if (!mt_bench_json_get(line, "mode", r->mode, sizeof r->mode)) return false;
    char buf[64];
    if (mt_bench_json_get(line, "supported", buf, sizeof buf) && strcmp(buf, "false") == 0) {
        r->supported = false;
        mt_bench_json_get(line, "reason", r->reason, sizeof r->reason);
    }
    if (mt_bench_json_get(line, "version", buf, sizeof buf))
        snprintf(r->impl, sizeof r->impl, "%s %s", impl, buf);
    r->threads = (int)mt_bench_json_num(line, "threads");
    return true;
}

/* The row of a child that failed without a JSON line: "failed: " and its last message. */
static inline void mt_bench_row_failed(mt_bench_row *r, const char *impl, const char *mode,
                                       const char *last_msg) {
    *r = (mt_bench_row){.supported = false};
    snprintf(r->impl, sizeof r->impl, "%s", impl);
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    snprintf(r->reason, sizeof r->reason, "failed: %.247s", last_msg); /* what fits */
}

/* r is a row of impl (a prefix: "torch" matches "torch 1.13.1") and mode. */
static inline bool mt_bench_row_is(const mt_bench_row *r, const char *impl, const char *mode) {
    return strncmp(r->impl, impl, strlen(impl)) == 0 && strcmp(r->mode, mode) == 0;
}

typedef struct {
    int status;         /* pclose's */
    int added;          /* JSON lines add() kept */
    char last_msg[256]; /* the last line that was not JSON, "no output" without one */
} mt_bench_child;

/* Runs cmd (stderr joined to stdout) and gives each JSON line to add(line, ctx), which returns
   whether it kept a row. A nonzero exit status is told on stderr ("<who>: <impl> <mode>: exit
   status N: <last message>"). False when cmd could not start (told on stderr too). */
static inline bool mt_bench_run_child(const char *who, const char *cmd, const char *impl,
                                      const char *mode, bool (*add)(const char *line, void *ctx),
                                      void *ctx, mt_bench_child *ch) {
    char full[2300];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot run: %s\n", who, cmd);
        return false;
    }
    char line[4096];
    *ch = (mt_bench_child){.last_msg = "no output"};
    while (fgets(line, sizeof line, f)) {
        if (line[0] != '{') {
            line[strcspn(line, "\r\n")] = 0;
            if (line[0]) snprintf(ch->last_msg, sizeof ch->last_msg, "%.250s", line);
        } else if (add(line, ctx)) {
            ch->added++;
        }
    }
    ch->status = pclose(f);
    if (ch->status != 0)
        fprintf(stderr, "%s: %s %s: exit status %d: %s\n", who, impl, mode ? mode : "",
                WIFEXITED(ch->status) ? WEXITSTATUS(ch->status) : -1, ch->last_msg);
    return true;
}

/* "met", "not met" or "not measured" (a ratio is NAN) for a goal of ratios a and b >= 1. */
static inline const char *mt_bench_goal(double a, double b) {
    if (!isfinite(a) || !isfinite(b)) return "not measured";
    return a >= 1 && b >= 1 ? "met" : "not met";
}

static inline bool mt_bench_safe_for_shell(const char *s) {
    return !strchr(s, '\'');
}

#endif

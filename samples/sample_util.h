/* What the samples share: clocks, the "print and exit" check of the library's status, option
   parsing helpers, and the four AMP modes of simplenet_amp and resnet_amp. Each sample defines
   MT_SAMPLE_NAME (its program name, for messages) before including this header. */
#ifndef MT_SAMPLE_UTIL_H
#define MT_SAMPLE_UTIL_H
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "mixtape.h"

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

/* The library never prints or exits; a sample does both when something went wrong. */
static inline void check(const char *what) {
    if (mt_last_status() == MT_OK) return;
    if (isatty(STDERR_FILENO)) fputc('\n', stderr); /* end a progress line */
    fprintf(stderr, "%s: %s failed: %s (%s)\n", MT_SAMPLE_NAME, what, mt_last_error(),
            mt_status_name(mt_last_status()));
    exit(1);
}

static inline long parse_long(const char *opt, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s: expected an integer in [%ld, %ld], got \"%s\"\n", MT_SAMPLE_NAME,
                opt, lo, hi, s);
        exit(2);
    }
    return v;
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
    }
    free(copy);
}

#endif

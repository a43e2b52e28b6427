/* What the benchmarks share: where the PyTorch side lives, and reading the flat JSON lines
   that our own samples and scripts print (one object per line, no nesting, no escapes). */
#ifndef MT_BENCH_UTIL_H
#define MT_BENCH_UTIL_H
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MT_BENCH_DIR
#define MT_BENCH_DIR "bench"
#endif
#ifndef MT_TORCH_PYTHON
#define MT_TORCH_PYTHON "/usr/bin/python3"
#endif

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

/* The "[reps] [threads]" arguments of the kernel benches: reps (default 10) must be > 0,
   threads (default threads_default) at least threads_min (0: the library's default). False
   after printing the usage line. */
static inline bool mt_bench_reps_threads(int argc, char **argv, int threads_default,
                                         int threads_min, int *reps, int *threads) {
    *reps = argc > 1 ? atoi(argv[1]) : 10;
    *threads = argc > 2 ? atoi(argv[2]) : threads_default;
    if (*reps > 0 && *threads >= threads_min) return true;
    fprintf(stderr, "usage: %s [reps > 0] [threads %s]\n", argv[0],
            threads_min > 0 ? "> 0" : ">= 0");
    return false;
}

#endif

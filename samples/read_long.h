/* The strict integer reader that the samples and the benchmarks share (samples/sample_util.h,
   bench/bench_util.h): strtol alone takes "12abc", " 12" and overflow without a word. */
#ifndef MT_READ_LONG_H
#define MT_READ_LONG_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

/* Reads s into *v when it is a whole decimal integer in [lo, hi] (an optional '-' and
   digits: no leading blanks or '+', no trailing junk, no overflow); otherwise false, and *v
   as it was. For values from files too (a checkpoint's metadata), where exiting with a
   command-line message would be wrong. */
static inline bool read_long(const char *s, long lo, long hi, long *v) {
    if (!(*s == '-' || (*s >= '0' && *s <= '9'))) return false; /* strtol skips " \n+" */
    char *end;
    errno = 0;
    long r = strtol(s, &end, 10);
    if (errno || end == s || *end || r < lo || r > hi) return false;
    *v = r;
    return true;
}

#endif

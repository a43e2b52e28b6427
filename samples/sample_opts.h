/* The samples' command lines as tables: each sample lists its options as rows (the long name,
   what kind of value, where it goes, its range) and sample_opts_parse runs getopt_long over
   them, so the checks and messages for bad values (parse_long, parse_double, parse_device,
   parse_modes of sample_util.h) are the same in every sample. Include after sample_util.h. */
#ifndef MT_SAMPLE_OPTS_H
#define MT_SAMPLE_OPTS_H
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include "sample_util.h"

typedef enum {
    SO_FLAG,   /* bool: set when given */
    SO_INT,    /* int in [lo, hi] */
    SO_I64,    /* int64_t in [lo, hi] */
    SO_U64,    /* uint64_t in [lo, hi] */
    SO_DOUBLE, /* double in [dlo, dhi] */
    SO_STRING, /* const char *: the argument itself */
    SO_DEVICE, /* mt_device: cpu or cuda[:N] */
    SO_MODES,  /* bool[N_MODES]: the --modes comma list */
    SO_CALL,   /* the sample's own parser: call(arg, dst) */
    SO_HELP,   /* the usage on stdout, exit 0 */
} sample_opt_kind;

typedef struct {
    const char *name; /* without "--" */
    sample_opt_kind kind;
    void *dst;
    long lo, hi;
    double dlo, dhi;
    void (*call)(const char *arg, void *dst);
    bool *seen;      /* when not NULL: set when the option is given */
    char short_name; /* 0, or the one-letter spelling (-h) */
} sample_opt;

#define SAMPLE_OPT(n, k, p)                                                                        \
    { .name = (n), .kind = (k), .dst = (p) }
#define SAMPLE_OPT_RANGE(n, k, p, l, h)                                                            \
    { .name = (n), .kind = (k), .dst = (p), .lo = (l), .hi = (h) }
#define SAMPLE_OPT_DOUBLE(n, p, l, h)                                                              \
    { .name = (n), .kind = SO_DOUBLE, .dst = (p), .dlo = (l), .dhi = (h) }
#define SAMPLE_OPT_CALL(n, p, fn)                                                                  \
    { .name = (n), .kind = SO_CALL, .dst = (p), .call = (fn) }
/* --seed N: 0 .. LONG_MAX */
#define SAMPLE_OPT_SEED(p)    SAMPLE_OPT_RANGE("seed", SO_U64, (p), 0, LONG_MAX)
#define SAMPLE_OPT_THREADS(p) SAMPLE_OPT_RANGE("threads", SO_INT, (p), 1, 4096)
#define SAMPLE_OPT_HELP                                                                            \
    { .name = "help", .kind = SO_HELP, .short_name = 'h' }

static inline void parse_bucket_mb(const char *arg, void *dst) {
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end || !(v > 0)) {
        fprintf(stderr, "%s: --bucket-mb: expected a number > 0, got \"%s\"\n", MT_SAMPLE_NAME,
                arg);
        exit(2);
    }
    *(double *)dst = v;
}

static inline void parse_progress_opt(const char *arg, void *dst) {
    *(mt_ddp_progress *)dst = parse_progress(arg);
}

/* The --ddp rows (SAMPLE_DDP_USAGE says what they do): ddp is a bool *, o an mt_ddp_opts *. */
#define SAMPLE_OPTS_DDP(ddp, o)                                                                    \
    SAMPLE_OPT("ddp", SO_FLAG, (ddp)),                                                             \
        SAMPLE_OPT_CALL("bucket-mb", &(o)->bucket_mb, parse_bucket_mb),                            \
        SAMPLE_OPT("per-param", SO_FLAG, &(o)->per_parameter),                                     \
        SAMPLE_OPT("no-overlap", SO_FLAG, &(o)->no_overlap),                                       \
        SAMPLE_OPT_CALL("progress", &(o)->progress, parse_progress_opt)

static inline void sample_opt_apply(const sample_opt *r, const char *arg, void (*usage)(FILE *)) {
    char opt[64];
    snprintf(opt, sizeof opt, "--%s", r->name);
    if (r->seen) *r->seen = true;
    switch (r->kind) {
    case SO_FLAG:
        *(bool *)r->dst = true;
        break;
    case SO_INT:
        *(int *)r->dst = (int)parse_long(opt, arg, r->lo, r->hi);
        break;
    case SO_I64:
        *(int64_t *)r->dst = parse_long(opt, arg, r->lo, r->hi);
        break;
    case SO_U64:
        *(uint64_t *)r->dst = (uint64_t)parse_long(opt, arg, r->lo, r->hi);
        break;
    case SO_DOUBLE:
        *(double *)r->dst = parse_double(opt, arg, r->dlo, r->dhi);
        break;
    case SO_STRING:
        *(const char **)r->dst = arg;
        break;
    case SO_DEVICE:
        *(mt_device *)r->dst = parse_device(arg);
        break;
    case SO_MODES:
        parse_modes(arg, r->dst);
        break;
    case SO_CALL:
        r->call(arg, r->dst);
        break;
    case SO_HELP:
        usage(stdout);
        exit(0);
    }
}

enum { SAMPLE_OPTS_MAX = 32, SAMPLE_OPT_ID = 256 /* getopt_long ids: SAMPLE_OPT_ID + row */ };

/* The row of getopt_long's answer o, or -1 ('?': an unknown option or a missing value). */
static inline int sample_opt_find(const sample_opt *rows, int n, int o) {
    if (o >= SAMPLE_OPT_ID) return o - SAMPLE_OPT_ID;
    for (int i = 0; i < n && o != '?'; i++)
        if (rows[i].short_name == o) return i;
    return -1;
}

/* Parses argv by the n rows. An unknown option or a missing value: getopt's message and the
   usage on stderr, exit 2; a bad value: its message, exit 2; a word that is no option:
   "unexpected argument" (and the usage, when usage_on_extra), exit 2. */
static inline void sample_opts_parse(int argc, char **argv, const sample_opt *rows, int n,
                                     void (*usage)(FILE *), bool usage_on_extra) {
    struct option longs[SAMPLE_OPTS_MAX + 1] = {{0}};
    char shorts[SAMPLE_OPTS_MAX + 1] = {0};
    int n_short = 0;
    if (n > SAMPLE_OPTS_MAX) {
        fprintf(stderr, "%s: more than %d options\n", MT_SAMPLE_NAME, SAMPLE_OPTS_MAX);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        bool arg = rows[i].kind != SO_FLAG && rows[i].kind != SO_HELP;
        longs[i] = (struct option){rows[i].name, arg ? required_argument : no_argument, NULL,
                                   SAMPLE_OPT_ID + i};
        if (rows[i].short_name) shorts[n_short++] = rows[i].short_name;
    }
    int o;
    while ((o = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        int i = sample_opt_find(rows, n, o);
        if (i < 0) {
            usage(stderr);
            exit(2);
        }
        sample_opt_apply(&rows[i], optarg, usage);
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument \"%s\"\n", MT_SAMPLE_NAME, argv[optind]);
        if (usage_on_extra) usage(stderr);
        exit(2);
    }
}

#endif

/* Multi-tensor kernels for mixed precision: the fused unscale + inf/nan check, the dynamic
   loss-scale update and the sum of squares behind gradient clipping.
   Multi-tensor passes run in one OpenMP region over all tensors: big tensors are split across
   the threads, small ones go whole to one thread each (balanced by element count), so a model
   of many small parameters costs one region, not one per tensor. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "../math/optim_math.h"
#include "cpu.h"

#define BLOCK 256
/* Tensors at least this big are split across threads; smaller ones are handed out whole. */
#define SPLIT_MIN 16384

/* Processes n elements of dtype dt starting at p, stride s bytes; returns a partial result
   that the driver sums (an inf/nan count for unscale, a sum of squares for sq_norm). */
typedef double (*span_fn)(char *p, int64_t s, mt_dtype dt, int64_t n, const void *ctx);

typedef struct {
    span_fn fn;
    const void *ctx;
    mt_dtype dt;
    double acc;
} strided_ctx;

static void strided_row(char **p, const int64_t *s, int64_t n, void *vctx) {
    strided_ctx *c = vctx;
    double r = c->fn(p[0], s[0], c->dt, n, c->ctx);
#pragma omp atomic update
    c->acc += r;
}

/* Runs fn over every element of every non-NULL tensor; returns the sum of its results. */
static double run_spans(mt_tensor *const *ts, int n, span_fn fn, const void *ctx, int cost) {
    double acc = 0.0;
    int64_t dense_total = 0, small_total = 0;
    for (int i = 0; i < n; i++) {
        const mt_tensor *t = ts[i];
        if (!t || t->numel == 0) continue;
        /* dense tensors (row-major or channels-last) are walked in memory order; others
           (rare: user-set grads) through the strided iterator */
        if (!mt_is_dense(t)) {
            const mt_tensor *ops[1] = {t};
            mt_cpu_iter it;
            mt_cpu_iter_init(&it, 1, ops);
            strided_ctx c = {fn, ctx, t->dtype, 0.0};
            mt_cpu_iter_run(&it, strided_row, &c, cost);
            acc += c.acc;
            continue;
        }
        dense_total += t->numel;
        if (t->numel < SPLIT_MIN) small_total += t->numel;
    }
    int threads = mt_cpu_num_threads();
    if (threads <= 1 || dense_total * cost < MT_CPU_PARALLEL_MIN) {
        for (int i = 0; i < n; i++) {
            const mt_tensor *t = ts[i];
            if (!t || t->numel == 0 || !mt_is_dense(t)) continue;
            acc += fn(mt_tensor_data(t), (int64_t)mt_dtype_size(t->dtype), t->dtype, t->numel, ctx);
        }
        return acc;
    }
    double par = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : par)
    {
        int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t small_seen = 0; /* every thread walks the list identically */
        for (int i = 0; i < n; i++) {
            const mt_tensor *t = ts[i];
            if (!t || t->numel == 0 || !mt_is_dense(t)) continue;
            int64_t es = (int64_t)mt_dtype_size(t->dtype), m = t->numel;
            char *base = mt_tensor_data(t);
            if (m < SPLIT_MIN) {
                int64_t owner = small_seen * nt / small_total;
                small_seen += m;
                if (owner == id) par += fn(base, es, t->dtype, m, ctx);
                continue;
            }
            /* chunks aligned to 16 elements keep vector loops and cache lines whole */
            int64_t per = ((m + nt - 1) / nt + 15) & ~(int64_t)15;
            int64_t b = id * per, e = b + per < m ? b + per : m;
            if (b < e) par += fn(base + b * es, es, t->dtype, e - b, ctx);
        }
    }
    return acc + par;
}

/* ------------------------------------------------------------------ unscale */

typedef struct {
    float inv;
    double inv_d;
} unscale_ctx;

/* inv == 1: only the check (read-only), for a step that folds the unscale into the
   optimizer kernel. */
static double check_span(char *p, int64_t s, mt_dtype dt, int64_t n) {
    int bad = 0;
    if (dt == MT_F32 && s == 4) {
        const uint32_t *u = (const uint32_t *)p;
        for (int64_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
        return bad;
    }
    if ((dt == MT_F16 || dt == MT_BF16) && s == 2) {
        const uint16_t *u = (const uint16_t *)p;
        uint16_t m = dt == MT_F16 ? 0x7c00u : 0x7f80u;
        for (int64_t i = 0; i < n; i++) bad |= (u[i] & m) == m;
        return bad;
    }
    float buf[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        if (dt == MT_F64) {
            for (int64_t j = 0; j < m; j++) bad |= !isfinite(*(const double *)(p + (i + j) * s));
        } else {
            mt_cpu_load_f32(p + i * s, s, dt, m, buf);
            for (int64_t j = 0; j < m; j++) bad |= !isfinite(buf[j]);
        }
    }
    return bad;
}

static double unscale_span(char *p, int64_t s, mt_dtype dt, int64_t n, const void *vctx) {
    const unscale_ctx *c = vctx;
    if (c->inv_d == 1.0) return check_span(p, s, dt, n);
    int bad = 0;
    if (dt == MT_F32 && s == 4) { /* the common case: a loop the compiler vectorises */
        float *x = (float *)p;
        float inv = c->inv;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u; /* exponent all ones: inf or nan */
            x[i] *= inv;
        }
        return bad;
    }
    if (dt == MT_F64) {
        for (int64_t i = 0; i < n; i++) {
            double *x = (double *)(p + i * s);
            bad |= !isfinite(*x);
            *x *= c->inv_d;
        }
        return bad;
    }
    /* F16/BF16 (and strided F32): FP32 registers, rounded once on store */
    float buf[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        char *q = p + i * s;
        mt_cpu_load_f32(q, s, dt, m, buf);
        for (int64_t j = 0; j < m; j++) {
            bad |= !isfinite(buf[j]);
            buf[j] *= c->inv;
        }
        mt_cpu_store_f32(q, s, dt, m, buf);
    }
    return bad;
}

/* Every non-NULL tensor of ts must be F32, F16, BF16 or F64; the error names the kernel and
   what the tensors are ("gradient", "tensor"). */
static int check_floating(const char *kernel, const char *what, mt_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++) {
        mt_dtype dt = ts[i] ? ts[i]->dtype : MT_F32;
        if (dt != MT_F32 && dt != MT_F16 && dt != MT_BF16 && dt != MT_F64)
            return mt_error_set(MT_ERR_DTYPE, "%s: %s %d has dtype %s, expected a floating dtype",
                                kernel, what, i, mt_dtype_name(dt));
    }
    return 0;
}

static double read_scalar(const mt_tensor *t) {
    double v;
    mt_cpu_load_f64(mt_tensor_data(t), 0, t->dtype, 1, &v);
    return v;
}

static void write_scalar(mt_tensor *t, double v) {
    mt_cpu_store_f64(mt_tensor_data(t), 0, t->dtype, 1, &v);
}

int mt_cpu_unscale(mt_tensor *const *grads, int n, const mt_tensor *inv_scale,
                   mt_tensor *found_inf) {
    int rc = check_floating("unscale", "gradient", grads, n);
    if (rc) return rc;
    double inv = read_scalar(inv_scale);
    unscale_ctx c = {(float)inv, inv};
    double bad = run_spans(grads, n, unscale_span, &c, 1);
    if (bad > 0) write_scalar(found_inf, 1.0); /* never cleared here: it ORs across calls */
    return 0;
}

/* ------------------------------------------------------------------ loss scale update */

int mt_cpu_scale_update(const mt_scale_update_args *a) {
    double scale = read_scalar(a->scale);
    double good = read_scalar(a->good_steps), bad = read_scalar(a->bad_steps);
    double skipped = read_scalar(a->skipped_steps);
    mt_loss_scale_update(read_scalar(a->found_inf) != 0.0, &scale, &good, &bad, &skipped,
                         a->growth_factor, a->backoff_factor, a->growth_interval, a->backoff_after,
                         a->min_scale, a->max_scale);
    write_scalar(a->scale, scale);
    write_scalar(a->good_steps, good);
    write_scalar(a->bad_steps, bad);
    write_scalar(a->skipped_steps, skipped);
    return 0;
}

/* ------------------------------------------------------------------ sum of squares */

/* Sum of squares of a contiguous float run, with 8 FP32 lanes so the loop vectorises. */
static double sumsq_f32(const float *x, int64_t n) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] += x[i + k] * x[i + k];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += lane[k];
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static double sq_span(char *p, int64_t s, mt_dtype dt, int64_t n, const void *ctx) {
    (void)ctx;
    double acc = 0.0;
    if (dt == MT_F64) {
        for (int64_t i = 0; i < n; i++) {
            double v = *(const double *)(p + i * s);
            acc += v * v;
        }
        return acc;
    }
    /* FP32 accumulation within blocks; block sums are added in double */
    if (dt == MT_F32 && s == 4) {
        for (int64_t i = 0; i < n; i += BLOCK)
            acc += sumsq_f32((const float *)p + i, n - i < BLOCK ? n - i : BLOCK);
        return acc;
    }
    float buf[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        mt_cpu_load_f32(p + i * s, s, dt, m, buf);
        acc += sumsq_f32(buf, m);
    }
    return acc;
}

int mt_cpu_sq_norm(mt_tensor *const *ts, int n, mt_tensor *out) {
    int rc = check_floating("sq_norm", "tensor", ts, n);
    if (rc) return rc;
    write_scalar(out, run_spans(ts, n, sq_span, NULL, 1));
    return 0;
}

/* Softmax / log_softmax along a dim, their fused backward, and fused cross entropy
   (log-softmax + NLL) forward and backward.

   Every kernel works on "rows": the runs along the softmax dim (or the class dim), one per
   position of the other dims. A row is gathered into an FP32 buffer (F64 for F64), reduced
   with max subtraction, and written back; contiguous F32 rows are used in place. The
   exponential is a polynomial written so the compiler vectorises it (libm's expf does not
   vectorise without -ffast-math); it is within 2 ulp of expf. Rows run in parallel when the
   work is above MT_CPU_PARALLEL_MIN elements. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "cpu.h"

/* Comparisons that may see NaN keep GCC from if-converting (and so vectorising) the selects
   in exp and max unless FP exceptions are declared unobserved; we never read them. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "cpu_vec.h"

#define ROW_STACK 2048 /* rows up to this length use stack buffers */

/* ---------------------------------------------------------------- vector-friendly math */

/* exp(x) for float, Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, times
   2^n built from the exponent bits. Within 1.3 ulp on [-87.3, 0] (every float checked),
   the arguments softmax passes. Below -87.3 it returns 0: the results there would be
   subnormal, and computing them costs microcode assists, so src/math's mt_expv_f (correct
   there, and as fast elsewhere) is 2.5x slower per element on such inputs and flushing
   around it costs 30%. From 88.38 up it returns inf (2^128 overflows); NaN stays NaN.
   FMA is fmaf (one rounding everywhere): an instruction in the AVX2/AVX-512 clones of the
   functions that call exp_vf (MT_CPU_CLONES), which is why each of them has clones. */
#define FMA(a, b, c) fmaf((a), (b), (c))

MT_CPU_INLINE float exp_vf(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    xc = xc < 88.7f ? xc : 88.7f;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: its low mantissa bits are n itself */
    float t = FMA(xc, 1.44269504088896341f, 12582912.0f);
    float n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    float r = FMA(n, -0.693359375f, xc);
    r = FMA(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = FMA(p, r, 1.3981999507e-3f);
    p = FMA(p, r, 8.3334519073e-3f);
    p = FMA(p, r, 4.1665795894e-2f);
    p = FMA(p, r, 1.6666665459e-1f);
    p = FMA(p, r, 5.0000001201e-1f);
    p = FMA(p * r, r, r + 1.0f);
    int32_t bits = (int32_t)((uint32_t)(ti - 0x4B400000 + 127) << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x < -87.3f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    return x != x ? x : y;
}

/* e[i] = exp(x[i] - m); returns the sum */
MT_CPU_CLONES static float exp_sub_f(const float *restrict x, float m, float *restrict e,
                                     int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = exp_vf(x[i] - m);
    return (float)mt_cpu_sum_f32(e, n);
}

static double max_d(const double *x, int64_t n) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = (x[i] > m || x[i] != x[i]) ? x[i] : m;
    return m;
}

/* ---------------------------------------------------------------- rows */

/* The rows of a tensor along dim: for row r, the byte offset of its first element. */
typedef struct {
    int nd;
    int64_t shape[MT_MAX_DIMS], stride[MT_MAX_DIMS]; /* the other dims, bytes */
} row_map;

static void row_map_init(row_map *m, const mt_tensor *t, int dim) {
    int64_t es = (int64_t)mt_dtype_size(t->dtype);
    m->nd = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (d == dim || t->shape[d] == 1) continue;
        m->shape[m->nd] = t->shape[d];
        m->stride[m->nd++] = t->strides[d] * es;
    }
}

static inline int64_t row_offset(const row_map *m, int64_t r) {
    int64_t off = 0;
    for (int d = m->nd - 1; d >= 0; d--) {
        off += (r % m->shape[d]) * m->stride[d];
        r /= m->shape[d];
    }
    return off;
}

/* Scratch for one range of rows: the stack when small. */
typedef struct {
    void *heap;
    size_t bytes;
} scratch;

static void *scratch_get(scratch *s, void *stack, size_t stack_bytes, size_t bytes) {
    s->heap = NULL;
    s->bytes = bytes;
    if (bytes <= stack_bytes) return stack;
    s->heap = mt_host_alloc(bytes);
    return s->heap;
}

static void scratch_put(scratch *s) {
    if (s->heap) mt_host_free(s->heap, s->bytes);
}

/* Runs fn over [0, n) split in one static range per thread when the work is large enough,
   else on the calling thread with no OpenMP construct at all (tiny ops stay cheap). fn
   returns nonzero when it could not get its scratch. */
typedef int (*range_fn)(void *ctx, int64_t b, int64_t e);

static int for_ranges(range_fn fn, void *ctx, int64_t n, int64_t work) {
    int threads = mt_cpu_num_threads();
    if (threads <= 1 || n < 2 || work < MT_CPU_PARALLEL_MIN) return fn(ctx, 0, n);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t per = (n + nt - 1) / nt, b = (int64_t)id * per, e = b + per < n ? b + per : n;
        if (b < e && fn(ctx, b, e)) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed;
}

static int oom(const char *op, int64_t n) {
    return mt_error_set(MT_ERR_OOM, "%s: out of memory for a row buffer of %lld elements", op,
                        (long long)n);
}

/* Everything a softmax-family kernel needs about its operands: up to 3 tensors, their row
   maps, their byte strides along the dim. */
typedef struct {
    int64_t L, rows;
    bool is_log;
    const mt_tensor *t[3];
    row_map m[3];
    int64_t s[3]; /* byte stride along the dim */
    char *base[3];
} sm_args;

static void sm_args_init(sm_args *A, int n, const mt_tensor *const *ts, int dim, bool is_log) {
    const mt_tensor *t0 = ts[0];
    A->L = t0->ndim ? t0->shape[dim] : 1;
    A->rows = A->L ? t0->numel / A->L : 0;
    A->is_log = is_log;
    for (int i = 0; i < n; i++) {
        int64_t es = (int64_t)mt_dtype_size(ts[i]->dtype);
        A->t[i] = ts[i];
        row_map_init(&A->m[i], ts[i], dim);
        A->s[i] = ts[i]->ndim ? ts[i]->strides[dim] * es : es;
        A->base[i] = (char *)mt_tensor_data(ts[i]);
    }
}

/* ---------------------------------------------------------------- tiles
   When the softmax dim is not the innermost one (softmax over dim 1 of [N, C, H, W]), the
   rows next to each other along the innermost other dim are contiguous: TILE of them are
   processed together, the vector running across rows, the loop over the softmax dim
   outside. The input is read three times (max, sum, output), from cache for moderate L. */
#define TILE 64

/* w elements of a contiguous run as FP32: in place for F32, else converted into tmp. */
static inline const float *tile_load(const char *p, mt_dtype dt, int w, float *tmp) {
    if (dt == MT_F32) return (const float *)p;
    mt_cpu_load_f32(p, (int64_t)mt_dtype_size(dt), dt, w, tmp);
    return tmp;
}

/* True when the innermost other dim of every operand is contiguous (tiles apply). */
static bool tiles_apply(const sm_args *A, int n) {
    if (A->L < 2 || A->m[0].nd == 0) return false;
    for (int i = 0; i < n; i++) {
        const row_map *m = &A->m[i];
        if (A->t[i]->dtype == MT_F64 || m->nd != A->m[0].nd ||
            m->stride[m->nd - 1] != (int64_t)mt_dtype_size(A->t[i]->dtype))
            return false;
    }
    return A->m[0].shape[A->m[0].nd - 1] >= 4;
}

static int64_t tile_tasks(const sm_args *A) {
    int64_t V = A->m[0].shape[A->m[0].nd - 1];
    return A->rows / V * ((V + TILE - 1) / TILE);
}

/* first row and width of tile task k */
static inline int64_t tile_row(const sm_args *A, int64_t k, int *w) {
    int64_t V = A->m[0].shape[A->m[0].nd - 1], chunks = (V + TILE - 1) / TILE;
    int64_t line = k / chunks, c0 = (k % chunks) * TILE;
    *w = (int)(V - c0 < TILE ? V - c0 : TILE);
    return line * V + c0;
}

/* operands: 0 = input, 1 = output */
MT_CPU_CLONES static int softmax_tiles(void *ctx, int64_t kb, int64_t ke) {
    const sm_args *A = ctx;
    mt_dtype dt = A->t[0]->dtype, odt = A->t[1]->dtype;
    int64_t L = A->L, as = A->s[0], os = A->s[1], oes = (int64_t)mt_dtype_size(odt);
    for (int64_t k = kb; k < ke; k++) {
        int w;
        int64_t r0 = tile_row(A, k, &w);
        const char *src = A->base[0] + row_offset(&A->m[0], r0);
        char *dst = A->base[1] + row_offset(&A->m[1], r0);
        float m[TILE], tmp[TILE], y[TILE], sub[TILE];
        double s[TILE];
        for (int j = 0; j < w; j++) {
            m[j] = -INFINITY;
            s[j] = 0;
        }
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            for (int j = 0; j < w; j++) m[j] = mt_cpu_maxf(m[j], x[j]);
        }
        for (int j = 0; j < w; j++) m[j] = m[j] == -INFINITY ? 0.0f : m[j];
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            for (int j = 0; j < w; j++) y[j] = exp_vf(x[j] - m[j]);
            for (int j = 0; j < w; j++) s[j] += y[j];
        }
        /* softmax: exp(x - m) / s; log_softmax: (x - m) - log(s) */
        for (int j = 0; j < w; j++) sub[j] = A->is_log ? (float)log(s[j]) : (float)(1.0 / s[j]);
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            float *o = odt == MT_F32 ? (float *)(dst + l * os) : y;
            if (A->is_log)
                for (int j = 0; j < w; j++) o[j] = (x[j] - m[j]) - sub[j];
            else
                for (int j = 0; j < w; j++) o[j] = exp_vf(x[j] - m[j]) * sub[j];
            if (odt != MT_F32) mt_cpu_store_f32(dst + l * os, oes, odt, w, o);
        }
    }
    return 0;
}

/* operands: 0 = y, 1 = grad_out, 2 = grad_in.
   softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
MT_CPU_CLONES static int softmax_backward_tiles(void *ctx, int64_t kb, int64_t ke) {
    const sm_args *A = ctx;
    mt_dtype ydt = A->t[0]->dtype, gdt = A->t[1]->dtype, xdt = A->t[2]->dtype;
    int64_t L = A->L, ys = A->s[0], gs = A->s[1], xs = A->s[2];
    for (int64_t k = kb; k < ke; k++) {
        int w;
        int64_t r0 = tile_row(A, k, &w);
        const char *yp = A->base[0] + row_offset(&A->m[0], r0);
        const char *gp = A->base[1] + row_offset(&A->m[1], r0);
        char *xp = A->base[2] + row_offset(&A->m[2], r0);
        float t1[TILE], t2[TILE], o[TILE], sf[TILE];
        double s[TILE];
        for (int j = 0; j < w; j++) s[j] = 0;
        for (int64_t l = 0; l < L; l++) {
            const float *g = tile_load(gp + l * gs, gdt, w, t1);
            if (A->is_log) {
                for (int j = 0; j < w; j++) s[j] += g[j];
            } else {
                const float *v = tile_load(yp + l * ys, ydt, w, t2);
                for (int j = 0; j < w; j++) s[j] += g[j] * v[j];
            }
        }
        for (int j = 0; j < w; j++) sf[j] = (float)s[j];
        for (int64_t l = 0; l < L; l++) {
            const float *g = tile_load(gp + l * gs, gdt, w, t1);
            const float *v = tile_load(yp + l * ys, ydt, w, t2);
            float *dst = xdt == MT_F32 ? (float *)(xp + l * xs) : o;
            if (A->is_log)
                for (int j = 0; j < w; j++) dst[j] = g[j] - exp_vf(v[j]) * sf[j];
            else
                for (int j = 0; j < w; j++) dst[j] = v[j] * (g[j] - sf[j]);
            if (xdt != MT_F32)
                mt_cpu_store_f32(xp + l * xs, (int64_t)mt_dtype_size(xdt), xdt, w, dst);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- softmax forward */

/* rows [rb, re); operands: 0 = input, 1 = output */
static int softmax_rows(void *ctx, int64_t rb, int64_t re) {
    const sm_args *A = ctx;
    const mt_tensor *a = A->t[0], *out = A->t[1];
    int64_t L = A->L, as = A->s[0], os = A->s[1];
    bool wide = out->dtype == MT_F64;
    scratch sc;
    double stack[ROW_STACK];
    char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)L * 2 * (wide ? 8 : 4));
    if (!buf) return 1;
    for (int64_t r = rb; r < re; r++) {
        const char *src = A->base[0] + row_offset(&A->m[0], r);
        char *dst = A->base[1] + row_offset(&A->m[1], r);
        if (wide) {
            double *x = (double *)buf, *e = x + L;
            mt_cpu_load_f64(src, as, a->dtype, L, x);
            double m = max_d(x, L), s = 0;
            if (m == -INFINITY) m = 0; /* a row of -inf: exp gives 0, the sum 0, nan */
            for (int64_t i = 0; i < L; i++) s += (e[i] = exp(x[i] - m));
            if (A->is_log) {
                double lg = log(s);
                for (int64_t i = 0; i < L; i++) e[i] = (x[i] - m) - lg;
            } else {
                double inv = 1.0 / s;
                for (int64_t i = 0; i < L; i++) e[i] *= inv;
            }
            mt_cpu_store_f64(dst, os, out->dtype, L, e);
            continue;
        }
        float *x = (float *)buf, *e = x + L;
        const float *xs = x;
        if (a->dtype == MT_F32 && as == 4)
            xs = (const float *)src;
        else
            mt_cpu_load_f32(src, as, a->dtype, L, x);
        float m = mt_cpu_max_f32(xs, L, -INFINITY);
        if (m == -INFINITY) m = 0;
        bool direct = out->dtype == MT_F32 && os == 4;
        float *y = direct ? (float *)dst : e;
        float s = exp_sub_f(xs, m, y, L);
        if (A->is_log) {
            float lg = logf(s);
            for (int64_t i = 0; i < L; i++) y[i] = (xs[i] - m) - lg;
        } else {
            float inv = 1.0f / s;
            for (int64_t i = 0; i < L; i++) y[i] *= inv;
        }
        if (!direct) mt_cpu_store_f32(dst, os, out->dtype, L, y);
    }
    scratch_put(&sc);
    return 0;
}

int mt_cpu_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool is_log) {
    if (a->numel == 0) return 0;
    sm_args A;
    const mt_tensor *ts[2] = {a, out};
    sm_args_init(&A, 2, ts, dim, is_log);
    if (tiles_apply(&A, 2)) {
        for_ranges(softmax_tiles, &A, tile_tasks(&A), a->numel * 4);
        return 0;
    }
    return for_ranges(softmax_rows, &A, A.rows, a->numel * 4) ? oom("mt_softmax", A.L) : 0;
}

/* ---------------------------------------------------------------- softmax backward */

/* rows [rb, re); operands: 0 = y, 1 = grad_out, 2 = grad_in.
   softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
MT_CPU_CLONES static int softmax_backward_rows(void *ctx, int64_t rb, int64_t re) {
    const sm_args *A = ctx;
    const mt_tensor *y = A->t[0], *go = A->t[1], *gi = A->t[2];
    int64_t L = A->L, ys = A->s[0], gs = A->s[1], xs = A->s[2];
    bool wide = y->dtype == MT_F64 || gi->dtype == MT_F64;
    scratch sc;
    double stack[ROW_STACK];
    char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)L * 2 * (wide ? 8 : 4));
    if (!buf) return 1;
    for (int64_t r = rb; r < re; r++) {
        const char *yp = A->base[0] + row_offset(&A->m[0], r);
        const char *gp = A->base[1] + row_offset(&A->m[1], r);
        char *xp = A->base[2] + row_offset(&A->m[2], r);
        if (wide) {
            double *g = (double *)buf, *v = g + L;
            mt_cpu_load_f64(gp, gs, go->dtype, L, g);
            mt_cpu_load_f64(yp, ys, y->dtype, L, v);
            double s = 0;
            if (A->is_log) {
                for (int64_t i = 0; i < L; i++) s += g[i];
                for (int64_t i = 0; i < L; i++) g[i] -= exp(v[i]) * s;
            } else {
                for (int64_t i = 0; i < L; i++) s += g[i] * v[i];
                for (int64_t i = 0; i < L; i++) g[i] = v[i] * (g[i] - s);
            }
            mt_cpu_store_f64(xp, xs, gi->dtype, L, g);
            continue;
        }
        float *g = (float *)buf, *v = g + L;
        mt_cpu_load_f32(gp, gs, go->dtype, L, g);
        const float *yv = v;
        if (y->dtype == MT_F32 && ys == 4)
            yv = (const float *)yp;
        else
            mt_cpu_load_f32(yp, ys, y->dtype, L, v);
        bool direct = gi->dtype == MT_F32 && xs == 4;
        float *o = direct ? (float *)xp : g;
        if (A->is_log) {
            float s = (float)mt_cpu_sum_f32(g, L);
            for (int64_t i = 0; i < L; i++) o[i] = g[i] - exp_vf(yv[i]) * s;
        } else {
            float s = (float)mt_cpu_dot_f32(g, yv, L);
            for (int64_t i = 0; i < L; i++) o[i] = yv[i] * (g[i] - s);
        }
        if (!direct) mt_cpu_store_f32(xp, xs, gi->dtype, L, o);
    }
    scratch_put(&sc);
    return 0;
}

int mt_cpu_softmax_backward(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y,
                            int dim, bool is_log) {
    if (y->numel == 0) return 0;
    sm_args A;
    const mt_tensor *ts[3] = {y, grad_out, grad_in};
    sm_args_init(&A, 3, ts, dim, is_log);
    if (tiles_apply(&A, 3)) {
        for_ranges(softmax_backward_tiles, &A, tile_tasks(&A), y->numel * 2);
        return 0;
    }
    return for_ranges(softmax_backward_rows, &A, A.rows, y->numel * 2)
               ? oom("mt_softmax_backward", A.L)
               : 0;
}

/* ---------------------------------------------------------------- cross entropy */

typedef struct {
    const mt_tensor *logits, *labels, *lse, *scale;
    mt_tensor *loss, *grad;
    int64_t N, C, ignore;
    double k; /* backward scale */
    int64_t count;
} ce_args;

static inline int64_t label_at(const mt_tensor *labels, int64_t r) {
    const int64_t *p = (const int64_t *)mt_tensor_data(labels);
    return p[r * (labels->ndim ? labels->strides[0] : 0)];
}

static inline char *elem(const mt_tensor *t, int64_t r, int64_t c) {
    int64_t es = (int64_t)mt_dtype_size(t->dtype);
    return (char *)mt_tensor_data(t) +
           (r * t->strides[0] + c * (t->ndim > 1 ? t->strides[1] : 0)) * es;
}

/* loss[r] = (max_r - x[r, label_r]) + log(sum_i exp(x[r, i] - max_r)), and lse[r] = (max_r,
   that log) for the backward, in their dtype (F32, or F64 for F64 logits). Labels were
   range-checked by the op. */
static int ce_rows(void *ctx, int64_t rb, int64_t re) {
    ce_args *A = ctx;
    const mt_tensor *x = A->logits;
    int64_t C = A->C, es = (int64_t)mt_dtype_size(x->dtype), cs = x->strides[1] * es;
    bool wide = x->dtype == MT_F64;
    scratch sc;
    double stack[ROW_STACK];
    char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)C * 2 * (wide ? 8 : 4));
    if (!buf) return 1;
    int64_t count = 0;
    for (int64_t r = rb; r < re; r++) {
        int64_t lab = label_at(A->labels, r);
        const char *row = elem(x, r, 0);
        double l = 0, stat[2] = {0, 0}; /* max, log of the sum */
        if (lab != A->ignore && wide) {
            double *v = (double *)buf;
            mt_cpu_load_f64(row, cs, x->dtype, C, v);
            double m = max_d(v, C), acc = 0;
            if (m == -INFINITY) m = 0;
            for (int64_t i = 0; i < C; i++) acc += exp(v[i] - m);
            stat[0] = m;
            stat[1] = log(acc);
            l = (m - v[lab]) + stat[1];
            count++;
        } else if (lab != A->ignore) {
            float *v = (float *)buf, *e = v + C;
            const float *xs = v;
            if (x->dtype == MT_F32 && cs == 4)
                xs = (const float *)row;
            else
                mt_cpu_load_f32(row, cs, x->dtype, C, v);
            float m = mt_cpu_max_f32(xs, C, -INFINITY);
            if (m == -INFINITY) m = 0;
            float acc = exp_sub_f(xs, m, e, C), log_acc = logf(acc);
            stat[0] = m;
            stat[1] = log_acc;
            l = (double)((m - xs[lab]) + log_acc);
            count++;
        }
        mt_cpu_store_f64(elem(A->loss, r, 0), 0, A->loss->dtype, 1, &l);
        mt_cpu_store_f64(elem(A->lse, r, 0),
                         A->lse->strides[1] * (int64_t)mt_dtype_size(A->lse->dtype), A->lse->dtype,
                         2, stat);
    }
    scratch_put(&sc);
#pragma omp atomic
    A->count += count;
    return 0;
}

int mt_cpu_cross_entropy(mt_tensor *loss, mt_tensor *lse, mt_tensor *valid, const mt_tensor *logits,
                         const mt_tensor *labels, int64_t ignore_index) {
    ce_args A = {.logits = logits,
                 .labels = labels,
                 .lse = lse,
                 .loss = loss,
                 .N = logits->shape[0],
                 .C = logits->shape[1],
                 .ignore = ignore_index};
    int failed = for_ranges(ce_rows, &A, A.N, A.N * A.C * 4);
    if (failed) return oom("mt_cross_entropy", A.C);
    double count = (double)A.count;
    mt_cpu_store_f64(mt_tensor_data(valid), 0, valid->dtype, 1, &count);
    return 0;
}

/* grad[r, c] = (exp((x[r, c] - max_r) - log_sum_r) - (c == label_r)) * scale; ignored rows
   get zeros. */
MT_CPU_CLONES static int ce_backward_rows(void *ctx, int64_t rb, int64_t re) {
    ce_args *A = ctx;
    const mt_tensor *x = A->logits;
    mt_tensor *gr = A->grad;
    int64_t C = A->C, es = (int64_t)mt_dtype_size(x->dtype), cs = x->strides[1] * es;
    int64_t gcs = gr->strides[1] * (int64_t)mt_dtype_size(gr->dtype);
    bool wide = x->dtype == MT_F64 || gr->dtype == MT_F64;
    scratch sc;
    double stack[ROW_STACK];
    char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)C * (wide ? 8 : 4));
    if (!buf) return 1;
    double k = A->k;
    for (int64_t r = rb; r < re; r++) {
        int64_t lab = label_at(A->labels, r);
        double stat[2]; /* max, log of the sum */
        mt_cpu_load_f64(elem(A->lse, r, 0),
                        A->lse->strides[1] * (int64_t)mt_dtype_size(A->lse->dtype), A->lse->dtype,
                        2, stat);
        const char *row = elem(x, r, 0);
        char *gp = elem(gr, r, 0);
        if (wide) {
            double *v = (double *)buf;
            if (lab == A->ignore) {
                memset(v, 0, (size_t)C * sizeof *v);
            } else {
                mt_cpu_load_f64(row, cs, x->dtype, C, v);
                for (int64_t i = 0; i < C; i++) v[i] = exp((v[i] - stat[0]) - stat[1]) * k;
                v[lab] -= k;
            }
            mt_cpu_store_f64(gp, gcs, gr->dtype, C, v);
            continue;
        }
        float *v = (float *)buf;
        bool direct = gr->dtype == MT_F32 && gcs == 4;
        float *o = direct ? (float *)gp : v;
        if (lab == A->ignore) {
            memset(o, 0, (size_t)C * sizeof *o);
        } else {
            const float *xs = v;
            if (x->dtype == MT_F32 && cs == 4)
                xs = (const float *)row;
            else
                mt_cpu_load_f32(row, cs, x->dtype, C, v);
            float fm = (float)stat[0], fl = (float)stat[1], fk = (float)k;
            for (int64_t i = 0; i < C; i++) o[i] = exp_vf((xs[i] - fm) - fl) * fk;
            o[lab] -= fk;
        }
        if (!direct) mt_cpu_store_f32(gp, gcs, gr->dtype, C, o);
    }
    scratch_put(&sc);
    return 0;
}

int mt_cpu_cross_entropy_backward(mt_tensor *grad_logits, const mt_tensor *logits,
                                  const mt_tensor *labels, const mt_tensor *lse,
                                  const mt_tensor *scale, int64_t ignore_index) {
    ce_args A = {.logits = logits,
                 .labels = labels,
                 .lse = lse,
                 .grad = grad_logits,
                 .N = logits->shape[0],
                 .C = logits->shape[1],
                 .ignore = ignore_index};
    mt_cpu_load_f64(mt_tensor_data(scale), 0, scale->dtype, 1, &A.k);
    return for_ranges(ce_backward_rows, &A, A.N, A.N * A.C * 2)
               ? oom("mt_cross_entropy_backward", A.C)
               : 0;
}

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

#define ROW_STACK 2048 /* rows up to this length use stack buffers */
#define LANES     16

/* ---------------------------------------------------------------- vector-friendly math */

/* exp(x) for float, Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, times
   2^n built from the exponent bits. Below -87.3 it returns 0, above 88.7 inf, NaN stays. */
static inline float exp_vf(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    xc = xc < 88.7f ? xc : 88.7f;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: its low mantissa bits are n itself */
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (int32_t)((uint32_t)(ti - 0x4B400000 + 127) << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x < -87.3f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    return x != x ? x : y;
}

static inline float maxf(float m, float x) {
    return (x > m || x != x) ? x : m;
}

/* MAXW lanes held in an array so the loop vectoriser (not SLP) takes the select with its
   NaN test; NaN propagates. */
#define MAXW 64
static float max_f(const float *restrict x, int64_t n) {
    float acc[MAXW];
    for (int j = 0; j < MAXW; j++) acc[j] = -INFINITY;
    int64_t i = 0;
    for (; i + MAXW <= n; i += MAXW)
        for (int j = 0; j < MAXW; j++) acc[j] = maxf(acc[j], x[i + j]);
    float m = -INFINITY;
    for (; i < n; i++) m = maxf(m, x[i]);
    for (int j = 0; j < MAXW; j++) m = maxf(m, acc[j]);
    return m;
}

/* Sum in FP32 lanes over blocks of 4096, block totals in double: long rows stay accurate. */
static float sum_f(const float *restrict x, int64_t n) {
    double total = 0;
    for (int64_t b = 0; b < n; b += 4096) {
        int64_t m = n - b < 4096 ? n - b : 4096;
        const float *restrict p = x + b;
        float acc[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= m; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += p[i + j];
        float tail = 0;
        for (; i < m; i++) tail += p[i];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        total += (double)acc[0] + (double)tail;
    }
    return (float)total;
}

/* sum of x * y, blocked like sum_f */
static float dot_f(const float *restrict x, const float *restrict y, int64_t n) {
    double total = 0;
    for (int64_t b = 0; b < n; b += 4096) {
        int64_t m = n - b < 4096 ? n - b : 4096;
        float acc[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= m; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[b + i + j] * y[b + i + j];
        float tail = 0;
        for (; i < m; i++) tail += x[b + i] * y[b + i];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        total += (double)acc[0] + (double)tail;
    }
    return (float)total;
}

/* e[i] = exp(x[i] - m); returns the sum */
static float exp_sub_f(const float *restrict x, float m, float *restrict e, int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = exp_vf(x[i] - m);
    return sum_f(e, n);
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

/* Per-thread scratch of `n` elements per buffer, `k` buffers: the stack when small. */
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

static bool run_parallel(int64_t work) {
    return mt_cpu_num_threads() > 1 && work >= MT_CPU_PARALLEL_MIN;
}

static int oom(const char *op, int64_t n) {
    return mt_error_set(MT_ERR_OOM, "%s: out of memory for a row buffer of %lld elements", op,
                        (long long)n);
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

/* True when the innermost other dim of every map is contiguous (and so tiles apply). */
static bool tiles_apply(const row_map *const *maps, const mt_tensor *const *ts, int n, int64_t L) {
    if (L < 2 || maps[0]->nd == 0) return false;
    for (int i = 0; i < n; i++) {
        const row_map *m = maps[i];
        if (ts[i]->dtype == MT_F64 || m->nd != maps[0]->nd ||
            m->stride[m->nd - 1] != (int64_t)mt_dtype_size(ts[i]->dtype))
            return false;
    }
    return maps[0]->shape[maps[0]->nd - 1] >= 4;
}

typedef struct {
    int64_t V, chunks, tasks;
} tile_plan;

static tile_plan tile_plan_of(const row_map *m, int64_t rows) {
    tile_plan t;
    t.V = m->shape[m->nd - 1];
    t.chunks = (t.V + TILE - 1) / TILE;
    t.tasks = rows / t.V * t.chunks;
    return t;
}

/* first row and width of tile task k */
static inline int64_t tile_row(const tile_plan *t, int64_t k, int *w) {
    int64_t line = k / t->chunks, c0 = (k % t->chunks) * TILE;
    *w = (int)(t->V - c0 < TILE ? t->V - c0 : TILE);
    return line * t->V + c0;
}

static void softmax_tiles(mt_tensor *out, const mt_tensor *a, int64_t L, int64_t as, int64_t os,
                          const row_map *am, const row_map *om, int64_t rows, bool is_log) {
    tile_plan tp = tile_plan_of(am, rows);
    const char *ab = mt_tensor_data(a);
    char *ob = mt_tensor_data(out);
    mt_dtype dt = a->dtype, odt = out->dtype;
#pragma omp parallel for schedule(static)                                                          \
    num_threads(mt_cpu_num_threads()) if (run_parallel(a->numel * 4))
    for (int64_t k = 0; k < tp.tasks; k++) {
        int w;
        int64_t r0 = tile_row(&tp, k, &w);
        const char *src = ab + row_offset(am, r0);
        char *dst = ob + row_offset(om, r0);
        float m[TILE], tmp[TILE], y[TILE], sub[TILE];
        double s[TILE];
        for (int j = 0; j < w; j++) {
            m[j] = -INFINITY;
            s[j] = 0;
        }
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            for (int j = 0; j < w; j++) m[j] = maxf(m[j], x[j]);
        }
        for (int j = 0; j < w; j++) m[j] = m[j] == -INFINITY ? 0.0f : m[j];
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            for (int j = 0; j < w; j++) y[j] = exp_vf(x[j] - m[j]);
            for (int j = 0; j < w; j++) s[j] += y[j];
        }
        /* softmax: exp(x - m) / s; log_softmax: (x - m) - log(s) */
        for (int j = 0; j < w; j++) sub[j] = is_log ? (float)log(s[j]) : (float)(1.0 / s[j]);
        for (int64_t l = 0; l < L; l++) {
            const float *x = tile_load(src + l * as, dt, w, tmp);
            float *o = odt == MT_F32 ? (float *)(dst + l * os) : y;
            if (is_log)
                for (int j = 0; j < w; j++) o[j] = (x[j] - m[j]) - sub[j];
            else
                for (int j = 0; j < w; j++) o[j] = exp_vf(x[j] - m[j]) * sub[j];
            if (odt != MT_F32)
                mt_cpu_store_f32(dst + l * os, (int64_t)mt_dtype_size(odt), odt, w, o);
        }
    }
}

/* softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
static void softmax_backward_tiles(mt_tensor *gi, const mt_tensor *go, const mt_tensor *y,
                                   int64_t L, int64_t xs, int64_t gs, int64_t ys, const row_map *xm,
                                   const row_map *gm, const row_map *ym, int64_t rows,
                                   bool is_log) {
    tile_plan tp = tile_plan_of(ym, rows);
    const char *gb = mt_tensor_data(go), *yb = mt_tensor_data(y);
    char *xb = mt_tensor_data(gi);
#pragma omp parallel for schedule(static)                                                          \
    num_threads(mt_cpu_num_threads()) if (run_parallel(y->numel * 2))
    for (int64_t k = 0; k < tp.tasks; k++) {
        int w;
        int64_t r0 = tile_row(&tp, k, &w);
        const char *gp = gb + row_offset(gm, r0), *yp = yb + row_offset(ym, r0);
        char *xp = xb + row_offset(xm, r0);
        float t1[TILE], t2[TILE], o[TILE], sf[TILE];
        double s[TILE];
        for (int j = 0; j < w; j++) s[j] = 0;
        for (int64_t l = 0; l < L; l++) {
            const float *g = tile_load(gp + l * gs, go->dtype, w, t1);
            if (is_log) {
                for (int j = 0; j < w; j++) s[j] += g[j];
            } else {
                const float *v = tile_load(yp + l * ys, y->dtype, w, t2);
                for (int j = 0; j < w; j++) s[j] += g[j] * v[j];
            }
        }
        for (int j = 0; j < w; j++) sf[j] = (float)s[j];
        for (int64_t l = 0; l < L; l++) {
            const float *g = tile_load(gp + l * gs, go->dtype, w, t1);
            const float *v = tile_load(yp + l * ys, y->dtype, w, t2);
            float *dst = gi->dtype == MT_F32 ? (float *)(xp + l * xs) : o;
            if (is_log)
                for (int j = 0; j < w; j++) dst[j] = g[j] - exp_vf(v[j]) * sf[j];
            else
                for (int j = 0; j < w; j++) dst[j] = v[j] * (g[j] - sf[j]);
            if (gi->dtype != MT_F32)
                mt_cpu_store_f32(xp + l * xs, (int64_t)mt_dtype_size(gi->dtype), gi->dtype, w, dst);
        }
    }
}

/* ---------------------------------------------------------------- softmax forward */

int mt_cpu_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool is_log) {
    int64_t L = a->ndim ? a->shape[dim] : 1;
    if (a->numel == 0) return 0;
    int64_t rows = a->numel / L;
    row_map am, om;
    row_map_init(&am, a, dim);
    row_map_init(&om, out, dim);
    int64_t ies = (int64_t)mt_dtype_size(a->dtype), oes = (int64_t)mt_dtype_size(out->dtype);
    int64_t as = a->ndim ? a->strides[dim] * ies : ies,
            os = out->ndim ? out->strides[dim] * oes : oes;
    const char *ab = mt_tensor_data(a);
    char *ob = mt_tensor_data(out);
    const row_map *maps[2] = {&am, &om};
    const mt_tensor *ts[2] = {a, out};
    if (tiles_apply(maps, ts, 2, L)) {
        softmax_tiles(out, a, L, as, os, &am, &om, rows, is_log);
        return 0;
    }
    bool wide = out->dtype == MT_F64;
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (run_parallel(a->numel * 4))
    {
        scratch sc;
        double stack[ROW_STACK];
        size_t es = wide ? 8 : 4;
        char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)L * 2 * es);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf) continue;
            const char *src = ab + row_offset(&am, r);
            char *dst = ob + row_offset(&om, r);
            if (wide) {
                double *x = (double *)buf, *e = x + L;
                mt_cpu_load_f64(src, as, a->dtype, L, x);
                double m = max_d(x, L), s = 0;
                if (m == -INFINITY) m = 0; /* a row of -inf: exp(-inf) = 0, sum 0, nan */
                for (int64_t i = 0; i < L; i++) s += (e[i] = exp(x[i] - m));
                if (is_log) {
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
            float m = max_f(xs, L);
            if (m == -INFINITY) m = 0;
            bool direct = out->dtype == MT_F32 && os == 4;
            float *y = direct ? (float *)dst : e;
            float s = exp_sub_f(xs, m, y, L);
            if (is_log) {
                float lg = logf(s);
                for (int64_t i = 0; i < L; i++) y[i] = (xs[i] - m) - lg;
            } else {
                float inv = 1.0f / s;
                for (int64_t i = 0; i < L; i++) y[i] *= inv;
            }
            if (!direct) mt_cpu_store_f32(dst, os, out->dtype, L, y);
        }
        scratch_put(&sc);
    }
    return failed ? oom("mt_softmax", L) : 0;
}

/* ---------------------------------------------------------------- softmax backward */

/* softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
int mt_cpu_softmax_backward(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y,
                            int dim, bool is_log) {
    int64_t L = y->ndim ? y->shape[dim] : 1;
    if (y->numel == 0) return 0;
    int64_t rows = y->numel / L;
    row_map gm, ym, xm;
    row_map_init(&gm, grad_out, dim);
    row_map_init(&ym, y, dim);
    row_map_init(&xm, grad_in, dim);
    int64_t ges = (int64_t)mt_dtype_size(grad_out->dtype), yes = (int64_t)mt_dtype_size(y->dtype),
            xes = (int64_t)mt_dtype_size(grad_in->dtype);
    int64_t gs = y->ndim ? grad_out->strides[dim] * ges : ges;
    int64_t ys = y->ndim ? y->strides[dim] * yes : yes;
    int64_t xs = y->ndim ? grad_in->strides[dim] * xes : xes;
    const char *gb = mt_tensor_data(grad_out), *yb = mt_tensor_data(y);
    char *xb = mt_tensor_data(grad_in);
    const row_map *maps[3] = {&ym, &gm, &xm};
    const mt_tensor *ts[3] = {y, grad_out, grad_in};
    if (tiles_apply(maps, ts, 3, L)) {
        softmax_backward_tiles(grad_in, grad_out, y, L, xs, gs, ys, &xm, &gm, &ym, rows, is_log);
        return 0;
    }
    bool wide = y->dtype == MT_F64 || grad_in->dtype == MT_F64;
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (run_parallel(y->numel * 2))
    {
        scratch sc;
        double stack[ROW_STACK];
        size_t es = wide ? 8 : 4;
        char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)L * 2 * es);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf) continue;
            const char *gp = gb + row_offset(&gm, r), *yp = yb + row_offset(&ym, r);
            char *xp = xb + row_offset(&xm, r);
            if (wide) {
                double *g = (double *)buf, *v = g + L;
                mt_cpu_load_f64(gp, gs, grad_out->dtype, L, g);
                mt_cpu_load_f64(yp, ys, y->dtype, L, v);
                double s = 0;
                if (is_log) {
                    for (int64_t i = 0; i < L; i++) s += g[i];
                    for (int64_t i = 0; i < L; i++) g[i] -= exp(v[i]) * s;
                } else {
                    for (int64_t i = 0; i < L; i++) s += g[i] * v[i];
                    for (int64_t i = 0; i < L; i++) g[i] = v[i] * (g[i] - s);
                }
                mt_cpu_store_f64(xp, xs, grad_in->dtype, L, g);
                continue;
            }
            float *g = (float *)buf, *v = g + L;
            mt_cpu_load_f32(gp, gs, grad_out->dtype, L, g);
            const float *yv = v;
            if (y->dtype == MT_F32 && ys == 4)
                yv = (const float *)yp;
            else
                mt_cpu_load_f32(yp, ys, y->dtype, L, v);
            bool direct = grad_in->dtype == MT_F32 && xs == 4;
            float *o = direct ? (float *)xp : g;
            if (is_log) {
                float s = sum_f(g, L);
                for (int64_t i = 0; i < L; i++) o[i] = g[i] - exp_vf(yv[i]) * s;
            } else {
                float s = dot_f(g, yv, L);
                for (int64_t i = 0; i < L; i++) o[i] = yv[i] * (g[i] - s);
            }
            if (!direct) mt_cpu_store_f32(xp, xs, grad_in->dtype, L, o);
        }
        scratch_put(&sc);
    }
    return failed ? oom("mt_softmax_backward", L) : 0;
}

/* ---------------------------------------------------------------- cross entropy */

static inline int64_t label_at(const mt_tensor *labels, int64_t r) {
    const int64_t *p = (const int64_t *)mt_tensor_data(labels);
    return p[r * (labels->ndim ? labels->strides[0] : 0)];
}

/* loss[r] = lse_r - x[r, label_r]; lse and loss are written in their dtype (F32, or F64 for
   F64 logits). Labels were range-checked by the op. */
int mt_cpu_cross_entropy(mt_tensor *loss, mt_tensor *lse, const mt_tensor *logits,
                         const mt_tensor *labels, int64_t ignore_index, int64_t *valid) {
    int64_t N = logits->shape[0], C = logits->shape[1];
    int64_t es = (int64_t)mt_dtype_size(logits->dtype);
    int64_t rs = logits->strides[0] * es, cs = logits->strides[1] * es;
    int64_t les = (int64_t)mt_dtype_size(loss->dtype), ses = (int64_t)mt_dtype_size(lse->dtype);
    const char *xb = mt_tensor_data(logits);
    char *lb = mt_tensor_data(loss), *sb = mt_tensor_data(lse);
    int64_t lstride = loss->strides[0] * les, sstride = lse->strides[0] * ses;
    bool wide = logits->dtype == MT_F64;
    int64_t count = 0;
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (run_parallel(N * C * 4))
    {
        scratch sc;
        double stack[ROW_STACK];
        char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)C * 2 * (wide ? 8 : 4));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static) reduction(+ : count)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            int64_t lab = label_at(labels, r);
            double l = 0, s;
            if (lab == ignore_index) {
                s = 0;
            } else if (wide) {
                double *x = (double *)buf;
                mt_cpu_load_f64(xb + r * rs, cs, logits->dtype, C, x);
                double m = max_d(x, C), acc = 0;
                if (m == -INFINITY) m = 0;
                for (int64_t i = 0; i < C; i++) acc += exp(x[i] - m);
                s = m + log(acc);
                l = s - x[lab];
                count++;
            } else {
                float *x = (float *)buf, *e = x + C;
                const float *xs = x;
                if (logits->dtype == MT_F32 && cs == 4)
                    xs = (const float *)(xb + r * rs);
                else
                    mt_cpu_load_f32(xb + r * rs, cs, logits->dtype, C, x);
                float m = max_f(xs, C);
                if (m == -INFINITY) m = 0;
                float acc = exp_sub_f(xs, m, e, C);
                s = (double)(m + logf(acc));
                l = s - (double)xs[lab];
                count++;
            }
            mt_cpu_store_f64(lb + r * lstride, 0, loss->dtype, 1, &l);
            mt_cpu_store_f64(sb + r * sstride, 0, lse->dtype, 1, &s);
        }
        scratch_put(&sc);
    }
    *valid = count;
    return failed ? oom("mt_cross_entropy", C) : 0;
}

/* grad[r, c] = (exp(x[r, c] - lse[r]) - (c == label_r)) * scale; ignored rows get zeros. */
int mt_cpu_cross_entropy_backward(mt_tensor *grad_logits, const mt_tensor *logits,
                                  const mt_tensor *labels, const mt_tensor *lse,
                                  const mt_tensor *scale, int64_t ignore_index) {
    int64_t N = logits->shape[0], C = logits->shape[1];
    int64_t es = (int64_t)mt_dtype_size(logits->dtype),
            ges = (int64_t)mt_dtype_size(grad_logits->dtype);
    int64_t rs = logits->strides[0] * es, cs = logits->strides[1] * es;
    int64_t grs = grad_logits->strides[0] * ges, gcs = grad_logits->strides[1] * ges;
    int64_t ses = (int64_t)mt_dtype_size(lse->dtype), sstride = lse->strides[0] * ses;
    const char *xb = mt_tensor_data(logits), *sb = mt_tensor_data(lse);
    char *gb = mt_tensor_data(grad_logits);
    double k;
    mt_cpu_load_f64(mt_tensor_data(scale), 0, scale->dtype, 1, &k);
    bool wide = logits->dtype == MT_F64 || grad_logits->dtype == MT_F64;
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (run_parallel(N * C * 2))
    {
        scratch sc;
        double stack[ROW_STACK];
        char *buf = scratch_get(&sc, stack, sizeof stack, (size_t)C * (wide ? 8 : 4));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            int64_t lab = label_at(labels, r);
            double s;
            mt_cpu_load_f64(sb + r * sstride, 0, lse->dtype, 1, &s);
            char *gp = gb + r * grs;
            if (wide) {
                double *x = (double *)buf;
                if (lab == ignore_index) {
                    memset(x, 0, (size_t)C * sizeof *x);
                } else {
                    mt_cpu_load_f64(xb + r * rs, cs, logits->dtype, C, x);
                    for (int64_t i = 0; i < C; i++) x[i] = exp(x[i] - s) * k;
                    x[lab] -= k;
                }
                mt_cpu_store_f64(gp, gcs, grad_logits->dtype, C, x);
                continue;
            }
            float *x = (float *)buf;
            bool direct = grad_logits->dtype == MT_F32 && gcs == 4;
            float *o = direct ? (float *)gp : x;
            if (lab == ignore_index) {
                memset(o, 0, (size_t)C * sizeof *o);
            } else {
                const float *xs = x;
                if (logits->dtype == MT_F32 && cs == 4)
                    xs = (const float *)(xb + r * rs);
                else
                    mt_cpu_load_f32(xb + r * rs, cs, logits->dtype, C, x);
                float fs = (float)s, fk = (float)k;
                for (int64_t i = 0; i < C; i++) o[i] = exp_vf(xs[i] - fs) * fk;
                o[lab] -= fk;
            }
            if (!direct) mt_cpu_store_f32(gp, gcs, grad_logits->dtype, C, o);
        }
        scratch_put(&sc);
    }
    return failed ? oom("mt_cross_entropy_backward", C) : 0;
}

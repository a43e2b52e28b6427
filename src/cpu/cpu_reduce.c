/* Reductions (SUM, MEAN, MAX) over a dim mask, any input layout, keepdim output.

   Plan: size-1 dims are dropped; the kept dims (in order) and the reduced dims (sorted by
   stride) are each coalesced where the layout allows. Two shapes of work follow:
   - row mode: the innermost reduced dim is walked as a run (contiguous when its stride is
     one element), each output reducing its runs with blocked vector accumulators;
   - column mode: when a kept dim is the contiguous one (sum over dim 0 of [N, C]), chunks
     of that dim are accumulated across the reduced dims, the vector running along the
     output.
   Accuracy: F32/F16/BF16 accumulate in FP32 vector lanes over blocks of at most 4096
   elements (16 lanes: 256 adds per lane), and block totals are added in double; F64 runs in
   double throughout. Parallelism: over outputs when there are enough of them, else over the
   reduced range with per-thread partials combined at the end; nothing below
   MT_CPU_PARALLEL_MIN elements. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "cpu.h"
#include "../tensor/reduce_geom.h"

/* Comparisons that may see NaN keep GCC from if-converting (and so vectorising) the max
   selects unless FP exceptions are declared unobserved; we never read them. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "cpu_vec.h"

#define CONV      512 /* conversion buffer for strided or low-precision runs */
#define COLW      256 /* column-mode chunk width */
#define COL_FLUSH 256 /* column-mode FP32 adds per lane before flushing to double */

typedef struct {
    mt_op_id op;
    mt_dtype dt, odt;
    int64_t es; /* input element size */
    const char *a;
    char *o;
    /* kept dims, outermost first; in column mode the last one is the contiguous one */
    int nk;
    int64_t kshape[MT_MAX_DIMS], kstride[MT_MAX_DIMS], ostride[MT_MAX_DIMS]; /* bytes */
    /* reduced dims, outermost first; the last is the run */
    int nr;
    int64_t rshape[MT_MAX_DIMS], rstride[MT_MAX_DIMS]; /* bytes */
    int64_t K, R;
    bool column;
} plan;

/* ---------------------------------------------------------------- run kernels */

static inline double maxd(double m, double x) {
    return (x > m || x != x) ? x : m;
}

/* Sum of an F64 run, half the FP32 lanes (same vector width); the FP32 runs are in
   cpu_vec.h. */
static double sum_run_d(const double *restrict x, int64_t n) {
    double acc[MT_CPU_LANES / 2] = {0}, tail = 0;
    int64_t i = 0;
    for (; i + MT_CPU_LANES / 2 <= n; i += MT_CPU_LANES / 2)
        for (int j = 0; j < MT_CPU_LANES / 2; j++) acc[j] += x[i + j];
    for (; i < n; i++) tail += x[i];
    for (int w = MT_CPU_LANES / 4; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0] + tail;
}

/* Max over an F64 run, likewise. */
static double max_run_d(const double *restrict x, int64_t n, double m0) {
    double acc[MT_CPU_MAX_LANES / 2];
    for (int j = 0; j < MT_CPU_MAX_LANES / 2; j++) acc[j] = m0;
    int64_t i = 0;
    for (; i + MT_CPU_MAX_LANES / 2 <= n; i += MT_CPU_MAX_LANES / 2)
        for (int j = 0; j < MT_CPU_MAX_LANES / 2; j++) acc[j] = maxd(acc[j], x[i + j]);
    double m = m0;
    for (; i < n; i++) m = maxd(m, x[i]);
    for (int j = 0; j < MT_CPU_MAX_LANES / 2; j++) m = maxd(m, acc[j]);
    return m;
}

/* Folds n elements at p (stride s bytes) into acc (a sum, or a max for MAX). */
static double reduce_run(const plan *P, const char *p, int64_t s, int64_t n, double acc) {
    bool is_max = P->op == MT_OP_MAX;
    if (n <= 16 && P->dt == MT_F32) { /* short runs: no lane set-up */
        if (is_max) {
            for (int64_t i = 0; i < n; i++) acc = maxd(acc, *(const float *)(p + i * s));
        } else {
            float t = 0;
            for (int64_t i = 0; i < n; i++) t += *(const float *)(p + i * s);
            acc += t;
        }
        return acc;
    }
    if (P->dt == MT_F32 && s == 4) {
        return is_max ? (double)mt_cpu_max_f32((const float *)p, n, (float)acc)
                      : acc + mt_cpu_sum_f32((const float *)p, n);
    }
    if (P->dt == MT_F64 && s == 8)
        return is_max ? max_run_d((const double *)p, n, acc)
                      : acc + sum_run_d((const double *)p, n);
    for (int64_t i = 0; i < n; i += CONV) {
        int64_t m = n - i < CONV ? n - i : CONV;
        if (P->dt == MT_F64) {
            double buf[CONV];
            mt_cpu_load_f64(p + i * s, s, P->dt, m, buf);
            acc = is_max ? max_run_d(buf, m, acc) : acc + sum_run_d(buf, m);
        } else {
            float buf[CONV];
            mt_cpu_load_f32(p + i * s, s, P->dt, m, buf);
            acc =
                is_max ? (double)mt_cpu_max_f32(buf, m, (float)acc) : acc + mt_cpu_sum_f32(buf, m);
        }
    }
    return acc;
}

static inline double identity(const plan *P) {
    return P->op == MT_OP_MAX ? -INFINITY : 0.0;
}
static inline double combine(const plan *P, double a, double b) {
    return P->op == MT_OP_MAX ? maxd(a, b) : a + b;
}

/* Byte offset of reduced flat index r, and its multi-index in idx. */
static int64_t reduced_offset(const plan *P, int64_t r, int64_t *idx) {
    int64_t off = 0;
    for (int d = P->nr - 1; d >= 0; d--) {
        idx[d] = r % P->rshape[d];
        r /= P->rshape[d];
        off += idx[d] * P->rstride[d];
    }
    return off;
}

/* Advances idx (and off) by one step of the dims above `last`; the run dim is handled by
   the caller. */
static int64_t advance(const plan *P, int last, int64_t *idx, int64_t off) {
    for (int d = last; d >= 0; d--) {
        idx[d]++;
        off += P->rstride[d];
        if (idx[d] < P->rshape[d] || d == 0) break;
        off -= idx[d] * P->rstride[d];
        idx[d] = 0;
    }
    return off;
}

/* Row mode: output whose input base is `base`, reduced flat range [rb, re). */
static double row_partial(const plan *P, const char *base, int64_t rb, int64_t re) {
    double acc = identity(P);
    int last = P->nr - 1;
    int64_t L = P->rshape[last], s = P->rstride[last];
    int64_t idx[MT_MAX_DIMS];
    int64_t off = reduced_offset(P, rb, idx);
    int64_t pos = rb;
    while (pos < re) {
        int64_t n = L - idx[last];
        if (n > re - pos) n = re - pos;
        acc = reduce_run(P, base + off, s, n, acc);
        pos += n;
        if (pos >= re) break;
        off -= idx[last] * s; /* back to the start of the run, then the next run */
        idx[last] = 0;
        off = last > 0 ? advance(P, last - 1, idx, off) : off;
    }
    return acc;
}

/* Column mode: cw consecutive outputs along the contiguous kept dim starting at base, over
   reduced flat range [rb, re); results into res[0..cw). The innermost reduced dim is walked
   with a pointer step; FP32 lanes are flushed to double every COL_FLUSH rows. Narrow columns
   whose rows follow each other ([N, 4] over dim 0) are packed: PACKW / cw rows per step, so
   the vector stays wide. Compiled per x86-64 level (each column sums in its own lane, in row
   order, whatever the vector width: the clones give the same bits). */
#define PACKW 64
MT_CPU_CLONES static void col_partial(const plan *P, const char *base, int cw, int64_t rb,
                                      int64_t re, double *res) {
    bool is_max = P->op == MT_OP_MAX, f64 = P->dt == MT_F64, f32 = P->dt == MT_F32;
    int64_t idx[MT_MAX_DIMS];
    int64_t off = reduced_offset(P, rb, idx);
    int last = P->nr - 1;
    int64_t L = P->rshape[last], s = P->rstride[last];
    float init = is_max ? -INFINITY : 0.0f;
    for (int j = 0; j < cw; j++) res[j] = identity(P);
    float acc[COLW], buf[COLW], wide[PACKW];
    for (int j = 0; j < cw; j++) acc[j] = init;
    bool packed = !f64 && cw <= PACKW / 2 && s == (int64_t)cw * P->es;
    int m = packed ? PACKW / cw : 1, W = packed ? m * cw : 0;
    for (int j = 0; j < W; j++) wide[j] = init;
    int cnt = 0, wcnt = 0;
    int64_t pos = rb;
    while (pos < re) {
        int64_t n = L - idx[last];
        if (n > re - pos) n = re - pos;
        const char *p = base + off;
        for (int64_t i = 0; i < n;) {
            if (packed && i + m <= n) {
                const float *x = (const float *)p;
                if (!f32) {
                    mt_cpu_load_f32(p, P->es, P->dt, W, buf);
                    x = buf;
                }
                if (is_max) {
                    for (int j = 0; j < W; j++) wide[j] = mt_cpu_maxf(wide[j], x[j]);
                } else {
                    for (int j = 0; j < W; j++) wide[j] += x[j];
                    if (++wcnt == COL_FLUSH) {
                        for (int j = 0; j < W; j++) {
                            res[j % cw] += wide[j];
                            wide[j] = 0;
                        }
                        wcnt = 0;
                    }
                }
                i += m;
                p += m * s;
                continue;
            }
            if (f64) {
                const double *x = (const double *)p;
                if (is_max)
                    for (int j = 0; j < cw; j++) res[j] = maxd(res[j], x[j]);
                else
                    for (int j = 0; j < cw; j++) res[j] += x[j];
            } else {
                const float *x = (const float *)p;
                if (!f32) {
                    mt_cpu_load_f32(p, P->es, P->dt, cw, buf);
                    x = buf;
                }
                if (is_max) {
                    for (int j = 0; j < cw; j++) acc[j] = mt_cpu_maxf(acc[j], x[j]);
                } else {
                    for (int j = 0; j < cw; j++) acc[j] += x[j];
                    if (++cnt == COL_FLUSH) {
                        for (int j = 0; j < cw; j++) {
                            res[j] += acc[j];
                            acc[j] = 0;
                        }
                        cnt = 0;
                    }
                }
            }
            i++;
            p += s;
        }
        pos += n;
        if (pos >= re) break;
        off -= idx[last] * s;
        idx[last] = 0;
        off = last > 0 ? advance(P, last - 1, idx, off) : off;
    }
    if (f64) return;
    for (int j = 0; j < cw; j++) res[j] = is_max ? maxd(res[j], acc[j]) : res[j] + acc[j];
    if (packed)
        for (int j = 0; j < W; j++)
            res[j % cw] = is_max ? maxd(res[j % cw], wide[j]) : res[j % cw] + wide[j];
}

/* ---------------------------------------------------------------- output indexing */

static inline void store(const plan *P, int64_t io, double v) {
    if (P->op == MT_OP_MEAN) v /= (double)P->R;
    if (P->odt == MT_F32)
        *(float *)(P->o + io) = (float)v;
    else if (P->odt == MT_F64)
        *(double *)(P->o + io) = v;
    else
        mt_cpu_store_f64(P->o + io, 0, P->odt, 1, &v);
}

/* Row mode over the whole reduced range for outputs [kb, ke) (at most ROWB). When the
   reduced dims outside the run are strided more than the kept dims (sum over dims 0 and 2
   of [B, C, HW]), the reduced index goes outermost so memory is read in order; otherwise
   each output reduces its runs in turn. */
#define ROWB 256
static void rows_block(const plan *P, int64_t kb, int64_t ke) {
    int64_t ia[ROWB], io[ROWB];
    double acc[ROWB];
    int nb = (int)(ke - kb);
    /* offsets: one division for the first output, then an incremented index */
    int64_t kidx[MT_MAX_DIMS], rem = kb, a = 0, o = 0;
    for (int d = P->nk - 1; d >= 0; d--) {
        kidx[d] = rem % P->kshape[d];
        rem /= P->kshape[d];
        a += kidx[d] * P->kstride[d];
        o += kidx[d] * P->ostride[d];
    }
    for (int j = 0; j < nb; j++) {
        ia[j] = a;
        io[j] = o;
        for (int d = P->nk - 1; d >= 0; d--) {
            kidx[d]++;
            a += P->kstride[d];
            o += P->ostride[d];
            if (kidx[d] < P->kshape[d]) break;
            a -= kidx[d] * P->kstride[d];
            o -= kidx[d] * P->ostride[d];
            kidx[d] = 0;
        }
    }
    int last = P->nr - 1;
    int64_t L = P->rshape[last], s = P->rstride[last];
    int64_t kmin = INT64_MAX;
    for (int d = 0; d < P->nk; d++)
        if (P->kshape[d] > 1 && llabs(P->kstride[d]) < kmin) kmin = llabs(P->kstride[d]);
    if (last == 0) { /* one run per output */
        for (int j = 0; j < nb; j++) acc[j] = reduce_run(P, P->a + ia[j], s, L, identity(P));
    } else if (kmin >= llabs(P->rstride[last - 1])) {
        for (int j = 0; j < nb; j++) acc[j] = row_partial(P, P->a + ia[j], 0, P->R);
    } else {
        int64_t outer = P->R / L;
        int64_t idx[MT_MAX_DIMS] = {0}, off = 0;
        for (int j = 0; j < nb; j++) acc[j] = identity(P);
        for (int64_t q = 0; q < outer; q++) {
            for (int j = 0; j < nb; j++) acc[j] = reduce_run(P, P->a + ia[j] + off, s, L, acc[j]);
            off = advance(P, last - 1, idx, off);
        }
    }
    for (int j = 0; j < nb; j++) store(P, io[j], acc[j]);
}

/* Column-mode tasks: (outer kept index, chunk of the contiguous dim). */
static int64_t col_tasks(const plan *P, int64_t *chunks) {
    int64_t Lv = P->kshape[P->nk - 1];
    *chunks = (Lv + COLW - 1) / COLW;
    return P->K / Lv * *chunks;
}

/* Runs task t (column mode) or output t (row mode) over [rb, re); writes the values of the
   outputs it covers into vals (at their kept flat index) or, when vals is NULL, stores them. */
static void run_task(const plan *P, int64_t t, int64_t rb, int64_t re, double *vals) {
    if (!P->column) {
        int64_t ia, io;
        mt_cpu_offsets2(P->nk, P->kshape, P->kstride, P->ostride, t, &ia, &io);
        double v = row_partial(P, P->a + ia, rb, re);
        if (vals)
            vals[t] = v;
        else
            store(P, io, v);
        return;
    }
    int64_t chunks;
    col_tasks(P, &chunks);
    int64_t Lv = P->kshape[P->nk - 1];
    int64_t outer = t / chunks, c0 = (t % chunks) * COLW;
    int cw = (int)(Lv - c0 < COLW ? Lv - c0 : COLW);
    int64_t k0 = outer * Lv + c0, ia, io;
    mt_cpu_offsets2(P->nk, P->kshape, P->kstride, P->ostride, k0, &ia, &io);
    double res[COLW];
    col_partial(P, P->a + ia, cw, rb, re, res);
    int64_t os = P->ostride[P->nk - 1];
    for (int j = 0; j < cw; j++) {
        if (vals)
            vals[k0 + j] = res[j];
        else
            store(P, io + j * os, res[j]);
    }
}

/* ---------------------------------------------------------------- planning */

/* The shared geometry (src/tensor/reduce_geom.h) with strides in bytes. */
static void make_plan(plan *P, mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask) {
    memset(P, 0, sizeof *P);
    P->op = op;
    P->dt = a->dtype;
    P->odt = out->dtype;
    P->es = (int64_t)mt_dtype_size(a->dtype);
    int64_t oes = (int64_t)mt_dtype_size(out->dtype);
    P->a = (const char *)mt_tensor_data(a);
    P->o = (char *)mt_tensor_data(out);
    mt_reduce_geom g;
    mt_reduce_geom_make(&g, a->ndim, a->shape, a->strides, out->strides, mask);
    P->nk = g.nk;
    P->nr = g.nr;
    P->K = g.K;
    P->R = g.R;
    P->column = g.column;
    for (int k = 0; k < g.nk; k++) {
        P->kshape[k] = g.kshape[k];
        P->kstride[k] = g.kstride[k] * P->es;
        P->ostride[k] = g.ostride[k] * oes;
    }
    for (int r = 0; r < g.nr; r++) {
        P->rshape[r] = g.rshape[r];
        P->rstride[r] = g.rstride[r] * P->es;
    }
}

int mt_cpu_reduce(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask) {
    plan P;
    make_plan(&P, op, out, a, mask);
    if (P.K == 0) return 0;
    if (P.R == 0) { /* empty reduction: sum 0, mean nan (MAX is refused by the op) */
        double v = op == MT_OP_SUM ? 0.0 : op == MT_OP_MEAN ? NAN : -INFINITY;
        for (int64_t k = 0; k < P.K; k++) {
            int64_t ia, io;
            mt_cpu_offsets2(P.nk, P.kshape, P.kstride, P.ostride, k, &ia, &io);
            mt_cpu_store_f64(P.o + io, 0, P.odt, 1, &v);
        }
        return 0;
    }
    int64_t chunks = 1;
    int64_t tasks = P.column ? col_tasks(&P, &chunks) : P.K;
    int threads = mt_cpu_num_threads();
    bool parallel = threads > 1 && P.K * P.R >= MT_CPU_PARALLEL_MIN;
    if (!parallel) { /* no OpenMP construct at all: tiny reductions stay cheap */
        if (P.column)
            for (int64_t t = 0; t < tasks; t++) run_task(&P, t, 0, P.R, NULL);
        else
            for (int64_t kb = 0; kb < P.K; kb += ROWB)
                rows_block(&P, kb, kb + ROWB < P.K ? kb + ROWB : P.K);
        return 0;
    }
    if (tasks >= 4 * (int64_t)threads) {
        if (P.column) {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t t = 0; t < tasks; t++) run_task(&P, t, 0, P.R, NULL);
            return 0;
        }
        /* row mode: blocks of outputs, at least 4 per thread */
        int64_t per = P.K / (4 * (int64_t)threads);
        per = per < 1 ? 1 : per > ROWB ? ROWB : per;
        int64_t blocks = (P.K + per - 1) / per;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t kb = b * per, ke = kb + per < P.K ? kb + per : P.K;
            rows_block(&P, kb, ke);
        }
        return 0;
    }
    /* few outputs: split the reduced range, one partial per thread and output */
    double *part = mt_host_alloc((size_t)threads * (size_t)P.K * sizeof(double));
    if (!part)
        return mt_error_set(MT_ERR_OOM, "mt_cpu_reduce: out of memory for %d x %lld partials",
                            threads, (long long)P.K);
    int used = threads;
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
#pragma omp single
        used = nt;
        /* chunks aligned to 64 elements keep vector loops whole */
        int64_t per = ((P.R + nt - 1) / nt + 63) & ~(int64_t)63;
        int64_t rb = (int64_t)id * per, re = rb + per < P.R ? rb + per : P.R;
        double *mine = part + (size_t)id * (size_t)P.K;
        if (rb < re) {
            for (int64_t t = 0; t < tasks; t++) run_task(&P, t, rb, re, mine);
        } else {
            for (int64_t k = 0; k < P.K; k++) mine[k] = identity(&P);
        }
    }
    for (int64_t k = 0; k < P.K; k++) {
        double v = part[k];
        for (int t = 1; t < used; t++) v = combine(&P, v, part[(size_t)t * (size_t)P.K + k]);
        int64_t ia, io;
        mt_cpu_offsets2(P.nk, P.kshape, P.kstride, P.ostride, k, &ia, &io);
        store(&P, io, v);
    }
    mt_host_free(part, (size_t)threads * (size_t)P.K * sizeof(double));
    return 0;
}

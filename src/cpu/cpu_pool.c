/* 2-d pooling on the CPU: max, average and adaptive average, forward and backward, on any
   strides (NCHW and NHWC alike) and every floating dtype, with torch's window rules. One
   (n, c) plane per task; sums in F64, each output rounded once. Max pooling's backward finds
   the argmax again from the input (the first maximum of the window, a NaN taking over, as
   torch's CPU kernel) instead of storing indices in the forward.
   These loops serve what cpu_pool_dnnl.c leaves: oneDNN's average pooling divides by the full
   kernel where torch clips the window to the padded input (ceil_mode), it has no adaptive
   pooling with uneven windows nor F16/F64, and its max-pooling backward needs a workspace
   from a training forward. */
#include <math.h>
#include "../math/half.h"
#include "../math/pool_window.h"
#include "cpu.h"

static inline double ld(const char *p, mt_dtype dt) {
    switch (dt) {
    case MT_F64:
        return *(const double *)p;
    case MT_F16:
        return mt_f16_to_f32(*(const uint16_t *)p);
    case MT_BF16:
        return mt_bf16_to_f32(*(const uint16_t *)p);
    default:
        return *(const float *)p;
    }
}

static inline void st(char *p, mt_dtype dt, double v) {
    switch (dt) {
    case MT_F64:
        *(double *)p = v;
        break;
    case MT_F16:
        *(uint16_t *)p = mt_f32_to_f16((float)v);
        break;
    case MT_BF16:
        *(uint16_t *)p = mt_f32_to_bf16((float)v);
        break;
    default:
        *(float *)p = (float)v;
        break;
    }
}

/* the window rules are shared with the CUDA kernels (src/math/pool_window.h) */
typedef mt_pool_window window;

static void window_of(const mt_pool2d_params *p, int64_t oh, int64_t ow, int64_t H, int64_t W,
                      int64_t OH, int64_t OW, window *w) {
    mt_pool_window_of(p->kind == MT_POOL_ADAPTIVE_AVG, p->kernel, p->stride, p->padding,
                      p->count_include_pad, oh, ow, H, W, OH, OW, w);
}

typedef struct {
    const mt_tensor *t;
    char *base;
    int64_t sh, sw; /* bytes */
} plane;

static plane plane_of(const mt_tensor *t, int64_t n, int64_t c) {
    int64_t es = (int64_t)mt_dtype_size(t->dtype);
    plane p = {t, (char *)mt_tensor_data(t) + (n * t->strides[0] + c * t->strides[1]) * es,
               t->strides[2] * es, t->strides[3] * es};
    return p;
}

static inline char *pix(const plane *p, int64_t h, int64_t w) {
    return p->base + h * p->sh + w * p->sw;
}

/* The argmax of the window (torch's order and NaN rule). */
static void argmax(const plane *x, const window *w, int64_t *bh, int64_t *bw, double *best) {
    *bh = w->h0;
    *bw = w->w0;
    *best = -INFINITY;
    for (int64_t h = w->h0; h < w->h1; h++)
        for (int64_t v = w->w0; v < w->w1; v++) {
            double e = ld(pix(x, h, v), x->t->dtype);
            if (e > *best || isnan(e)) {
                *best = e;
                *bh = h;
                *bw = v;
            }
        }
}

/* The plane as dense floats: its own data when it is a dense F32 plane, else widened into buf
   (H * W floats), a row at a time. Not for F64 (kept exact in the double loops). */
static const float *plane_f32(const plane *p, int64_t H, int64_t W, float *buf) {
    if (p->t->dtype == MT_F32 && p->sw == 4 && p->sh == 4 * W) return (const float *)p->base;
    for (int64_t h = 0; h < H; h++)
        mt_cpu_load_f32(p->base + h * p->sh, p->sw, p->t->dtype, W, buf + h * W);
    return buf;
}

/* argmax() on a dense float plane: no dtype switch per element. */
static int64_t argmax_f(const float *x, int64_t W, const window *w, float *best) {
    int64_t at = w->h0 * W + w->w0;
    float b = -INFINITY;
    for (int64_t h = w->h0; h < w->h1; h++)
        for (int64_t v = w->w0; v < w->w1; v++) {
            float e = x[h * W + v];
            if (e > b || e != e) b = e, at = h * W + v;
        }
    *best = b;
    return at;
}

/* One output of a plane: the window's max (first, NaN wins) or average, from floats. */
static double pool_one_f(const float *x, int64_t W, const window *w, bool max) {
    float best;
    if (max) return (argmax_f(x, W, w, &best), best);
    double r = 0.0;
    for (int64_t h = w->h0; h < w->h1; h++)
        for (int64_t v = w->w0; v < w->w1; v++) r += x[h * W + v];
    return r / w->divisor;
}

/* ---- NHWC (every tensor has channel stride 1), F32, F16 and BF16. For each output position
   the window's rows of C channels are read in order, so the loops stream memory (the
   plane-by-plane loops below would read one element per cache line). F16/BF16 rows are
   widened to F32 a row at a time; sums in F32, as torch's CPU kernels, each result rounded
   once to the tensor's dtype. */

static bool nhwc_row_dtype(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F16 || dt == MT_BF16;
}

/* t has channel stride 1 (NHWC rows), a row dtype, and positions that fit an int32 */
static bool nhwc_one(const mt_tensor *t) {
    return nhwc_row_dtype(t->dtype) && t->strides[1] == 1 && t->shape[1] > 1 &&
           t->shape[2] * t->shape[3] < INT32_MAX;
}

static bool nhwc(const mt_tensor *a, const mt_tensor *b) {
    return a->dtype == b->dtype && nhwc_one(a) && nhwc_one(b);
}

static inline char *row_at(const mt_tensor *t, int64_t n, int64_t h, int64_t w) {
    return (char *)mt_tensor_data(t) + (n * t->strides[0] + h * t->strides[2] + w * t->strides[3]) *
                                           (int64_t)mt_dtype_size(t->dtype);
}

/* The C channels at (n, h, w) as floats: an F32 row in place, a low one widened into buf. */
static const float *row_load(const mt_tensor *t, int64_t n, int64_t h, int64_t w, float *buf) {
    const char *r = row_at(t, n, h, w);
    int64_t C = t->shape[1];
    if (t->dtype == MT_F32) return (const float *)r;
    if (t->dtype == MT_BF16)
        mt_cpu_bf16_to_f32((const uint16_t *)r, buf, C);
    else
        mt_cpu_f16_to_f32((const uint16_t *)r, buf, C);
    return buf;
}

/* Where a row's F32 results go: the F32 row itself, or buf (then row_store rounds it). */
static float *row_out(const mt_tensor *t, int64_t n, int64_t h, int64_t w, float *buf) {
    return t->dtype == MT_F32 ? (float *)row_at(t, n, h, w) : buf;
}

static void row_store(mt_tensor *t, int64_t n, int64_t h, int64_t w, const float *v) {
    char *r = row_at(t, n, h, w);
    int64_t C = t->shape[1];
    if (t->dtype == MT_BF16)
        mt_cpu_f32_to_bf16(v, (uint16_t *)r, C);
    else if (t->dtype == MT_F16)
        mt_cpu_f32_to_f16(v, (uint16_t *)r, C);
}

/* yr = max(yr, xr) per channel, a NaN taking over; branch-free so that it vectorises. */
static void row_max(float *restrict yr, const float *restrict xr, int64_t C) {
    for (int64_t c = 0; c < C; c++) {
        float a = yr[c], b = xr[c];
        yr[c] = (b > a || b != b) ? b : a;
    }
}

static void row_add(float *restrict yr, const float *restrict xr, int64_t C) {
    for (int64_t c = 0; c < C; c++) yr[c] += xr[c];
}

/* One output row: max (first maximum, NaN wins) or average over the window. */
static void pool_row(const mt_tensor *x, int64_t n, const window *w, bool max, float *yr,
                     float *buf) {
    int64_t C = x->shape[1];
    for (int64_t c = 0; c < C; c++) yr[c] = max ? -INFINITY : 0.0f;
    for (int64_t h = w->h0; h < w->h1; h++)
        for (int64_t v = w->w0; v < w->w1; v++) {
            const float *xr = row_load(x, n, h, v, buf);
            if (max)
                row_max(yr, xr, C);
            else
                row_add(yr, xr, C);
        }
    if (!max)
        for (int64_t c = 0; c < C; c++) yr[c] /= (float)w->divisor;
}

static const char *pool_op_name(const mt_pool2d_params *p) {
    return p->kind == MT_POOL_MAX   ? "mt_max_pool2d"
           : p->kind == MT_POOL_AVG ? "mt_avg_pool2d"
                                    : "mt_adaptive_avg_pool2d";
}

/* Returns false when the per-thread rows cannot be had. */
static bool pool_nhwc(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    int64_t N = y->shape[0], C = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3];
    size_t nbytes = (size_t)C * 2 * sizeof(float);
    int failed = 0;
#pragma omp parallel if (y->numel * 4 > MT_CPU_PARALLEL_MIN) num_threads(mt_cpu_num_threads())
    {
        float *acc = mt_host_alloc(nbytes), *buf = acc ? acc + C : NULL;
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2)
        for (int64_t n = 0; n < N; n++)
            for (int64_t oh = 0; oh < OH; oh++) {
                if (!acc) continue;
                for (int64_t ow = 0; ow < OW; ow++) {
                    window w;
                    window_of(p, oh, ow, H, W, OH, OW, &w);
                    float *yr = row_out(y, n, oh, ow, acc);
                    pool_row(x, n, &w, p->kind == MT_POOL_MAX, yr, buf);
                    if (yr == acc) row_store(y, n, oh, ow, acc);
                }
            }
        if (acc) mt_host_free(acc, nbytes);
    }
    return !failed;
}

/* Per-thread scratch of the NHWC backward: the sample's gradient in F32 (for a low gx),
   rows of gy and x widened, and max pooling's running maximum and its position. */
typedef struct {
    size_t nbytes;
    int32_t *arg; /* positions h * W + w: int32 keeps the argmax loop one vector width */
    float *best, *gbuf, *xbuf, *gacc;
} bw_scratch;

static bool bw_scratch_get(bw_scratch *s, const mt_tensor *gx) {
    int64_t C = gx->shape[1], plane = gx->shape[2] * gx->shape[3] * C;
    s->nbytes = (size_t)C * (sizeof(int32_t) + 3 * sizeof(float)) +
                (gx->dtype == MT_F32 ? 0 : (size_t)plane * sizeof(float));
    s->arg = mt_host_alloc(s->nbytes);
    if (!s->arg) return false;
    s->best = (float *)(s->arg + C);
    s->gbuf = s->best + C;
    s->xbuf = s->gbuf + C;
    s->gacc = gx->dtype == MT_F32 ? NULL : s->xbuf + C;
    return true;
}

/* The gradient row (n, h, v) of the sample being summed: in gx (F32) or in the scratch. */
static inline float *grad_row(const mt_tensor *gx, const bw_scratch *s, int64_t n, int64_t h,
                              int64_t v) {
    if (!s->gacc) return (float *)row_at(gx, n, h, v);
    return s->gacc + (h * gx->shape[3] + v) * gx->shape[1];
}

/* The running first maximum (a NaN wins) and its position, per channel; branch-free. */
static void row_argmax(float *restrict best, int32_t *restrict arg, const float *restrict xr,
                       int32_t at, int64_t C) {
    for (int64_t c = 0; c < C; c++) {
        float a = best[c], b = xr[c];
        bool take = b > a || b != b;
        best[c] = take ? b : a;
        arg[c] = take ? at : arg[c];
    }
}

/* gx[n] at each channel's argmax += gr. The sample's gradient rows lie dense (the F32
   scratch, or a dense channels-last gx), so position p is row p: no division. */
static void scatter_max(const mt_tensor *gx, const bw_scratch *s, int64_t n, const float *gr) {
    int64_t C = gx->shape[1], W = gx->shape[3];
    if (s->gacc || gx->strides[2] == W * gx->strides[3]) {
        float *g0 = grad_row(gx, s, n, 0, 0);
        int64_t rs = s->gacc ? C : gx->strides[3];
        for (int64_t c = 0; c < C; c++) g0[s->arg[c] * rs + c] += gr[c];
        return;
    }
    for (int64_t c = 0; c < C; c++) grad_row(gx, s, n, s->arg[c] / W, s->arg[c] % W)[c] += gr[c];
}

/* gx[n] = the scatter of gy[n] over the windows. */
static void pool_backward_sample(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                                 const mt_pool2d_params *p, int64_t n, bw_scratch *s) {
    int64_t C = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = gx->shape[2], W = gx->shape[3];
    for (int64_t h = 0; h < H; h++)
        for (int64_t v = 0; v < W; v++) {
            float *g = grad_row(gx, s, n, h, v);
            for (int64_t c = 0; c < C; c++) g[c] = 0.0f;
        }
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            window w;
            window_of(p, oh, ow, H, W, OH, OW, &w);
            const float *gr = row_load(gy, n, oh, ow, s->gbuf);
            if (p->kind != MT_POOL_MAX) {
                for (int64_t h = w.h0; h < w.h1; h++)
                    for (int64_t v = w.w0; v < w.w1; v++) {
                        float *gxr = grad_row(gx, s, n, h, v);
                        for (int64_t c = 0; c < C; c++) gxr[c] += gr[c] / (float)w.divisor;
                    }
                continue;
            }
            for (int64_t c = 0; c < C; c++) s->best[c] = -INFINITY, s->arg[c] = w.h0 * W + w.w0;
            for (int64_t h = w.h0; h < w.h1; h++)
                for (int64_t v = w.w0; v < w.w1; v++)
                    row_argmax(s->best, s->arg, row_load(x, n, h, v, s->xbuf), (int32_t)(h * W + v),
                               C);
            scatter_max(gx, s, n, gr);
        }
    if (s->gacc)
        for (int64_t h = 0; h < H; h++)
            for (int64_t v = 0; v < W; v++) row_store(gx, n, h, v, grad_row(gx, s, n, h, v));
}

/* Returns false when the per-thread scratch cannot be had. */
static bool pool_backward_nhwc(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                               const mt_pool2d_params *p) {
    int failed = 0;
#pragma omp parallel if (gx->numel * 4 > MT_CPU_PARALLEL_MIN) num_threads(mt_cpu_num_threads())
    {
        bw_scratch s = {0};
        bool ok = bw_scratch_get(&s, gx);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* one sample per task: the scatter of one sample never touches another's gradient */
#pragma omp for
        for (int64_t n = 0; n < gy->shape[0]; n++)
            if (ok) pool_backward_sample(gx, gy, x, p, n, &s);
        if (ok) mt_host_free(s.arg, s.nbytes);
    }
    return !failed;
}

int mt_cpu_pool2d(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    bool done;
    int rc = mt_cpu_pool2d_dnnl(y, x, p, &done);
    if (rc || done) return rc;
    if (nhwc(x, y))
        return pool_nhwc(y, x, p) ? 0
                                  : mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels",
                                                 pool_op_name(p), (long long)y->shape[1]);
    int64_t N = y->shape[0], C = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3];
    mt_dtype dt = x->dtype;
    bool wide = dt != MT_F64; /* F32/F16/BF16 planes are read as dense floats */
    size_t nbytes = wide ? (size_t)(H * W) * sizeof(float) : 0;
    int failed = 0;
#pragma omp parallel if (y->numel * 4 > MT_CPU_PARALLEL_MIN) num_threads(mt_cpu_num_threads())
    {
        float *buf = wide ? mt_host_alloc(nbytes ? nbytes : 1) : NULL;
        if (wide && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                if (wide && !buf) continue;
                plane xp = plane_of(x, n, c), yp = plane_of(y, n, c);
                const float *xf = wide ? plane_f32(&xp, H, W, buf) : NULL;
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        window w;
                        window_of(p, oh, ow, H, W, OH, OW, &w);
                        double r = 0.0;
                        if (xf) {
                            r = pool_one_f(xf, W, &w, p->kind == MT_POOL_MAX);
                        } else if (p->kind == MT_POOL_MAX) {
                            int64_t bh, bw;
                            argmax(&xp, &w, &bh, &bw, &r);
                        } else {
                            for (int64_t h = w.h0; h < w.h1; h++)
                                for (int64_t v = w.w0; v < w.w1; v++) r += ld(pix(&xp, h, v), dt);
                            r /= w.divisor;
                        }
                        st(pix(&yp, oh, ow), dt, r);
                    }
            }
        if (buf) mt_host_free(buf, nbytes ? nbytes : 1);
    }
    if (failed)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for an input plane", pool_op_name(p));
    return 0;
}

int mt_cpu_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_pool2d_params *p) {
    bool done;
    int rc = mt_cpu_pool2d_backward_dnnl(gx, gy, p, &done);
    if (rc || done) return rc;
    if (nhwc_one(gx) && gy->dtype == gx->dtype && (p->kind != MT_POOL_MAX || nhwc(x, gx))) {
        /* a gradient in another layout (the broadcast one of a sum) is laid out like gx
           first: one copy instead of the plane-by-plane loops */
        mt_tensor *dense = nhwc(gx, gy) ? NULL
                                        : mt_tensor_new_format(pool_op_name(p), gy->shape,
                                                               gy->dtype, gy->device, true);
        if (!nhwc(gx, gy) && !dense) return mt_last_status();
        rc = dense ? mt_cpu_copy(dense, gy) : 0;
        if (rc == 0 && !pool_backward_nhwc(gx, dense ? dense : gy, x, p))
            rc = mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels", pool_op_name(p),
                              (long long)gy->shape[1]);
        mt_tensor_unref(dense);
        return rc;
    }
    int64_t N = gy->shape[0], C = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = gx->shape[2], W = gx->shape[3];
    /* max pooling of a float input finds the argmax again on the plane widened to floats */
    bool wide = p->kind == MT_POOL_MAX && x->dtype != MT_F64;
    size_t nbytes = (size_t)(H * W) * (sizeof(double) + (wide ? sizeof(float) : 0));
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (gx->numel * 4 > MT_CPU_PARALLEL_MIN)
    {
        /* the plane's gradient summed in F64 and rounded once */
        double *acc = mt_host_alloc(nbytes ? nbytes : 1);
        float *buf = acc && wide ? (float *)(acc + H * W) : NULL;
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                if (!acc) continue;
                plane gp = plane_of(gy, n, c), xp = {0}, gxp = plane_of(gx, n, c);
                if (p->kind == MT_POOL_MAX) xp = plane_of(x, n, c);
                const float *xf = buf ? plane_f32(&xp, H, W, buf) : NULL;
                for (int64_t i = 0; i < H * W; i++) acc[i] = 0.0;
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        window w;
                        window_of(p, oh, ow, H, W, OH, OW, &w);
                        double g = ld(pix(&gp, oh, ow), gy->dtype);
                        if (xf) {
                            float best;
                            acc[argmax_f(xf, W, &w, &best)] += g;
                            continue;
                        }
                        if (p->kind == MT_POOL_MAX) {
                            int64_t bh, bw;
                            double best;
                            argmax(&xp, &w, &bh, &bw, &best);
                            acc[bh * W + bw] += g;
                            continue;
                        }
                        g /= w.divisor;
                        for (int64_t h = w.h0; h < w.h1; h++)
                            for (int64_t v = w.w0; v < w.w1; v++) acc[h * W + v] += g;
                    }
                for (int64_t h = 0; h < H; h++)
                    for (int64_t v = 0; v < W; v++) st(pix(&gxp, h, v), gx->dtype, acc[h * W + v]);
            }
        if (acc) mt_host_free(acc, nbytes ? nbytes : 1);
    }
    if (failed)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for a gradient plane", pool_op_name(p));
    return 0;
}

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

/* ---- F32 NHWC: every tensor has channel stride 1. For each output position the window's
   rows of C floats are read in order, so the loops stream memory (the plane-by-plane loops
   below would read one float per cache line). F32 sums, as torch's CPU kernels. */

static bool nhwc_f32(const mt_tensor *a, const mt_tensor *b) {
    return a->dtype == MT_F32 && b->dtype == MT_F32 && a->strides[1] == 1 && b->strides[1] == 1 &&
           a->shape[1] > 1;
}

static inline float *px(const mt_tensor *t, int64_t n, int64_t h, int64_t w) {
    return (float *)mt_tensor_data(t) + n * t->strides[0] + h * t->strides[2] + w * t->strides[3];
}

static void pool_nhwc_f32(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    int64_t N = y->shape[0], C = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3];
#pragma omp parallel for collapse(2) if (y->numel * 4 > MT_CPU_PARALLEL_MIN)                       \
    num_threads(mt_cpu_num_threads())
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                window w;
                window_of(p, oh, ow, H, W, OH, OW, &w);
                float *yr = px(y, n, oh, ow);
                bool max = p->kind == MT_POOL_MAX;
                for (int64_t c = 0; c < C; c++) yr[c] = max ? -INFINITY : 0.0f;
                for (int64_t h = w.h0; h < w.h1; h++)
                    for (int64_t v = w.w0; v < w.w1; v++) {
                        const float *xr = px(x, n, h, v);
                        if (max) {
                            for (int64_t c = 0; c < C; c++)
                                if (xr[c] > yr[c] || isnan(xr[c])) yr[c] = xr[c];
                        } else {
                            for (int64_t c = 0; c < C; c++) yr[c] += xr[c];
                        }
                    }
                if (!max)
                    for (int64_t c = 0; c < C; c++) yr[c] /= (float)w.divisor;
            }
}

/* gx (zeroed here) += the scatter of gy; max pooling keeps each channel's running maximum
   and its position in per-thread rows of C. Returns false when those rows cannot be had. */
static bool pool_backward_nhwc_f32(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                                   const mt_pool2d_params *p) {
    int64_t N = gy->shape[0], C = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = gx->shape[2], W = gx->shape[3];
    size_t nbytes = (size_t)C * (sizeof(float) + sizeof(int64_t));
    int failed = 0;
#pragma omp parallel if (gx->numel * 4 > MT_CPU_PARALLEL_MIN) num_threads(mt_cpu_num_threads())
    {
        /* the int64 indices first: the block is 64-byte aligned, and after C floats they
           would not be 8-byte aligned for an odd C */
        int64_t *arg = p->kind == MT_POOL_MAX ? mt_host_alloc(nbytes) : NULL;
        float *best = arg ? (float *)(arg + C) : NULL;
        if (p->kind == MT_POOL_MAX && !best) {
#pragma omp atomic write
            failed = 1;
        }
        /* one sample per task: the scatter of one sample never touches another's gradient */
#pragma omp for
        for (int64_t n = 0; n < N; n++) {
            if (p->kind == MT_POOL_MAX && !best) continue;
            for (int64_t h = 0; h < H; h++)
                for (int64_t v = 0; v < W; v++)
                    for (int64_t c = 0; c < C; c++) px(gx, n, h, v)[c] = 0.0f;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    window w;
                    window_of(p, oh, ow, H, W, OH, OW, &w);
                    const float *gr = px(gy, n, oh, ow);
                    if (p->kind != MT_POOL_MAX) {
                        for (int64_t h = w.h0; h < w.h1; h++)
                            for (int64_t v = w.w0; v < w.w1; v++) {
                                float *gxr = px(gx, n, h, v);
                                for (int64_t c = 0; c < C; c++) gxr[c] += gr[c] / (float)w.divisor;
                            }
                        continue;
                    }
                    for (int64_t c = 0; c < C; c++) best[c] = -INFINITY, arg[c] = w.h0 * W + w.w0;
                    for (int64_t h = w.h0; h < w.h1; h++)
                        for (int64_t v = w.w0; v < w.w1; v++) {
                            const float *xr = px(x, n, h, v);
                            for (int64_t c = 0; c < C; c++) /* the first maximum; NaN wins */
                                if (xr[c] > best[c] || isnan(xr[c]))
                                    best[c] = xr[c], arg[c] = h * W + v;
                        }
                    for (int64_t c = 0; c < C; c++) px(gx, n, arg[c] / W, arg[c] % W)[c] += gr[c];
                }
        }
        if (arg) mt_host_free(arg, nbytes);
    }
    return !failed;
}

int mt_cpu_pool2d(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    bool done;
    int rc = mt_cpu_pool2d_dnnl(y, x, p, &done);
    if (rc || done) return rc;
    if (nhwc_f32(x, y)) {
        pool_nhwc_f32(y, x, p);
        return 0;
    }
    int64_t N = y->shape[0], C = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3];
    mt_dtype dt = x->dtype;
#pragma omp parallel for collapse(2) if (y->numel * 4 > MT_CPU_PARALLEL_MIN)                       \
    num_threads(mt_cpu_num_threads())
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            plane xp = plane_of(x, n, c), yp = plane_of(y, n, c);
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    window w;
                    window_of(p, oh, ow, H, W, OH, OW, &w);
                    double r = 0.0;
                    if (p->kind == MT_POOL_MAX) {
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
    return 0;
}

int mt_cpu_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_pool2d_params *p) {
    bool done;
    int rc = mt_cpu_pool2d_backward_dnnl(gx, gy, p, &done);
    if (rc || done) return rc;
    if (nhwc_f32(gx, gy) && (p->kind != MT_POOL_MAX || nhwc_f32(x, gx)))
        return pool_backward_nhwc_f32(gx, gy, x, p)
                   ? 0
                   : mt_error_set(MT_ERR_OOM, "mt_max_pool2d: out of memory for %lld channels",
                                  (long long)gy->shape[1]);
    int64_t N = gy->shape[0], C = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = gx->shape[2], W = gx->shape[3];
    size_t nbytes = (size_t)(H * W) * sizeof(double);
    int failed = 0;
#pragma omp parallel num_threads(mt_cpu_num_threads()) if (gx->numel * 4 > MT_CPU_PARALLEL_MIN)
    {
        /* the plane's gradient summed in F64 and rounded once */
        double *acc = mt_host_alloc(nbytes ? nbytes : 1);
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
                for (int64_t i = 0; i < H * W; i++) acc[i] = 0.0;
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        window w;
                        window_of(p, oh, ow, H, W, OH, OW, &w);
                        double g = ld(pix(&gp, oh, ow), gy->dtype);
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
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for a gradient plane",
                            p->kind == MT_POOL_MAX ? "mt_max_pool2d" : "mt_avg_pool2d");
    return 0;
}

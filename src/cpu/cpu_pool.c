/* 2-d average and adaptive average pooling on the CPU, forward and backward, on any strides
   (NCHW and NHWC alike) and every floating dtype, with torch's window rules; and the pooling
   families of the table, which send max pooling to cpu_pool_max.c (argmax indices kept by the
   forward). One (n, c) plane per task; sums in F64, each output rounded once.
   These loops serve what cpu_pool_dnnl.c leaves: oneDNN's average pooling divides by the full
   kernel where torch clips the window to the padded input (ceil_mode), it has no adaptive
   pooling with uneven windows nor F16/F64. */
#include <math.h>
#include "../math/half.h"
#include "cpu_pool_rows.h"

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

/* One output of a float plane: the window's average. */
static double avg_one_f(const float *x, int64_t W, const mt_cpu_window *w) {
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

static bool nhwc(const mt_tensor *a, const mt_tensor *b) {
    return a->dtype == b->dtype && mt_cpu_pool_nhwc(a) && mt_cpu_pool_nhwc(b);
}

static void row_add(float *restrict yr, const float *restrict xr, int64_t C) {
    for (int64_t c = 0; c < C; c++) yr[c] += xr[c];
}

/* One output row: the average over the window. */
static void avg_row(const mt_tensor *x, int64_t n, const mt_cpu_window *w, float *yr, float *buf) {
    int64_t C = x->shape[1];
    for (int64_t c = 0; c < C; c++) yr[c] = 0.0f;
    for (int64_t h = w->h0; h < w->h1; h++)
        for (int64_t v = w->w0; v < w->w1; v++) row_add(yr, mt_cpu_row_load(x, n, h, v, buf), C);
    for (int64_t c = 0; c < C; c++) yr[c] /= (float)w->divisor;
}

/* The output row (n, oh); acc: 2 C floats of scratch. */
static void avg_out_row(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p, int64_t n,
                        int64_t oh, float *acc) {
    int64_t C = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3];
    for (int64_t ow = 0; ow < OW; ow++) {
        mt_cpu_window w;
        mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
        float *yr = mt_cpu_row_out(y, n, oh, ow, acc);
        avg_row(x, n, &w, yr, acc + C);
        if (yr == acc) mt_cpu_row_store(y, n, oh, ow, acc);
    }
}

/* Returns false when the per-thread rows cannot be had. */
static bool avg_pool_nhwc(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    bool ok;
    MT_CPU_POOL_TASKS(ok, y->numel * 4, (size_t)y->shape[1] * 2 * sizeof(float), y->shape[0],
                      y->shape[2], n, oh, acc, avg_out_row(y, x, p, n, oh, acc););
    return ok;
}

/* Per-thread scratch of the NHWC backward: a row of gy widened (gbuf, C floats) and, for a
   low gx, the sample's gradient in F32 (gacc, H W C floats, after gbuf in one block). */
typedef struct {
    float *gbuf, *gacc;
} bw_scratch;

static size_t bw_scratch_bytes(const mt_tensor *gx) {
    int64_t C = gx->shape[1], plane = gx->shape[2] * gx->shape[3] * C;
    return (size_t)(C + (gx->dtype == MT_F32 ? 0 : plane)) * sizeof(float);
}

static bw_scratch bw_scratch_at(const mt_tensor *gx, float *block) {
    return (bw_scratch){block, gx->dtype == MT_F32 ? NULL : block + gx->shape[1]};
}

/* The gradient row (n, h, v) of the sample being summed: in gx (F32) or in the scratch. */
static inline float *grad_row(const mt_tensor *gx, const bw_scratch *s, int64_t n, int64_t h,
                              int64_t v) {
    if (!s->gacc) return (float *)mt_cpu_row_at(gx, n, h, v);
    return s->gacc + (h * gx->shape[3] + v) * gx->shape[1];
}

/* gx[n] = the spread of gy[n] over the windows. */
static void avg_backward_sample(mt_tensor *gx, const mt_tensor *gy, const mt_pool2d_params *p,
                                int64_t n, bw_scratch *s) {
    int64_t C = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = gx->shape[2], W = gx->shape[3];
    for (int64_t h = 0; h < H; h++)
        for (int64_t v = 0; v < W; v++) {
            float *g = grad_row(gx, s, n, h, v);
            for (int64_t c = 0; c < C; c++) g[c] = 0.0f;
        }
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            mt_cpu_window w;
            mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
            const float *gr = mt_cpu_row_load(gy, n, oh, ow, s->gbuf);
            for (int64_t h = w.h0; h < w.h1; h++)
                for (int64_t v = w.w0; v < w.w1; v++) {
                    float *gxr = grad_row(gx, s, n, h, v);
                    for (int64_t c = 0; c < C; c++) gxr[c] += gr[c] / (float)w.divisor;
                }
        }
    if (s->gacc)
        for (int64_t h = 0; h < H; h++)
            for (int64_t v = 0; v < W; v++) mt_cpu_row_store(gx, n, h, v, grad_row(gx, s, n, h, v));
}

/* Returns false when the per-thread scratch cannot be had. */
static bool avg_pool_backward_nhwc(mt_tensor *gx, const mt_tensor *gy, const mt_pool2d_params *p) {
    /* one sample per task: the spread of one sample never touches another's gradient */
    bool ok;
    MT_CPU_POOL_TASKS(ok, gx->numel * 4, bw_scratch_bytes(gx), gy->shape[0], 1, n, m, block,
                      bw_scratch s = bw_scratch_at(gx, block);
                      avg_backward_sample(gx, gy, p, n, &s););
    return ok;
}

/* One (n, c) plane of y; buf: H W floats for a low or strided x (NULL for F64). */
static void avg_plane(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p, int64_t n,
                      int64_t c, float *buf) {
    int64_t OH = y->shape[2], OW = y->shape[3], H = x->shape[2], W = x->shape[3];
    mt_dtype dt = x->dtype;
    mt_cpu_plane xp = mt_cpu_plane_of(x, n, c), yp = mt_cpu_plane_of(y, n, c);
    const float *xf = buf ? mt_cpu_plane_f32(&xp, H, W, buf) : NULL;
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            mt_cpu_window w;
            mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
            double r = 0.0;
            if (xf) {
                r = avg_one_f(xf, W, &w);
            } else {
                for (int64_t h = w.h0; h < w.h1; h++)
                    for (int64_t v = w.w0; v < w.w1; v++) r += ld(mt_cpu_pix(&xp, h, v), dt);
                r /= w.divisor;
            }
            st(mt_cpu_pix(&yp, oh, ow), dt, r);
        }
}

/* One (n, c) plane of gx: the plane's gradient summed in F64 in acc (H W doubles) and
   rounded once. */
static void avg_backward_plane(mt_tensor *gx, const mt_tensor *gy, const mt_pool2d_params *p,
                               int64_t n, int64_t c, double *acc) {
    int64_t OH = gy->shape[2], OW = gy->shape[3], H = gx->shape[2], W = gx->shape[3];
    mt_cpu_plane gp = mt_cpu_plane_of(gy, n, c), gxp = mt_cpu_plane_of(gx, n, c);
    for (int64_t i = 0; i < H * W; i++) acc[i] = 0.0;
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            mt_cpu_window w;
            mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
            double g = ld(mt_cpu_pix(&gp, oh, ow), gy->dtype) / w.divisor;
            for (int64_t h = w.h0; h < w.h1; h++)
                for (int64_t v = w.w0; v < w.w1; v++) acc[h * W + v] += g;
        }
    for (int64_t h = 0; h < H; h++)
        for (int64_t v = 0; v < W; v++) st(mt_cpu_pix(&gxp, h, v), gx->dtype, acc[h * W + v]);
}

int mt_cpu_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p) {
    /* nothing to write; and oneDNN divides by zero reordering an empty tensor whose strides
       are not dense (an expanded batch of 0) */
    if (y->numel == 0) return 0;
    if (p->kind == MT_POOL_MAX) return mt_cpu_max_pool2d(y, idx, x, p);
    bool done;
    int rc = mt_cpu_pool2d_dnnl(y, x, p, &done);
    if (rc || done) return rc;
    if (nhwc(x, y))
        return avg_pool_nhwc(y, x, p)
                   ? 0
                   : mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels",
                                  mt_cpu_pool_op_name(p), (long long)y->shape[1]);
    /* F32/F16/BF16 planes are read as dense floats (a block of at least one byte: not NULL) */
    size_t plane = (size_t)(x->shape[2] * x->shape[3]) * sizeof(float);
    size_t wide = x->dtype == MT_F64 ? 0 : plane ? plane : 1;
    bool ok;
    MT_CPU_POOL_TASKS(ok, y->numel * 4, wide, y->shape[0], y->shape[1], n, c, buf,
                      avg_plane(y, x, p, n, c, buf););
    return ok ? 0
              : mt_error_set(MT_ERR_OOM, "%s: out of memory for an input plane",
                             mt_cpu_pool_op_name(p));
}

int mt_cpu_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_tensor *idx, const mt_pool2d_params *p) {
    (void)x;                      /* max pooling reads idx; the averages need no input */
    if (gx->numel == 0) return 0; /* as the forward */
    if (p->kind == MT_POOL_MAX) return mt_cpu_max_pool2d_backward(gx, gy, idx, p);
    bool done;
    int rc = mt_cpu_pool2d_backward_dnnl(gx, gy, p, &done);
    if (rc || done) return rc;
    if (mt_cpu_pool_nhwc(gx) && gy->dtype == gx->dtype) {
        const mt_tensor *rows;
        mt_tensor *copy;
        rc = mt_cpu_pool_rows_like(mt_cpu_pool_op_name(p), gy, &rows, &copy);
        if (rc == 0 && !avg_pool_backward_nhwc(gx, rows, p))
            rc = mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels",
                              mt_cpu_pool_op_name(p), (long long)gy->shape[1]);
        mt_tensor_unref(copy);
        return rc;
    }
    size_t nbytes = (size_t)(gx->shape[2] * gx->shape[3]) * sizeof(double);
    bool ok;
    MT_CPU_POOL_TASKS(ok, gx->numel * 4, nbytes ? nbytes : 1, gy->shape[0], gy->shape[1], n, c, acc,
                      avg_backward_plane(gx, gy, p, n, c, acc););
    return ok ? 0
              : mt_error_set(MT_ERR_OOM, "%s: out of memory for a gradient plane",
                             mt_cpu_pool_op_name(p));
}

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

/* Returns false when the per-thread rows cannot be had. */
static bool avg_pool_nhwc(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
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
                    mt_cpu_window w;
                    mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
                    float *yr = mt_cpu_row_out(y, n, oh, ow, acc);
                    avg_row(x, n, &w, yr, buf);
                    if (yr == acc) mt_cpu_row_store(y, n, oh, ow, acc);
                }
            }
        if (acc) mt_host_free(acc, nbytes);
    }
    return !failed;
}

/* Per-thread scratch of the NHWC backward: the sample's gradient in F32 (for a low gx) and
   a row of gy widened. */
typedef struct {
    size_t nbytes;
    float *gbuf, *gacc;
} bw_scratch;

static bool bw_scratch_get(bw_scratch *s, const mt_tensor *gx) {
    int64_t C = gx->shape[1], plane = gx->shape[2] * gx->shape[3] * C;
    s->nbytes = (size_t)(C + (gx->dtype == MT_F32 ? 0 : plane)) * sizeof(float);
    s->gbuf = mt_host_alloc(s->nbytes);
    if (!s->gbuf) return false;
    s->gacc = gx->dtype == MT_F32 ? NULL : s->gbuf + C;
    return true;
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
    int failed = 0;
#pragma omp parallel if (gx->numel * 4 > MT_CPU_PARALLEL_MIN) num_threads(mt_cpu_num_threads())
    {
        bw_scratch s = {0};
        bool ok = bw_scratch_get(&s, gx);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* one sample per task: the spread of one sample never touches another's gradient */
#pragma omp for
        for (int64_t n = 0; n < gy->shape[0]; n++)
            if (ok) avg_backward_sample(gx, gy, p, n, &s);
        if (ok) mt_host_free(s.gbuf, s.nbytes);
    }
    return !failed;
}

int mt_cpu_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p) {
    if (p->kind == MT_POOL_MAX) return mt_cpu_max_pool2d(y, idx, x, p);
    bool done;
    int rc = mt_cpu_pool2d_dnnl(y, x, p, &done);
    if (rc || done) return rc;
    if (nhwc(x, y))
        return avg_pool_nhwc(y, x, p)
                   ? 0
                   : mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels",
                                  mt_cpu_pool_op_name(p), (long long)y->shape[1]);
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
                mt_cpu_plane xp = mt_cpu_plane_of(x, n, c), yp = mt_cpu_plane_of(y, n, c);
                const float *xf = wide ? mt_cpu_plane_f32(&xp, H, W, buf) : NULL;
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        mt_cpu_window w;
                        mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
                        double r = 0.0;
                        if (xf) {
                            r = avg_one_f(xf, W, &w);
                        } else {
                            for (int64_t h = w.h0; h < w.h1; h++)
                                for (int64_t v = w.w0; v < w.w1; v++)
                                    r += ld(mt_cpu_pix(&xp, h, v), dt);
                            r /= w.divisor;
                        }
                        st(mt_cpu_pix(&yp, oh, ow), dt, r);
                    }
            }
        if (buf) mt_host_free(buf, nbytes ? nbytes : 1);
    }
    if (failed)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for an input plane",
                            mt_cpu_pool_op_name(p));
    return 0;
}

int mt_cpu_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_tensor *idx, const mt_pool2d_params *p) {
    (void)x; /* max pooling reads idx; the averages need no input */
    if (p->kind == MT_POOL_MAX) return mt_cpu_max_pool2d_backward(gx, gy, idx, p);
    bool done;
    int rc = mt_cpu_pool2d_backward_dnnl(gx, gy, p, &done);
    if (rc || done) return rc;
    if (mt_cpu_pool_nhwc(gx) && gy->dtype == gx->dtype) {
        /* a gradient in another layout (the broadcast one of a sum) is laid out like gx
           first: one copy instead of the plane-by-plane loops */
        mt_tensor *dense = nhwc(gx, gy) ? NULL
                                        : mt_tensor_new_format(mt_cpu_pool_op_name(p), gy->shape,
                                                               gy->dtype, gy->device, true);
        if (!nhwc(gx, gy) && !dense) return mt_last_status();
        rc = dense ? mt_cpu_copy(dense, gy) : 0;
        if (rc == 0 && !avg_pool_backward_nhwc(gx, dense ? dense : gy, p))
            rc = mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld channels",
                              mt_cpu_pool_op_name(p), (long long)gy->shape[1]);
        mt_tensor_unref(dense);
        return rc;
    }
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
                    for (int64_t v = 0; v < W; v++)
                        st(mt_cpu_pix(&gxp, h, v), gx->dtype, acc[h * W + v]);
            }
        if (acc) mt_host_free(acc, nbytes ? nbytes : 1);
    }
    if (failed)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for a gradient plane",
                            mt_cpu_pool_op_name(p));
    return 0;
}

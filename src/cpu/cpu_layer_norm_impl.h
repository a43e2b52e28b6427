/* Layer-norm row kernels for one accumulation type, included by cpu_layer_norm.c once with
   T = float (F32, F16 and BF16 activations) and once with T = double (F64), so the two
   precisions share one text. The includer defines T, SFX(name), LOAD, STORE, SQRT and NATIVE.
   Rows whose dtype is T are read and written in place, as batch norm's runs are (see
   cpu_batch_norm_impl.h); other dtypes convert through row buffers. */
#include "cpu_norm_sums_impl.h"

/* rows [rb, re): y = (x - mean) * rstd * w + b, row statistics saved */
MT_CPU_CLONES static int SFX(ln_rows)(void *vctx, int64_t rb, int64_t re, int part) {
    (void)part;
    const ln_ctx *c = vctx;
    int64_t D = c->D;
    T *buf = mt_host_alloc((size_t)D * sizeof(T));
    if (!buf) return 1;
    const T *w = c->w, *b = c->b;
    T *mean = c->mean, *rstd = c->rstd;
    for (int64_t r = rb; r < re; r++) {
        const char *xr = c->x + r * D * c->xes;
        char *yr = c->y + r * D * c->yes;
        const T *x = (const T *)xr;
        if (c->xdt != NATIVE) {
            LOAD(xr, c->xes, c->xdt, D, buf);
            x = buf;
        }
        /* Shifted by the row's first value k (x - k is exact for values near it): the
           mean of the shifted values md is small and accurate, so neither the one-pass
           variance nor x - mean cancels when |mean| >> std. The mean itself is never formed
           for y, only saved for the backward. */
        T k = x[0], s, s2;
        SFX(sums2)(x, k, x, k, D, &s, &s2);
        /* a mean square past the dtype's range is an infinite variance (as the CUDA kernel's
           two-pass sum finds), not inf - inf */
        T md = s / (T)D, m2 = s2 / (T)D, var = isinf(m2) ? m2 : m2 - md * md;
        T rs = (T)1 / SQRT((var < 0 ? (T)0 : var) + (T)c->eps); /* NaN stays NaN */
        T *y = c->ydt == NATIVE ? (T *)yr : buf; /* buf's x is read before its y is written */
        for (int64_t j = 0; j < D; j++) {
            T h = ((x[j] - k) - md) * rs;
            y[j] = (w ? h * w[j] : h) + (b ? b[j] : (T)0);
        }
        if (c->ydt != NATIVE) STORE(yr, c->yes, c->ydt, D, y);
        mean[r] = k + md;
        rstd[r] = rs;
    }
    mt_host_free(buf, (size_t)D * sizeof(T));
    return 0;
}

/* rows [rb, re): gx = rstd (g - mean(g) - xhat mean(g xhat)) with g = gy w; the weight and
   bias gradients of these rows go to partial buffers number `part` */
MT_CPU_CLONES static int SFX(ln_backward_rows)(void *vctx, int64_t rb, int64_t re, int part) {
    const ln_ctx *c = vctx;
    int64_t D = c->D;
    T *buf = mt_host_alloc((size_t)D * 2 * sizeof(T));
    if (!buf) return 1;
    T *xv = buf, *g = buf + D;
    T *pw = c->part ? (T *)c->part + (int64_t)part * 2 * D : NULL, *pb = pw ? pw + D : NULL;
    if (pw)
        for (int64_t j = 0; j < 2 * D; j++) pw[j] = 0;
    const T *w = c->w;
    for (int64_t r = rb; r < re; r++) {
        T m = ((const T *)c->mean)[r], rs = ((const T *)c->rstd)[r];
        const char *xr = c->x + r * D * c->xes, *gyr = c->gy + r * D * c->gyes;
        if (c->xdt == NATIVE) {
            const T *x = (const T *)xr;
            for (int64_t j = 0; j < D; j++) xv[j] = (x[j] - m) * rs; /* xhat */
        } else {
            LOAD(xr, c->xes, c->xdt, D, xv);
            for (int64_t j = 0; j < D; j++) xv[j] = (xv[j] - m) * rs;
        }
        const T *gy = (const T *)gyr;
        if (c->gydt != NATIVE) {
            LOAD(gyr, c->gyes, c->gydt, D, g);
            gy = g;
        }
        if (pw)
            for (int64_t j = 0; j < D; j++) {
                pw[j] += gy[j] * xv[j];
                pb[j] += gy[j];
            }
        if (!c->gx) continue;
        for (int64_t j = 0; j < D; j++) g[j] = w ? gy[j] * w[j] : gy[j];
        T s, sx;
        SFX(sums2)(g, 0, xv, 0, D, &s, &sx);
        s /= (T)D;
        sx /= (T)D;
        char *gxr = c->gx + r * D * c->gxes;
        T *gx = c->gxdt == NATIVE ? (T *)gxr : g;
        for (int64_t j = 0; j < D; j++) gx[j] = rs * (g[j] - s - xv[j] * sx);
        if (c->gxdt != NATIVE) STORE(gxr, c->gxes, c->gxdt, D, gx);
    }
    mt_host_free(buf, (size_t)D * 2 * sizeof(T));
    return 0;
}

/* gw[j] and gb[j]: the parts summed in part order (deterministic) */
static void SFX(ln_reduce_parts)(const ln_ctx *c, int parts, mt_tensor *gw, mt_tensor *gb) {
    int64_t D = c->D;
    const T *p = c->part;
    T *w = gw ? mt_tensor_data(gw) : NULL, *b = gb ? mt_tensor_data(gb) : NULL;
    for (int64_t j = 0; j < D; j++) {
        T sw = 0, sb = 0;
        for (int k = 0; k < parts; k++) {
            sw += p[(int64_t)k * 2 * D + j];
            sb += p[(int64_t)k * 2 * D + D + j];
        }
        if (w) w[j] = sw;
        if (b) b[j] = sb;
    }
}

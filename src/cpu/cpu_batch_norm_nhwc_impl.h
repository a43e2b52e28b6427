/* Channels-last batch-norm kernels for one accumulation type, included by
   cpu_batch_norm_nhwc.c through cpu_accum_types.h (T, SFX, LOAD, STORE, SQRT). x is M rows
   of C channels; every loop runs over a row's channels, so it vectorises over C with the
   per-channel constants in arrays. Per-channel sums are accumulated per row range (one part
   per thread) in T over blocks of NHWC_BLOCK rows, flushed into doubles, and the parts are
   combined in part order (deterministic for a thread count). */

/* The per-part accumulation: rows [rb, re) into s1, s2 (double[C]) of
   sum(a - ka) and sum((a - ka) * (b - kb)) per channel, with a and b rows made by row_fn. */
typedef void (*SFX(nhwc_rows_fn))(const nhwc_ctx *c, int64_t r, T *a, T *b);

static void SFX(nhwc_sums)(const nhwc_ctx *c, SFX(nhwc_rows_fn) rows, const T *ka, const T *kb,
                           int64_t rb, int64_t re, double *s1, double *s2, T *scratch) {
    int64_t C = c->C;
    T *a = scratch, *b = a + C, *t1 = b + C, *t2 = t1 + C;
    for (int64_t ch = 0; ch < C; ch++) s1[ch] = s2[ch] = 0;
    for (int64_t r0 = rb; r0 < re; r0 += NHWC_BLOCK) {
        int64_t r1 = re - r0 < NHWC_BLOCK ? re : r0 + NHWC_BLOCK;
        for (int64_t ch = 0; ch < C; ch++) t1[ch] = t2[ch] = 0;
        for (int64_t r = r0; r < r1; r++) {
            rows(c, r, a, b);
            for (int64_t ch = 0; ch < C; ch++) {
                T d = a[ch] - ka[ch];
                t1[ch] += d;
                t2[ch] += d * (b[ch] - kb[ch]);
            }
        }
        for (int64_t ch = 0; ch < C; ch++) {
            s1[ch] += (double)t1[ch];
            s2[ch] += (double)t2[ch];
        }
    }
}

/* x row twice (a and b): the shifted sums of the statistics */
static void SFX(nhwc_x_rows)(const nhwc_ctx *c, int64_t r, T *a, T *b) {
    LOAD(c->x + r * c->C * c->es, c->es, c->dt, c->C, a);
    memcpy(b, a, (size_t)c->C * sizeof(T));
}

/* gz (gy masked by y > 0 under relu) as a, x as b: the backward's sums */
static void SFX(nhwc_gz)(const nhwc_ctx *c, int64_t r, T *gz, T *tmp) {
    LOAD(c->gy + r * c->C * c->es, c->es, c->dt, c->C, gz);
    if (!c->y) return;
    LOAD(c->y + r * c->C * c->es, c->es, c->dt, c->C, tmp);
    for (int64_t ch = 0; ch < c->C; ch++) gz[ch] = tmp[ch] > 0 ? gz[ch] : (T)0;
}
static void SFX(nhwc_gz_x_rows)(const nhwc_ctx *c, int64_t r, T *a, T *b) {
    SFX(nhwc_gz)(c, r, a, b);
    LOAD(c->x + r * c->C * c->es, c->es, c->dt, c->C, b);
}

static int SFX(nhwc_stats_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const nhwc_ctx *c = vctx;
    double *s = c->parts + (size_t)part * 2 * (size_t)c->C;
    SFX(nhwc_sums)
    (c, SFX(nhwc_x_rows), c->k, c->k, rb, re, s, s + c->C,
     (T *)c->scratch + (size_t)part * 4 * (size_t)c->C);
    return 0;
}

static int SFX(nhwc_grad_sums_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const nhwc_ctx *c = vctx;
    double *s = c->parts + (size_t)part * 2 * (size_t)c->C;
    SFX(nhwc_sums)
    (c, SFX(nhwc_gz_x_rows), c->zero, c->mean, rb, re, s, s + c->C,
     (T *)c->scratch + (size_t)part * 4 * (size_t)c->C);
    return 0;
}

/* y = act(((x - k) - md) * scale + shift + residual), rows [rb, re) */
static int SFX(nhwc_forward_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const nhwc_ctx *c = vctx;
    int64_t C = c->C, rowb = C * c->es;
    const T *k = c->k, *md = c->md, *scale = c->scale, *shift = c->shift;
    T *buf = (T *)c->scratch + (size_t)part * 4 * (size_t)C, *res = buf + C;
    for (int64_t r = rb; r < re; r++) {
        LOAD(c->x + r * rowb, c->es, c->dt, C, buf);
        for (int64_t ch = 0; ch < C; ch++)
            buf[ch] = ((buf[ch] - k[ch]) - md[ch]) * scale[ch] + shift[ch];
        if (c->res) {
            LOAD(c->res + r * rowb, c->es, c->dt, C, res);
            for (int64_t ch = 0; ch < C; ch++) buf[ch] += res[ch];
        }
        if (c->a->relu)
            for (int64_t ch = 0; ch < C; ch++) buf[ch] = buf[ch] > 0 ? buf[ch] : (T)0;
        STORE(c->out + r * rowb, c->es, c->dt, C, buf);
    }
    return 0;
}

/* gres = gz; gx = k (gz - mg - (x - mean) rs mgx), rows [rb, re) */
static int SFX(nhwc_backward_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const nhwc_ctx *c = vctx;
    int64_t C = c->C, rowb = C * c->es;
    const T *kk = c->scale, *mg = c->k, *mgx = c->md, *mean = c->mean, *rs = c->shift;
    T *gz = (T *)c->scratch + (size_t)part * 4 * (size_t)C, *x = gz + C;
    for (int64_t r = rb; r < re; r++) {
        SFX(nhwc_gz)(c, r, gz, x);
        if (c->gres) STORE(c->gres + r * rowb, c->es, c->dt, C, gz);
        if (!c->gx) continue;
        LOAD(c->x + r * rowb, c->es, c->dt, C, x);
        for (int64_t ch = 0; ch < C; ch++)
            gz[ch] = kk[ch] * (gz[ch] - mg[ch] - (x[ch] - mean[ch]) * rs[ch] * mgx[ch]);
        STORE(c->gx + r * rowb, c->es, c->dt, C, gz);
    }
    return 0;
}

/* The combined sums of every part: s1, s2 (double[C]) */
static void SFX(nhwc_combine)(const nhwc_ctx *c, int nparts, double *s1, double *s2) {
    for (int64_t ch = 0; ch < c->C; ch++) s1[ch] = s2[ch] = 0;
    for (int p = 0; p < nparts; p++) {
        const double *s = c->parts + (size_t)p * 2 * (size_t)c->C;
        for (int64_t ch = 0; ch < c->C; ch++) {
            s1[ch] += s[ch];
            s2[ch] += s[c->C + ch];
        }
    }
}

static int SFX(nhwc_forward)(nhwc_ctx *c, int nparts, double *s1, double *s2) {
    const mt_bn_args *a = c->a;
    int64_t C = c->C, M = c->M;
    const T *w = c->w, *b = c->b;
    T *rm = c->rm, *rv = c->rv, *sm = c->sm, *sr = c->sr;
    T *k = c->k, *md = c->md, *scale = c->scale, *shift = c->shift;
    if (a->training) { /* shift by the first row's values: no cancellation in the variance */
        LOAD(c->x, c->es, c->dt, C, k);
        memset(c->parts, 0, (size_t)nparts * 2 * (size_t)C * sizeof(double)); /* unused: 0 */
        int rc = mt_cpu_for_parts(SFX(nhwc_stats_part), c, M, M * C * 2);
        if (rc) return rc;
        SFX(nhwc_combine)(c, nparts, s1, s2);
    }
    for (int64_t ch = 0; ch < C; ch++) {
        T mean, var;
        if (a->training) {
            double dm = s1[ch] / (double)M, dv = s2[ch] / (double)M - dm * dm;
            md[ch] = (T)dm;
            mean = (T)((double)k[ch] + dm);
            var = (T)(dv > 0 ? dv : 0);
            if (rm) {
                double mo = a->momentum;
                rm[ch] = (T)((1 - mo) * (double)rm[ch] + mo * (double)mean);
                rv[ch] =
                    (T)((1 - mo) * (double)rv[ch] + mo * (double)var * (double)M / (double)(M - 1));
            }
        } else {
            mean = k[ch] = rm[ch];
            var = rv[ch];
            md[ch] = 0;
        }
        T rs = (T)1 / SQRT(var + (T)a->eps);
        sm[ch] = mean;
        sr[ch] = rs;
        scale[ch] = w ? w[ch] * rs : rs;
        shift[ch] = b ? b[ch] : (T)0;
    }
    return mt_cpu_for_parts(SFX(nhwc_forward_part), c, M, M * C * 3);
}

static int SFX(nhwc_backward)(nhwc_ctx *c, int nparts, double *s1, double *s2) {
    const mt_bn_backward_args *a = c->ba;
    int64_t C = c->C, M = c->M;
    const T *w = c->w, *sm = c->sm, *sr = c->sr;
    T *gw = c->gw, *gb = c->gb;
    T *mean = c->mean, *zero = c->zero, *kk = c->scale, *mg = c->k, *mgx = c->md, *rs = c->shift;
    for (int64_t ch = 0; ch < C; ch++) {
        mean[ch] = sm[ch];
        rs[ch] = sr[ch];
        zero[ch] = 0;
        s1[ch] = s2[ch] = 0;
    }
    if (gw || gb || (a->gx && a->training)) {
        memset(c->parts, 0, (size_t)nparts * 2 * (size_t)C * sizeof(double));
        int rc = mt_cpu_for_parts(SFX(nhwc_grad_sums_part), c, M, M * C * 3);
        if (rc) return rc;
        SFX(nhwc_combine)(c, nparts, s1, s2);
    }
    for (int64_t ch = 0; ch < C; ch++) {
        double sg = s1[ch], sgx = s2[ch] * (double)rs[ch];
        if (gw) gw[ch] = (T)sgx;
        if (gb) gb[ch] = (T)sg;
        kk[ch] = (w ? w[ch] : (T)1) * rs[ch];
        mg[ch] = a->training ? (T)(sg / (double)M) : (T)0;
        mgx[ch] = a->training ? (T)(sgx / (double)M) : (T)0;
    }
    if (!a->gx && !a->gres) return 0;
    return mt_cpu_for_parts(SFX(nhwc_backward_part), c, M, M * C * 3);
}

/* Channels-last batch-norm kernels for one accumulation type, included by
   cpu_batch_norm_impl.h (T, SFX, LOAD, STORE, SQRT; SFX(bn_consts_of)). x is M rows
   of C channels; every loop runs over a row's channels, so it vectorises over C with the
   per-channel constants in arrays, and rows are read rows_per at a time (one contiguous run,
   one conversion call; data already in T, F32 or F64, is read and written where it lies,
   without the row buffers). Per-channel sums are accumulated per row range (one part per
   thread) in T over blocks of NHWC_BLOCK rows, flushed into doubles, and the parts are
   combined in part order (deterministic for a thread count). */

/* A part's scratch: three buffers of rows_per rows and the two block sums. */
static T *SFX(nhwc_scratch)(const bn_ctx *c, int part) {
    return (T *)c->scratch + (size_t)part * (size_t)c->per_part;
}

/* Whether the tensors' dtype is T itself (F32 data with T = float, F64 with double): then
   the passes read and write the tensors in place instead of through the row buffers. */
MT_CPU_INLINE bool SFX(nhwc_direct)(const bn_ctx *c) {
    return (int64_t)sizeof(T) == c->es && (c->dt == MT_F32 || c->dt == MT_F64);
}

/* rows [r, r + n) of the tensor at base (dtype c->dt) as T values: the tensor's own memory
   where it holds T, else converted into buf (one contiguous run) */
MT_CPU_INLINE const T *SFX(nhwc_rows)(const bn_ctx *c, const char *base, int64_t r, int64_t n,
                                      T *buf) {
    if (SFX(nhwc_direct)(c)) return (const T *)(base + r * c->C * c->es);
    LOAD(base + r * c->C * c->es, c->es, c->dt, n * c->C, buf);
    return buf;
}

/* gz (gy masked by y > 0 under relu) of rows [r, r + n), in gy itself or in gz; tmp is
   clobbered */
MT_CPU_INLINE const T *SFX(nhwc_gz)(const bn_ctx *c, int64_t r, int64_t n, T *restrict gz,
                                    T *restrict tmp) {
    int64_t m = n * c->C;
    /* two loops, not one over pointers that may coincide: in place (gz itself) and from gy
       (restrict pointers to other memory) each vectorise without a runtime alias check */
    if (!SFX(nhwc_direct)(c)) {
        LOAD(c->gy + r * c->C * c->es, c->es, c->dt, m, gz);
        if (!c->y) return gz;
        LOAD(c->y + r * c->C * c->es, c->es, c->dt, m, tmp);
        for (int64_t i = 0; i < m; i++) gz[i] = MT_RELU_GRAD(gz[i], tmp[i]);
        return gz;
    }
    const T *restrict g = (const T *)(c->gy + r * c->C * c->es);
    if (!c->y) return g;
    const T *restrict y = (const T *)(c->y + r * c->C * c->es);
    for (int64_t i = 0; i < m; i++) gz[i] = MT_RELU_GRAD(g[i], y[i]);
    return gz;
}

/* Where rows [q, q + n) of the output at base are computed: in place when it holds T, else
   in buf, stored by nhwc_store */
MT_CPU_INLINE T *SFX(nhwc_out)(const bn_ctx *c, char *base, int64_t q, T *buf) {
    return SFX(nhwc_direct)(c) ? (T *)(base + q * c->C * c->es) : buf;
}
MT_CPU_INLINE void SFX(nhwc_store)(const bn_ctx *c, char *base, int64_t q, int64_t n, const T *v) {
    if (!SFX(nhwc_direct)(c)) STORE(base + q * c->C * c->es, c->es, c->dt, n * c->C, v);
}

/* t1[ch] += sum over rows of (a - ka), t2[ch] += sum of (a - ka) (b - kb), for n rows of C
   channels. The pointers are restrict parameters (a and b may be the same rows: both are
   only read), which GCC keeps through inlining, so the channel loops vectorise without the
   runtime alias checks that block-scope restrict pointers did not spare them. */
MT_CPU_INLINE void SFX(nhwc_sum_rows)(const T *restrict a, const T *restrict b,
                                      const T *restrict ka, const T *restrict kb, T *restrict t1,
                                      T *restrict t2, int64_t n, int64_t C) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) { /* four rows per pass over the sums (fewer loads) */
        const T *a0 = a + i * C, *b0 = b + i * C;
        for (int64_t ch = 0; ch < C; ch++) {
            T d0 = a0[ch] - ka[ch], d1 = a0[C + ch] - ka[ch];
            T d2 = a0[2 * C + ch] - ka[ch], d3 = a0[3 * C + ch] - ka[ch];
            t1[ch] += (d0 + d1) + (d2 + d3);
            t2[ch] += (d0 * (b0[ch] - kb[ch]) + d1 * (b0[C + ch] - kb[ch])) +
                      (d2 * (b0[2 * C + ch] - kb[ch]) + d3 * (b0[3 * C + ch] - kb[ch]));
        }
    }
    for (; i < n; i++) {
        const T *ar = a + i * C, *br = b + i * C;
        for (int64_t ch = 0; ch < C; ch++) {
            T d = ar[ch] - ka[ch];
            t1[ch] += d;
            t2[ch] += d * (br[ch] - kb[ch]);
        }
    }
}

/* Rows [rb, re) into s1, s2 (double[C]): per channel sum(a - ka) and sum((a - ka) (b - kb)),
   with a = b = x (the statistics) or a = gz, b = x (grads: the backward's sums). */
MT_CPU_INLINE void SFX(nhwc_sums)(const bn_ctx *c, bool grads, const T *restrict ka,
                                  const T *restrict kb, int64_t rb, int64_t re, double *restrict s1,
                                  double *restrict s2, int part) {
    int64_t C = c->C, R = c->rows_per;
    T *a = SFX(nhwc_scratch)(c, part), *b = a + R * C, *tmp = b + R * C;
    T *restrict t1 = tmp + R * C, *restrict t2 = t1 + C;
    for (int64_t ch = 0; ch < C; ch++) s1[ch] = s2[ch] = 0;
    for (int64_t r0 = rb; r0 < re; r0 += NHWC_BLOCK) {
        int64_t r1 = re - r0 < NHWC_BLOCK ? re : r0 + NHWC_BLOCK;
        for (int64_t ch = 0; ch < C; ch++) t1[ch] = t2[ch] = 0;
        for (int64_t q = r0; q < r1; q += R) {
            int64_t n = r1 - q < R ? r1 - q : R;
            const T *av, *bv;
            if (grads) {
                av = SFX(nhwc_gz)(c, q, n, a, tmp);
                bv = SFX(nhwc_rows)(c, c->x, q, n, b);
            } else {
                av = bv = SFX(nhwc_rows)(c, c->x, q, n, a);
            }
            SFX(nhwc_sum_rows)(av, bv, ka, kb, t1, t2, n, C);
        }
        for (int64_t ch = 0; ch < C; ch++) {
            s1[ch] += (double)t1[ch];
            s2[ch] += (double)t2[ch];
        }
    }
}

MT_CPU_CLONES static int SFX(nhwc_stats_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const bn_ctx *c = vctx;
    double *s = c->parts + (size_t)part * 2 * (size_t)c->C;
    SFX(nhwc_sums)(c, false, c->k, c->k, rb, re, s, s + c->C, part);
    return 0;
}

MT_CPU_CLONES static int SFX(nhwc_grad_sums_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const bn_ctx *c = vctx;
    double *s = c->parts + (size_t)part * 2 * (size_t)c->C;
    SFX(nhwc_sums)(c, true, c->zero, c->mean, rb, re, s, s + c->C, part);
    return 0;
}

/* y = act(((x - k) - md) * scale + shift + residual), rows [q, q + n), through the row
   buffers b0, b1, b2 (x, y, the residual) where the data is not T */
MT_CPU_INLINE void SFX(nhwc_forward_rows)(const bn_ctx *c, int64_t q, int64_t n, T *b0, T *b1,
                                          T *b2) {
    int64_t C = c->C;
    const T *restrict k = c->k, *restrict md = c->md, *restrict scale = c->scale,
                      *restrict shift = c->shift;
    const T *restrict x = SFX(nhwc_rows)(c, c->x, q, n, b0);
    T *restrict y = SFX(nhwc_out)(c, c->out, q, b1);
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < C; ch++)
            y[i * C + ch] = ((x[i * C + ch] - k[ch]) - md[ch]) * scale[ch] + shift[ch];
    if (c->res) {
        const T *restrict rv = SFX(nhwc_rows)(c, c->res, q, n, b2);
        for (int64_t i = 0; i < n * C; i++) y[i] += rv[i];
    }
    if (c->a->relu)
        for (int64_t i = 0; i < n * C; i++) y[i] = y[i] < 0 ? (T)0 : y[i]; /* NaN stays */
    SFX(nhwc_store)(c, c->out, q, n, y);
}

/* gres = gz; gx = k (gz - mg - (x - mean) rs mgx), rows [q, q + n), through the row buffers
   b0, b1, b2 (gz, x, the output) where the data is not T */
MT_CPU_INLINE void SFX(nhwc_backward_rows)(const bn_ctx *c, int64_t q, int64_t n, T *b0, T *b1,
                                           T *b2) {
    int64_t C = c->C;
    const T *restrict kk = c->scale, *restrict mg = c->k, *restrict mgx = c->md,
                      *restrict mean = c->mean, *restrict rs = c->shift;
    const T *restrict g = SFX(nhwc_gz)(c, q, n, b0, b1);
    if (c->gres && SFX(nhwc_direct)(c)) {
        T *restrict gr = SFX(nhwc_out)(c, c->gres, q, b2);
        for (int64_t i = 0; i < n * C; i++) gr[i] = g[i];
    } else if (c->gres) {
        SFX(nhwc_store)(c, c->gres, q, n, g);
    }
    if (!c->gx) return;
    const T *restrict x = SFX(nhwc_rows)(c, c->x, q, n, b1);
    T *restrict gx = SFX(nhwc_out)(c, c->gx, q, b2);
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < C; ch++)
            gx[i * C + ch] =
                kk[ch] * (g[i * C + ch] - mg[ch] - (x[i * C + ch] - mean[ch]) * rs[ch] * mgx[ch]);
    SFX(nhwc_store)(c, c->gx, q, n, gx);
}

/* The pass over rows [rb, re) that writes the forward's output or the backward's gradients,
   rows_per rows at a time through the part's three row buffers */
MT_CPU_CLONES static int SFX(nhwc_rows_part)(void *vctx, int64_t rb, int64_t re, int part) {
    const bn_ctx *c = vctx;
    int64_t R = c->rows_per;
    T *b0 = SFX(nhwc_scratch)(c, part), *b1 = b0 + R * c->C, *b2 = b1 + R * c->C;
    for (int64_t q = rb; q < re; q += R) {
        int64_t n = re - q < R ? re - q : R;
        if (c->a)
            SFX(nhwc_forward_rows)(c, q, n, b0, b1, b2);
        else
            SFX(nhwc_backward_rows)(c, q, n, b0, b1, b2);
    }
    return 0;
}

/* The combined sums of every part: s1, s2 (double[C]) */
static void SFX(nhwc_combine)(const bn_ctx *c, int nparts, double *s1, double *s2) {
    for (int64_t ch = 0; ch < c->C; ch++) s1[ch] = s2[ch] = 0;
    for (int p = 0; p < nparts; p++) {
        const double *s = c->parts + (size_t)p * 2 * (size_t)c->C;
        for (int64_t ch = 0; ch < c->C; ch++) {
            s1[ch] += s[ch];
            s2[ch] += s[c->C + ch];
        }
    }
}

static int SFX(nhwc_forward)(bn_ctx *c, int nparts, double *s1, double *s2) {
    int64_t C = c->C, M = c->M;
    T *k = c->k, *md = c->md, *scale = c->scale, *shift = c->shift;
    if (c->a->training) { /* shift by the first row's values: no cancellation in the variance */
        LOAD(c->x, c->es, c->dt, C, k);
        memset(c->parts, 0, (size_t)nparts * 2 * (size_t)C * sizeof(double)); /* unused: 0 */
        int rc = mt_cpu_for_parts(SFX(nhwc_stats_part), c, M, M * C * 2);
        if (rc) return rc;
        SFX(nhwc_combine)(c, nparts, s1, s2);
    }
    for (int64_t ch = 0; ch < C; ch++) {
        bool tr = c->a->training; /* eval: no sums (nor k: the running mean) */
        double a1 = tr ? s1[ch] : 0, a2 = tr ? s2[ch] : 0;
        SFX(bn_consts) q = SFX(bn_consts_of)(c, ch, a1, a2, tr ? k[ch] : 0);
        k[ch] = q.k;
        md[ch] = q.md;
        scale[ch] = q.scale;
        shift[ch] = q.shift;
    }
    return mt_cpu_for_parts(SFX(nhwc_rows_part), c, M, M * C * 3);
}

static int SFX(nhwc_backward)(bn_ctx *c, int nparts, double *s1, double *s2) {
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
    return mt_cpu_for_parts(SFX(nhwc_rows_part), c, M, M * C * 3);
}

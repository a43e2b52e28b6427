/* Batch-norm kernels for one accumulation type, included by cpu_batch_norm.c with
   T = float (F32, F16 and BF16 activations) and T = double (F64). The includer defines T,
   SFX(name), LOAD, STORE and SQRT. Here the per-channel constants both layouts share and the
   NCHW channel kernels, where a channel's elements are N runs of S contiguous values, read in
   chunks of CHUNK into stack buffers; the NHWC kernels follow (cpu_batch_norm_nhwc_impl.h). */
#include "cpu_norm_sums_impl.h"

/* Channel ch's constants of y = ((x - k) - md) * scale + shift. Training: k is one of the
   channel's values and s1, s2 the sums of (x - k) and (x - k)^2 over its M values (x - k is
   exact nearby and md the small mean of x - k, so x - mean does not cancel when
   |mean| >> std); the running buffers are updated. Eval: k is the running mean, md 0.
   Stores the saved mean and 1/std. */
typedef struct {
    T k, md, scale, shift;
} SFX(bn_consts);

static SFX(bn_consts) SFX(bn_consts_of)(const bn_ctx *c, int64_t ch, double s1, double s2, T k) {
    const mt_bn_args *a = c->a;
    const T *w = c->w, *b = c->b;
    T *rm = c->rm, *rv = c->rv, *sm = c->sm, *sr = c->sr;
    T mean, var, md = 0;
    if (a->training) {
        mt_bn_moments m = mt_bn_moments_from_sums(s1, s2, (double)k, c->M);
        md = (T)m.shifted_mean;
        mean = (T)m.mean;
        var = (T)m.var;
        if (rm) {
            rm[ch] = (T)mt_bn_running_mean((double)rm[ch], (double)mean, a->momentum);
            rv[ch] = (T)mt_bn_running_var((double)rv[ch], (double)var, c->M, a->momentum);
        }
    } else {
        mean = k = rm[ch];
        var = rv[ch];
    }
    T rs =
        mt_bn_rstd_is_zero(a->training, (double)var, a->eps) ? (T)0 : (T)1 / SQRT(var + (T)a->eps);
    sm[ch] = mean;
    sr[ch] = rs;
    return (SFX(bn_consts)){k, md, w ? w[ch] * rs : rs, b ? b[ch] : (T)0};
}

/* The m values of a contiguous run at p as T: p itself when the data is T, else converted
   into buf. Copying F32 runs into a stack buffer (memcpy) made F32 NCHW batch norm 2.7x
   slower than BF16 on a Zen 4 VM: [16, 64, 32, 32] forward 0.78 and backward 1.27 ms on one
   thread, now 0.30 and 0.46. */
MT_CPU_INLINE const T *SFX(bn_read)(const bn_ctx *c, const char *p, int64_t m, T *buf) {
    if (c->dt == NATIVE) return (const T *)p;
    LOAD(p, c->es, c->dt, m, buf);
    return buf;
}

/* Where to compute the m values for the run at p: p itself when the data is T, else buf,
   stored by SFX(bn_write). */
MT_CPU_INLINE T *SFX(bn_target)(const bn_ctx *c, char *p, T *buf) {
    return c->dt == NATIVE ? (T *)p : buf;
}
MT_CPU_INLINE void SFX(bn_write)(const bn_ctx *c, char *p, int64_t m, const T *v) {
    if (c->dt != NATIVE) STORE(p, c->es, c->dt, m, v);
}

/* sum and sum of squares of (x - k) over channel ch: the shift by one of the channel's own
   values keeps the one-pass variance free of cancellation when |mean| >> std */
MT_CPU_INLINE void SFX(bn_shifted_sums)(const bn_ctx *c, int64_t ch, T k, double *s1, double *s2) {
    T buf[CHUNK];
    double a1 = 0, a2 = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t s0 = 0; s0 < c->S; s0 += CHUNK) {
            int64_t m = c->S - s0 < CHUNK ? c->S - s0 : CHUNK;
            const T *x = SFX(bn_read)(c, bn_at(c->x, c, n, ch, s0), m, buf);
            T p1, p2;
            SFX(sums2)(x, k, x, k, m, &p1, &p2);
            a1 += (double)p1;
            a2 += (double)p2;
        }
    *s1 = a1;
    *s2 = a2;
}

/* channels [cb, ce): statistics (training) or the running ones (eval), then one pass
   y = act(x * scale + shift + residual) */
MT_CPU_CLONES static int SFX(bn_channels)(void *vctx, int64_t cb, int64_t ce, int part) {
    (void)part;
    const bn_ctx *c = vctx;
    const mt_bn_args *a = c->a;
    for (int64_t ch = cb; ch < ce; ch++) {
        T k0 = 0;
        double s1 = 0, s2 = 0;
        if (a->training) {
            LOAD(bn_at(c->x, c, 0, ch, 0), c->es, c->dt, 1, &k0);
            SFX(bn_shifted_sums)(c, ch, k0, &s1, &s2);
        }
        SFX(bn_consts) q = SFX(bn_consts_of)(c, ch, s1, s2, k0);
        T k = q.k, md = q.md, scale = q.scale, shift = q.shift;
        T xbuf[CHUNK], obuf[CHUNK], rbuf[CHUNK];
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t s0 = 0; s0 < c->S; s0 += CHUNK) {
                int64_t m = c->S - s0 < CHUNK ? c->S - s0 : CHUNK;
                const T *x = SFX(bn_read)(c, bn_at(c->x, c, n, ch, s0), m, xbuf);
                char *at = bn_at(c->out, c, n, ch, s0);
                T *o = SFX(bn_target)(c, at, obuf);
                for (int64_t j = 0; j < m; j++) o[j] = ((x[j] - k) - md) * scale + shift;
                if (c->res) {
                    const T *r = SFX(bn_read)(c, bn_at(c->res, c, n, ch, s0), m, rbuf);
                    for (int64_t j = 0; j < m; j++) o[j] += r[j];
                }
                if (a->relu)
                    for (int64_t j = 0; j < m; j++) o[j] = o[j] < 0 ? (T)0 : o[j]; /* NaN stays */
                SFX(bn_write)(c, at, m, o);
            }
    }
    return 0;
}

/* gz = gy, masked by y > 0 under relu, for one chunk: gy itself when it needs no mask and is
   T, else in gz */
MT_CPU_INLINE const T *SFX(bn_load_gz)(const bn_ctx *c, int64_t n, int64_t ch, int64_t s0,
                                       int64_t m, T *gz, T *tmp) {
    const T *gy = SFX(bn_read)(c, bn_at(c->gy, c, n, ch, s0), m, gz);
    if (!c->y) return gy;
    const T *y = SFX(bn_read)(c, bn_at(c->y, c, n, ch, s0), m, tmp);
    for (int64_t j = 0; j < m; j++) gz[j] = MT_RELU_GRAD(gy[j], y[j]);
    return gz;
}

/* channels [cb, ce) of the backward: pass 1 sums gz and gz * xhat, pass 2 writes gx and
   the residual's gradient */
MT_CPU_CLONES static int SFX(bn_backward_channels)(void *vctx, int64_t cb, int64_t ce, int part) {
    (void)part;
    const bn_ctx *c = vctx;
    const mt_bn_backward_args *a = c->ba;
    const T *w = c->w, *sm = c->sm, *sr = c->sr;
    T *gw = c->gw, *gb = c->gb;
    int64_t M = c->N * c->S;
    T gzbuf[CHUNK], tmp[CHUNK], xbuf[CHUNK], obuf[CHUNK];
    for (int64_t ch = cb; ch < ce; ch++) {
        T mean = sm[ch], rs = sr[ch];
        double sg = 0, sgx = 0;
        if (gw || gb || (a->gx && a->training)) {
            for (int64_t n = 0; n < c->N; n++)
                for (int64_t s0 = 0; s0 < c->S; s0 += CHUNK) {
                    int64_t m = c->S - s0 < CHUNK ? c->S - s0 : CHUNK;
                    const T *gz = SFX(bn_load_gz)(c, n, ch, s0, m, gzbuf, tmp);
                    const T *x = SFX(bn_read)(c, bn_at(c->x, c, n, ch, s0), m, xbuf);
                    T p, px;
                    SFX(sums2)(gz, 0, x, mean, m, &p, &px);
                    sg += (double)p;
                    sgx += (double)px * (double)rs;
                }
        }
        if (gw) gw[ch] = (T)sgx;
        if (gb) gb[ch] = (T)sg;
        if (!a->gx && !a->gres) continue;
        T k = (w ? w[ch] : (T)1) * rs;
        T mg = a->training ? (T)(sg / (double)M) : (T)0;
        T mgx = a->training ? (T)(sgx / (double)M) : (T)0;
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t s0 = 0; s0 < c->S; s0 += CHUNK) {
                int64_t m = c->S - s0 < CHUNK ? c->S - s0 : CHUNK;
                const T *gz = SFX(bn_load_gz)(c, n, ch, s0, m, gzbuf, tmp);
                if (a->gres) STORE(bn_at(c->gres, c, n, ch, s0), c->es, c->dt, m, gz);
                if (!a->gx) continue;
                const T *x = SFX(bn_read)(c, bn_at(c->x, c, n, ch, s0), m, xbuf);
                char *at = bn_at(c->gx, c, n, ch, s0);
                T *g = SFX(bn_target)(c, at, obuf);
                for (int64_t j = 0; j < m; j++) g[j] = k * (gz[j] - mg - (x[j] - mean) * rs * mgx);
                SFX(bn_write)(c, at, m, g);
            }
    }
    return 0;
}

#include "cpu_batch_norm_nhwc_impl.h"

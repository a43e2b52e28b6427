/* Batch norm (and its fused residual add and relu) on the CPU, for both layouts of x:
   - dense NCHW: x is [N, C, S] (S the product of the spatial dims); channels run in
     parallel, each reading its N runs of S values in chunks: the forward reads x once for the
     statistics (shifted one-pass sums) and once for the output, the backward reads x and gy
     once for the two channel sums and once for the input gradient (cpu_batch_norm_impl.h);
   - dense NHWC (channels-last, no copy to NCHW): M = N * H * W rows of C channels; the
     statistics are per-channel sums over row ranges (one per thread) combined in order, the
     output and the input gradient one pass over the rows (cpu_batch_norm_nhwc_impl.h).
   Same formulas in both: shifted one-pass sums in training, arithmetic in the accumulation
   type (F32, F64 for F64 inputs), partial sums combined in double. Every activation tensor
   (x, residual, y and the gradients) has x's dtype: the op casts them. */
#include <math.h>
#include <string.h>
#include "cpu.h"
#include "../math/norm_math.h"
#include "../math/scalar_ops.h" /* MT_RELU_GRAD */

#define CHUNK      512  /* NCHW: values of a channel's run read at a time */
#define NHWC_BLOCK 256  /* NHWC: rows summed in T before a flush into doubles */
#define NHWC_ELEMS 2048 /* NHWC: values per row buffer: rows_per = NHWC_ELEMS / C (at least 1) */

/* One context for both layouts and both directions. */
typedef struct {
    const mt_bn_args *a;           /* the forward's, or */
    const mt_bn_backward_args *ba; /* the backward's */
    int64_t N, C, S, M, es;        /* M = N * S values per channel */
    mt_dtype dt;                   /* of every activation tensor */
    const char *x, *res, *gy, *y;
    char *out, *gx, *gres;
    const void *w, *b;
    void *rm, *rv, *sm, *sr, *gw, *gb;
    /* NHWC only, in one scratch block: per-channel T arrays, */
    void *k, *md, *scale, *shift, *mean, *zero;
    double *parts;    /* nparts x 2C partial sums, */
    void *scratch;    /* nparts x per_part T: three row buffers and the block sums */
    int64_t rows_per; /* rows per buffer */
    int64_t per_part;
} bn_ctx;

static inline char *bn_at(const void *base, const bn_ctx *c, int64_t n, int64_t ch, int64_t s) {
    return (char *)base + ((n * c->C + ch) * c->S + s) * c->es;
}

#define MT_ACCUM_IMPL "cpu_batch_norm_impl.h"
#include "cpu_accum_types.h"

static void *opt(const mt_tensor *t) {
    return t ? mt_tensor_data(t) : NULL;
}

/* One block for every NHWC scratch array; *s1 and *s2 get double[C] each. */
static void *scratch_alloc(bn_ctx *c, int nparts, size_t ts, size_t *bytes, double **s1,
                           double **s2) {
    c->rows_per = c->C < NHWC_ELEMS ? NHWC_ELEMS / c->C : 1;
    c->per_part = 3 * c->rows_per * c->C + 2 * c->C;
    size_t C = (size_t)c->C, nd = 2 * C + (size_t)nparts * 2 * C;
    size_t nt = 6 * C + (size_t)nparts * (size_t)c->per_part;
    *bytes = nd * sizeof(double) + nt * ts;
    char *p = mt_host_alloc(*bytes);
    if (!p) return NULL;
    double *d = (double *)p;
    *s1 = d;
    *s2 = d + C;
    c->parts = d + 2 * C;
    char *t = p + nd * sizeof(double);
    void **arrays[6] = {&c->k, &c->md, &c->scale, &c->shift, &c->mean, &c->zero};
    for (int i = 0; i < 6; i++) *arrays[i] = t + (size_t)i * C * ts;
    c->scratch = t + 6 * C * ts;
    return p;
}

/* The NHWC pass (forward or backward) over c with its scratch block. */
static int nhwc_run(bn_ctx *c, bool wide) {
    if (c->C == 0 || (c->a && c->M == 0)) return 0;
    int nparts = mt_cpu_num_threads();
    size_t bytes;
    double *s1, *s2;
    void *block = scratch_alloc(c, nparts, wide ? sizeof(double) : sizeof(float), &bytes, &s1, &s2);
    if (!block)
        return mt_error_set(MT_ERR_OOM, "mt_batch_norm: out of memory for channels-last scratch");
    int rc = c->a ? (wide ? nhwc_forward_d : nhwc_forward_f)(c, nparts, s1, s2)
                  : (wide ? nhwc_backward_d : nhwc_backward_f)(c, nparts, s1, s2);
    mt_host_free(block, bytes);
    return rc;
}

/* Completes c (the tensors of either direction) with what both directions have and runs the
   pass for x's layout: dense NCHW, or dense NHWC (4-d and not contiguous: the backend's
   batch_norm_nhwc). Accumulation type F64 when the saved statistics are F64, F32 otherwise. */
static int bn_run(bn_ctx *c, const mt_tensor *x, const mt_tensor *weight, const mt_tensor *sm,
                  const mt_tensor *sr) {
    c->N = x->shape[0];
    c->C = x->shape[1];
    c->S = 1;
    for (int d = 2; d < x->ndim; d++) c->S *= x->shape[d];
    c->M = c->N * c->S;
    c->es = (int64_t)mt_dtype_size(x->dtype);
    c->dt = x->dtype;
    c->x = mt_tensor_data(x);
    c->w = opt(weight);
    c->sm = mt_tensor_data(sm);
    c->sr = mt_tensor_data(sr);
    bool wide = sm->dtype == MT_F64;
    if (x->ndim == 4 && !mt_is_contiguous(x)) return nhwc_run(c, wide);
    mt_cpu_part_fn fn = c->a ? (wide ? bn_channels_d : bn_channels_f)
                             : (wide ? bn_backward_channels_d : bn_backward_channels_f);
    return mt_cpu_for_parts(fn, c, c->C, x->numel * (c->a ? 3 : 4));
}

int mt_cpu_batch_norm(const mt_bn_args *a) {
    bn_ctx c = {.a = a,
                .res = opt(a->residual),
                .b = opt(a->bias),
                .rm = opt(a->running_mean),
                .rv = opt(a->running_var),
                .out = mt_tensor_data(a->y)};
    return bn_run(&c, a->x, a->weight, a->save_mean, a->save_rstd);
}

int mt_cpu_batch_norm_backward(const mt_bn_backward_args *a) {
    bn_ctx c = {.ba = a,
                .gy = mt_tensor_data(a->gy),
                .y = opt(a->y),
                .gx = opt(a->gx),
                .gres = opt(a->gres),
                .gw = opt(a->gw),
                .gb = opt(a->gb)};
    return bn_run(&c, a->x, a->weight, a->save_mean, a->save_rstd);
}

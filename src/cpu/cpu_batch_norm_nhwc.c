/* Batch norm (with its fused residual add and relu) on channels-last input, without a copy
   to NCHW: x [N, C, H, W] with NHWC strides is M = N * H * W rows of C channels. The
   statistics are per-channel sums over the rows, split into row ranges (one per thread)
   whose partial sums are combined in order; the output and the input gradient are one pass
   over the rows, written channels-last. Same formulas and accumulation types as the NCHW
   kernels (cpu_batch_norm.c): shifted one-pass sums in training, arithmetic in F32 (F64 for
   F64 inputs). */
#include <math.h>
#include <string.h>
#include "cpu.h"
#include "../math/norm_math.h"

#define NHWC_BLOCK 256  /* rows summed in T before a flush into doubles */
#define NHWC_ELEMS 2048 /* values per row buffer: rows_per = NHWC_ELEMS / C rows (at least 1) */

typedef struct {
    const mt_bn_args *a;
    const mt_bn_backward_args *ba;
    int64_t M, C, es;
    mt_dtype dt;
    const char *x, *res, *gy, *y;
    char *out, *gx, *gres;
    const void *w, *b;
    void *rm, *rv, *sm, *sr, *gw, *gb;
    /* per-channel T arrays (scratch) */
    void *k, *md, *scale, *shift, *mean, *zero;
    double *parts;    /* nparts x 2C partial sums */
    void *scratch;    /* nparts x per_part T: three row buffers and the block sums */
    int64_t rows_per; /* rows per buffer */
    int64_t per_part;
} nhwc_ctx;

#define MT_ACCUM_IMPL "cpu_batch_norm_nhwc_impl.h"
#include "cpu_accum_types.h"

static void *opt(const mt_tensor *t) {
    return t ? mt_tensor_data(t) : NULL;
}

/* One block for every scratch array; *s1 and *s2 get double[C] each. */
static void *scratch_alloc(nhwc_ctx *c, int nparts, size_t ts, size_t *bytes, double **s1,
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

static void shape_init(nhwc_ctx *c, const mt_tensor *x) {
    c->C = x->shape[1];
    c->M = x->shape[0] * x->shape[2] * x->shape[3];
    c->es = (int64_t)mt_dtype_size(x->dtype);
    c->dt = x->dtype;
    c->x = mt_tensor_data(x);
}

typedef int (*nhwc_pass)(nhwc_ctx *c, int nparts, double *s1, double *s2);

/* One pass (forward or backward) over c with its scratch block: accumulation type F64 when
   the saved statistics are F64, F32 otherwise. */
static int nhwc_run(nhwc_ctx *c, bool wide, nhwc_pass pass_f, nhwc_pass pass_d) {
    int nparts = mt_cpu_num_threads();
    size_t bytes;
    double *s1, *s2;
    void *block = scratch_alloc(c, nparts, wide ? sizeof(double) : sizeof(float), &bytes, &s1, &s2);
    if (!block)
        return mt_error_set(MT_ERR_OOM, "mt_batch_norm: out of memory for channels-last scratch");
    int rc = (wide ? pass_d : pass_f)(c, nparts, s1, s2);
    mt_host_free(block, bytes);
    return rc;
}

int mt_cpu_batch_norm_nhwc(const mt_bn_args *a) {
    nhwc_ctx c = {.a = a,
                  .res = opt(a->residual),
                  .w = opt(a->weight),
                  .b = opt(a->bias),
                  .rm = opt(a->running_mean),
                  .rv = opt(a->running_var),
                  .sm = mt_tensor_data(a->save_mean),
                  .sr = mt_tensor_data(a->save_rstd),
                  .out = mt_tensor_data(a->y)};
    shape_init(&c, a->x);
    if (c.M == 0 || c.C == 0) return 0;
    return nhwc_run(&c, a->save_mean->dtype == MT_F64, nhwc_forward_f, nhwc_forward_d);
}

int mt_cpu_batch_norm_backward_nhwc(const mt_bn_backward_args *a) {
    nhwc_ctx c = {.ba = a,
                  .gy = mt_tensor_data(a->gy),
                  .y = opt(a->y),
                  .gx = opt(a->gx),
                  .gres = opt(a->gres),
                  .w = opt(a->weight),
                  .sm = mt_tensor_data(a->save_mean),
                  .sr = mt_tensor_data(a->save_rstd),
                  .gw = opt(a->gw),
                  .gb = opt(a->gb)};
    shape_init(&c, a->x);
    if (c.C == 0) return 0;
    return nhwc_run(&c, a->save_mean->dtype == MT_F64, nhwc_backward_f, nhwc_backward_d);
}

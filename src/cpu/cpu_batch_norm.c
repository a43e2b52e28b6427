/* Batch norm (and its fused residual add and relu) on the CPU. x is [N, C, S] (S the product
   of the spatial dims), contiguous; channels run in parallel, each reading its N runs of S
   values in chunks: the forward reads x once for the statistics (shifted one-pass sums) and
   once for the output, the backward reads x and gy once for the two channel sums and once
   for the input gradient. Arithmetic in the accumulation type (F32, F64 for F64 inputs);
   per-chunk partial sums are combined in double. Every activation tensor (x, residual, y and
   the gradients) has x's dtype: the op casts them. */
#include <math.h>
#include <string.h>
#include "cpu.h"
#include "../math/norm_math.h"

#define CHUNK 512

typedef struct {
    const mt_bn_args *a;
    const mt_bn_backward_args *ba;
    int64_t N, C, S, es;
    mt_dtype xdt, gydt, gxdt, gresdt;
    const char *x, *res, *gy, *y;
    char *out, *gx, *gres;
    const void *w, *b;
    void *rm, *rv, *sm, *sr, *gw, *gb;
} bn_ctx;

static inline char *bn_at(const void *base, const bn_ctx *c, int64_t n, int64_t ch, int64_t s) {
    return (char *)base + ((n * c->C + ch) * c->S + s) * c->es;
}

#define MT_ACCUM_IMPL "cpu_batch_norm_impl.h"
#include "cpu_accum_types.h"

static void *opt(const mt_tensor *t) {
    return t ? mt_tensor_data(t) : NULL;
}

static void shape_init(bn_ctx *c, const mt_tensor *x) {
    c->N = x->shape[0];
    c->C = x->shape[1];
    c->S = 1;
    for (int d = 2; d < x->ndim; d++) c->S *= x->shape[d];
    c->es = (int64_t)mt_dtype_size(x->dtype);
    c->xdt = c->gydt = c->gxdt = c->gresdt = x->dtype;
    c->x = mt_tensor_data(x);
}

/* x is dense NCHW or dense NHWC (the backend's batch_norm_nhwc); the latter has its kernels */
static bool nhwc(const mt_tensor *x) {
    return x->ndim == 4 && !mt_is_contiguous(x);
}

int mt_cpu_batch_norm(const mt_bn_args *a) {
    if (nhwc(a->x)) return mt_cpu_batch_norm_nhwc(a);
    bn_ctx c = {.a = a,
                .res = opt(a->residual),
                .w = opt(a->weight),
                .b = opt(a->bias),
                .rm = opt(a->running_mean),
                .rv = opt(a->running_var),
                .sm = mt_tensor_data(a->save_mean),
                .sr = mt_tensor_data(a->save_rstd)};
    shape_init(&c, a->x);
    c.out = mt_tensor_data(a->y);
    bool wide = a->save_mean->dtype == MT_F64;
    return mt_cpu_for_parts(wide ? bn_channels_d : bn_channels_f, &c, c.C, a->x->numel * 3);
}

int mt_cpu_batch_norm_backward(const mt_bn_backward_args *a) {
    if (nhwc(a->x)) return mt_cpu_batch_norm_backward_nhwc(a);
    bn_ctx c = {.ba = a,
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
    bool wide = a->save_mean->dtype == MT_F64;
    return mt_cpu_for_parts(wide ? bn_backward_channels_d : bn_backward_channels_f, &c, c.C,
                            a->x->numel * 4);
}

/* Pooling through oneDNN where its definition is torch's: F32 and BF16 average pooling,
   forward and backward, when oneDNN's divisor is torch's (padding excluded, or included with
   every window inside the padded input, which is always so without ceil_mode), and adaptive
   average pooling with evenly dividing sizes. Everything else runs in cpu_pool.c's loops:
   max pooling (oneDNN's max drops a NaN where torch propagates it, and its backward needs a
   forward workspace), uneven adaptive windows, F16 and F64. */
#include <string.h>
#include "cpu_dnnl.h"

typedef struct {
    int backward, alg, dtype, channels_last;
    int64_t x[4], y[4], kernel[2], stride[2], pad_l[2], pad_r[2];
} pool_key;

/* Fills k for the case, or false when oneDNN's semantics differ from torch's there. */
static bool pool_case(pool_key *k, const mt_tensor *x, const mt_tensor *y,
                      const mt_pool2d_params *p, bool backward) {
    memset(k, 0, sizeof *k);
    if (x->dtype != MT_F32 && x->dtype != MT_BF16) return false;
    if (p->kind == MT_POOL_MAX) return false; /* NaN semantics differ; see the top */
    k->backward = backward;
    k->dtype = (int)mt_dnnl_dtype(x->dtype);
    k->channels_last = mt_prefers_channels_last(y);
    memcpy(k->x, x->shape, sizeof k->x);
    memcpy(k->y, y->shape, sizeof k->y);
    bool include = p->kind == MT_POOL_ADAPTIVE_AVG || p->count_include_pad;
    for (int i = 0; i < 2; i++) {
        int64_t in = x->shape[2 + i], out = y->shape[2 + i];
        if (p->kind == MT_POOL_ADAPTIVE_AVG) {
            if (in % out) return false; /* uneven windows */
            k->kernel[i] = k->stride[i] = in / out;
            continue;
        }
        k->kernel[i] = p->kernel[i];
        k->stride[i] = p->stride[i];
        k->pad_l[i] = p->padding[i];
        /* the right padding that makes oneDNN's size formula give torch's output size */
        int64_t reach; /* kernels and strides near 2^63 overflow here: the plain loops */
        if (__builtin_mul_overflow(out - 1, p->stride[i], &reach) ||
            __builtin_add_overflow(reach, p->kernel[i], &reach))
            return false;
        k->pad_r[i] = reach - in - p->padding[i];
        if (k->pad_r[i] < 0) return false;
        /* oneDNN divides by the whole kernel; torch by the window clipped to the padded
           input: the same only while no window reaches past the right padding */
        if (include && k->pad_r[i] > k->pad_l[i]) return false;
    }
    k->alg = include ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding;
    return true;
}

/* The primitive for k (cached); NULL with an error, or NULL with *none set and no error when
   oneDNN has no implementation (BF16 on a CPU without AVX-512), which is remembered per key so
   that the loops of cpu_pool.c take the next call without asking oneDNN again. */
static dnnl_primitive_t pool_prim(const char *op, const pool_key *k, bool *none) {
    *none = false;
    dnnl_primitive_t prim = mt_dnnl_cache_get(k, sizeof *k);
    if (prim) return prim;
    if (mt_dnnl_cache_none(k, sizeof *k)) {
        *none = true;
        return NULL;
    }
    dnnl_engine_t e = mt_dnnl_engine(op);
    dnnl_memory_desc_t src, dst;
    dnnl_data_type_t dt = (dnnl_data_type_t)k->dtype;
    if (!e || mt_dnnl_md_plain(op, &src, 4, k->x, dt, k->channels_last) ||
        mt_dnnl_md_plain(op, &dst, 4, k->y, dt, k->channels_last))
        return NULL;
    dnnl_dims_t st = {k->stride[0], k->stride[1]}, ker = {k->kernel[0], k->kernel[1]};
    dnnl_dims_t dil = {0, 0}, pl = {k->pad_l[0], k->pad_l[1]}, pr = {k->pad_r[0], k->pad_r[1]};
    dnnl_alg_kind_t alg = (dnnl_alg_kind_t)k->alg;
    dnnl_pooling_v2_desc_t fd, bd;
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    dnnl_prop_kind_t prop = k->backward ? dnnl_forward_training : dnnl_forward_inference;
    dnnl_status_t rc =
        dnnl_pooling_v2_forward_desc_init(&fd, prop, alg, &src, &dst, st, ker, dil, pl, pr);
    if (rc == dnnl_success) rc = dnnl_primitive_desc_create(&hint, &fd, NULL, e, NULL);
    if (rc == dnnl_success && !k->backward) {
        pd = hint;
        hint = NULL;
    } else if (rc == dnnl_success) {
        rc = dnnl_pooling_v2_backward_desc_init(&bd, alg, &src, &dst, st, ker, dil, pl, pr);
        if (rc == dnnl_success) rc = dnnl_primitive_desc_create(&pd, &bd, NULL, e, hint);
    }
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (rc != dnnl_success) { /* the loops take any case oneDNN refuses */
        *none = true;
        if (rc == dnnl_unimplemented) mt_dnnl_cache_put_none(k, sizeof *k);
        return NULL;
    }
    return mt_dnnl_cache_put(op, k, sizeof *k, pd);
}

static int pool_run(const char *op, dnnl_primitive_t prim, const mt_tensor *in, int in_kind,
                    dnnl_query_t in_q, mt_tensor *out, int out_kind, dnnl_query_t out_q) {
    mt_dnnl_arg args[2] = {{0}};
    const int kinds[2] = {in_kind, out_kind};
    dnnl_memory_desc_t ui, uo;
    const dnnl_memory_desc_t *wi = mt_dnnl_query_md(prim, in_q),
                             *wo = mt_dnnl_query_md(prim, out_q);
    int rc = mt_dnnl_md_of(op, &ui, in, 1) || mt_dnnl_md_of(op, &uo, out, 1) ? mt_last_status() : 0;
    if (rc == 0 && (!wi || !wo)) rc = mt_error_set(MT_ERR_INTERNAL, "%s: oneDNN query failed", op);
    if (rc == 0) rc = mt_dnnl_bind(op, &args[0], in, &ui, wi, false);
    if (rc == 0) rc = mt_dnnl_bind(op, &args[1], out, &uo, wo, true);
    if (rc == 0) rc = mt_dnnl_execute(op, prim, 2, kinds, args);
    mt_dnnl_release(args, 2);
    return rc;
}

static const char *op_name(const mt_pool2d_params *p) {
    return p->kind == MT_POOL_MAX   ? "mt_max_pool2d"
           : p->kind == MT_POOL_AVG ? "mt_avg_pool2d"
                                    : "mt_adaptive_avg_pool2d";
}

int mt_cpu_pool2d_dnnl(mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p, bool *done) {
    pool_key k;
    *done = false;
    if (!pool_case(&k, x, y, p, false)) return 0;
    bool none;
    dnnl_primitive_t prim = pool_prim(op_name(p), &k, &none);
    if (!prim) return none ? 0 : (int)mt_last_status(); /* not a user's earlier error */
    *done = true;
    return pool_run(op_name(p), prim, x, DNNL_ARG_SRC, dnnl_query_src_md, y, DNNL_ARG_DST,
                    dnnl_query_dst_md);
}

int mt_cpu_pool2d_backward_dnnl(mt_tensor *gx, const mt_tensor *gy, const mt_pool2d_params *p,
                                bool *done) {
    pool_key k;
    *done = false;
    if (gy->dtype != gx->dtype || !pool_case(&k, gx, gy, p, true)) return 0;
    k.channels_last = mt_prefers_channels_last(gx);
    bool none;
    dnnl_primitive_t prim = pool_prim(op_name(p), &k, &none);
    if (!prim) return none ? 0 : (int)mt_last_status();
    *done = true;
    return pool_run(op_name(p), prim, gy, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, gx,
                    DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md);
}

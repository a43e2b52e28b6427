/* Convolution on the CPU: forward, backward-data and backward-weight through oneDNN in F32
   and BF16 (BF16 natively: FP32 accumulation, AVX512-BF16/AMX where the CPU has them, emulated
   on other AVX-512 CPUs). Where oneDNN has no BF16 implementation (oneDNN 2.6 on a CPU without
   AVX-512, e.g. AVX2 only), the primitive query answers dnnl_unimplemented: the call then runs
   in F32 copies, FP32 accumulation and one rounding of the output as the native route, and the
   answer is remembered per shape (mt_dnnl_cache_put_none). MT_CPU_BF16_CONV=convert makes
   every BF16 query answer so (the tests run that on every machine). F16 always runs through F32
   copies (oneDNN 2.6 has no F16 convolution on CPUs); F64 through the plain reference loops of
   cpu_conv_ref.c, so that FP64 gradchecks work (oneDNN has no F64).
   Channels-last tensors are handed to oneDNN as they are (NHWC); NCHW ones and the weights are
   reordered per call into the blocked layouts oneDNN prefers. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_dnnl.h"

/* MT_CPU_BF16_CONV=convert, read once per process (0 unknown, 1 native first, 2 convert):
   every BF16 primitive query then answers dnnl_unimplemented, as oneDNN 2.6 does on a CPU
   without AVX-512, so that the fallback runs on every machine. Threads that race to fill it
   compute the same answer. */
static atomic_int bf16_route;

static bool bf16_convert_forced(void) {
    int r = atomic_load_explicit(&bf16_route, memory_order_relaxed);
    if (r == 0) {
        const char *v = getenv("MT_CPU_BF16_CONV");
        r = v && strcmp(v, "convert") == 0 ? 2 : 1;
        atomic_store_explicit(&bf16_route, r, memory_order_relaxed);
    }
    return r == 2;
}

typedef enum { CONV_FWD = 1, CONV_BWD_DATA, CONV_BWD_WEIGHT } conv_kind;

/* Everything a primitive depends on; zeroed before filling, compared byte for byte. */
typedef struct {
    int kind, dtype, channels_last, bias;
    int64_t x[4], w[4], y[4];
    mt_conv2d_params p;
} conv_key;

static int conv_descs(const char *op, const conv_key *k, dnnl_memory_desc_t *src,
                      dnnl_memory_desc_t *wei, dnnl_memory_desc_t *bia, dnnl_memory_desc_t *dst) {
    dnnl_data_type_t dt = (dnnl_data_type_t)k->dtype;
    if (mt_dnnl_md_plain(op, bia, 1, k->w, dt, false)) return mt_last_status();
    if (k->channels_last) { /* oneDNN's fast kernels read and write NHWC directly */
        if (mt_dnnl_md_plain(op, src, 4, k->x, dt, true) ||
            mt_dnnl_md_plain(op, dst, 4, k->y, dt, true))
            return mt_last_status();
    } else { /* plain NCHW only has im2col + GEMM: let oneDNN pick a blocked layout (nChw16c)
                and reorder in and out, as PyTorch's oneDNN path does */
        dnnl_dims_t xd = {k->x[0], k->x[1], k->x[2], k->x[3]},
                    yd = {k->y[0], k->y[1], k->y[2], k->y[3]};
        if (mt_dnnl_check(op, dnnl_memory_desc_init_by_tag(src, 4, xd, dt, dnnl_format_tag_any),
                          "describing the input") ||
            mt_dnnl_check(op, dnnl_memory_desc_init_by_tag(dst, 4, yd, dt, dnnl_format_tag_any),
                          "describing the output"))
            return mt_last_status();
    }
    dnnl_dims_t wd;
    int nd = 4;
    int64_t g = k->p.groups;
    if (g > 1) {
        wd[0] = g;
        wd[1] = k->w[0] / g;
        for (int i = 1; i < 4; i++) wd[i + 1] = k->w[i];
        nd = 5;
    } else {
        for (int i = 0; i < 4; i++) wd[i] = k->w[i];
    }
    return mt_dnnl_check(op, dnnl_memory_desc_init_by_tag(wei, nd, wd, dt, dnnl_format_tag_any),
                         "describing the weights");
}

/* A primitive descriptor for desc. A BF16 one that oneDNN has no implementation for sets no
   error: *none tells the caller to compute in F32. Nonzero when there is no descriptor. */
static int pd_create(const char *op, const conv_key *k, dnnl_primitive_desc_t *pd, const void *desc,
                     dnnl_engine_t e, const_dnnl_primitive_desc_t hint, const char *what,
                     bool *none) {
    bool bf16 = k->dtype == (int)dnnl_bf16;
    dnnl_status_t st = bf16 && bf16_convert_forced()
                           ? dnnl_unimplemented /* the answer of oneDNN 2.6 on AVX2 */
                           : dnnl_primitive_desc_create(pd, desc, NULL, e, hint);
    if (st == dnnl_unimplemented && bf16) {
        *none = true;
        return 1;
    }
    return mt_dnnl_check(op, st, what);
}

/* The primitive for k, from the cache or made now; NULL with an error, or NULL with *none set
   (no error) when oneDNN has no BF16 implementation for k. */
static dnnl_primitive_t conv_prim(const char *op, const conv_key *k, bool *none) {
    *none = false;
    dnnl_primitive_t prim = mt_dnnl_cache_get(k, sizeof *k);
    if (prim) return prim;
    if (mt_dnnl_cache_none(k, sizeof *k)) {
        *none = true;
        return NULL;
    }
    dnnl_engine_t e = mt_dnnl_engine(op);
    dnnl_memory_desc_t src, wei, bia, dst;
    if (!e || conv_descs(op, k, &src, &wei, &bia, &dst)) return NULL;
    const mt_conv2d_params *p = &k->p;
    dnnl_dims_t st = {p->stride[0], p->stride[1]}, pad = {p->padding[0], p->padding[1]};
    dnnl_dims_t dil = {p->dilation[0] - 1, p->dilation[1] - 1}; /* oneDNN counts the gaps */
    dnnl_convolution_desc_t fd, bd;
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    /* torch's padding on both sides: the output size formula floors the same way */
    int rc = mt_dnnl_check(op,
                           dnnl_dilated_convolution_forward_desc_init(
                               &fd, dnnl_forward_training, dnnl_convolution_direct, &src, &wei,
                               k->bias ? &bia : NULL, &dst, st, dil, pad, pad),
                           "a convolution descriptor");
    if (rc == 0) rc = pd_create(op, k, &hint, &fd, e, NULL, "a forward convolution", none);
    if (rc == 0 && k->kind == CONV_FWD) {
        pd = hint;
        hint = NULL;
    } else if (rc == 0 && k->kind == CONV_BWD_DATA) {
        rc = mt_dnnl_check(op,
                           dnnl_dilated_convolution_backward_data_desc_init(
                               &bd, dnnl_convolution_direct, &src, &wei, &dst, st, dil, pad, pad),
                           "a backward-data descriptor");
        if (rc == 0) rc = pd_create(op, k, &pd, &bd, e, hint, "a backward-data convolution", none);
    } else if (rc == 0) {
        rc = mt_dnnl_check(
            op,
            dnnl_dilated_convolution_backward_weights_desc_init(
                &bd, dnnl_convolution_direct, &src, &wei, NULL, &dst, st, dil, pad, pad),
            "a backward-weight descriptor");
        if (rc == 0)
            rc = pd_create(op, k, &pd, &bd, e, hint, "a backward-weight convolution", none);
    }
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (*none) mt_dnnl_cache_put_none(k, sizeof *k);
    return rc ? NULL : mt_dnnl_cache_put(op, k, sizeof *k, pd);
}

static void key_init(conv_key *k, conv_kind kind, const mt_tensor *x, const mt_tensor *w,
                     const mt_tensor *y, bool bias, bool channels_last, const mt_conv2d_params *p) {
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->dtype = (int)mt_dnnl_dtype(x->dtype);
    k->channels_last = channels_last;
    k->bias = bias;
    memcpy(k->x, x->shape, sizeof k->x);
    memcpy(k->w, w->shape, sizeof k->w);
    memcpy(k->y, y->shape, sizeof k->y);
    k->p = *p;
}

/* Binds the n tensors to prim's arguments (want[i]: the descriptor query, or
   dnnl_query_undef for the bias, which is plain) and runs it. */
static int conv_run(const char *op, dnnl_primitive_t prim, int n, const mt_tensor *const *ts,
                    const int *kinds, const dnnl_query_t *want, int out, int64_t groups) {
    mt_dnnl_arg args[4] = {{0}};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        dnnl_memory_desc_t user;
        bool weights = kinds[i] == DNNL_ARG_WEIGHTS || kinds[i] == DNNL_ARG_DIFF_WEIGHTS;
        rc = mt_dnnl_md_of(op, &user, ts[i], weights ? groups : 1);
        const dnnl_memory_desc_t *w =
            want[i] == dnnl_query_undef ? &user : mt_dnnl_query_md(prim, want[i]);
        if (rc == 0 && !w) rc = mt_error_set(MT_ERR_INTERNAL, "%s: oneDNN query failed", op);
        if (rc == 0) rc = mt_dnnl_bind(op, &args[i], ts[i], &user, w, i == out);
    }
    if (rc == 0) rc = mt_dnnl_execute(op, prim, n, kinds, args);
    mt_dnnl_release(args, n);
    return rc;
}

/* ---- F16, and BF16 where oneDNN has no BF16 convolution, through F32 copies */

typedef struct {
    mt_storage st;
    mt_tensor h;
} f32_copy;

/* A dense F32 copy of t in t's format (the values copied when in). */
static int f32_make(const char *op, f32_copy *c, const mt_tensor *t, bool in) {
    size_t nbytes = (size_t)t->numel * 4;
    void *buf = mt_host_alloc(nbytes ? nbytes : 1);
    if (!buf) return mt_error_set(MT_ERR_OOM, "%s: out of memory for an F32 copy", op);
    c->st = (mt_storage){.data = buf, .nbytes = nbytes, .device = MT_CPU};
    int64_t strides[4];
    bool cl = t->ndim == 4 && mt_prefers_channels_last(t);
    if (cl) mt_channels_last_strides(t->shape, strides);
    mt_tensor_header_init(&c->h, &c->st, MT_F32, t->ndim, t->shape, cl ? strides : NULL, 0);
    return in ? mt_cpu_copy(&c->h, t) : 0;
}

static void f32_free(f32_copy *c, int n) {
    for (int i = 0; i < n; i++)
        if (c[i].st.data) mt_host_free(c[i].st.data, c[i].st.nbytes ? c[i].st.nbytes : 1);
}

typedef int (*conv_fn)(mt_tensor *out, const mt_tensor *a, const mt_tensor *b, const mt_tensor *c,
                       const mt_conv2d_params *p);

/* Runs fn on F32 copies of out and the inputs (c may be NULL), then rounds out back. */
static int via_f32(conv_fn fn, mt_tensor *out, const mt_tensor *a, const mt_tensor *b,
                   const mt_tensor *c, const mt_conv2d_params *p) {
    const char *op = "mt_conv2d";
    f32_copy cp[4] = {0};
    int rc = f32_make(op, &cp[0], out, false);
    if (rc == 0) rc = f32_make(op, &cp[1], a, true);
    if (rc == 0) rc = f32_make(op, &cp[2], b, true);
    if (rc == 0 && c) rc = f32_make(op, &cp[3], c, true);
    if (rc == 0) rc = fn(&cp[0].h, &cp[1].h, &cp[2].h, c ? &cp[3].h : NULL, p);
    if (rc == 0) rc = mt_cpu_copy(out, &cp[0].h);
    f32_free(cp, 4);
    return rc;
}

/* ---- the three families */

static int conv_forward(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                        const mt_conv2d_params *p) {
    const char *op = "mt_conv2d";
    if (x->dtype == MT_F64) return mt_cpu_conv2d_ref(y, x, w, b, p);
    if (x->dtype == MT_F16) return via_f32(conv_forward, y, x, w, b, p);
    conv_key k;
    key_init(&k, CONV_FWD, x, w, y, b != NULL, mt_prefers_channels_last(y), p);
    bool none;
    dnnl_primitive_t prim = conv_prim(op, &k, &none);
    if (none) return via_f32(conv_forward, y, x, w, b, p);
    if (!prim) return mt_last_status();
    const mt_tensor *ts[4] = {x, w, y, b};
    const int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    const dnnl_query_t want[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                  dnnl_query_undef};
    return conv_run(op, prim, b ? 4 : 3, ts, kinds, want, 2, p->groups);
}

int mt_cpu_conv2d(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                  const mt_conv2d_params *p) {
    return conv_forward(y, x, w, b, p);
}

static int conv_bwd_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                         const mt_tensor *unused, const mt_conv2d_params *p) {
    (void)unused;
    const char *op = "mt_conv2d";
    if (gy->dtype == MT_F64) return mt_cpu_conv2d_backward_data_ref(gx, gy, w, p);
    if (gy->dtype == MT_F16) return via_f32(conv_bwd_data, gx, gy, w, NULL, p);
    conv_key k;
    key_init(&k, CONV_BWD_DATA, gx, w, gy, false, mt_prefers_channels_last(gx), p);
    bool none;
    dnnl_primitive_t prim = conv_prim(op, &k, &none);
    if (none) return via_f32(conv_bwd_data, gx, gy, w, NULL, p);
    if (!prim) return mt_last_status();
    const mt_tensor *ts[3] = {gy, w, gx};
    const int kinds[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    const dnnl_query_t want[3] = {dnnl_query_diff_dst_md, dnnl_query_weights_md,
                                  dnnl_query_diff_src_md};
    return conv_run(op, prim, 3, ts, kinds, want, 2, p->groups);
}

int mt_cpu_conv2d_backward_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                const mt_conv2d_params *p) {
    return conv_bwd_data(gx, gy, w, NULL, p);
}

static int conv_bwd_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                           const mt_tensor *unused, const mt_conv2d_params *p) {
    (void)unused;
    const char *op = "mt_conv2d";
    if (gy->dtype == MT_F64) return mt_cpu_conv2d_backward_weight_ref(gw, gy, x, p);
    if (gy->dtype == MT_F16) return via_f32(conv_bwd_weight, gw, gy, x, NULL, p);
    conv_key k;
    key_init(&k, CONV_BWD_WEIGHT, x, gw, gy, false, mt_prefers_channels_last(x), p);
    bool none;
    dnnl_primitive_t prim = conv_prim(op, &k, &none);
    if (none) return via_f32(conv_bwd_weight, gw, gy, x, NULL, p);
    if (!prim) return mt_last_status();
    const mt_tensor *ts[3] = {gy, x, gw};
    const int kinds[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS};
    const dnnl_query_t want[3] = {dnnl_query_diff_dst_md, dnnl_query_src_md,
                                  dnnl_query_diff_weights_md};
    return conv_run(op, prim, 3, ts, kinds, want, 2, p->groups);
}

int mt_cpu_conv2d_backward_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                  const mt_conv2d_params *p) {
    return conv_bwd_weight(gw, gy, x, NULL, p);
}

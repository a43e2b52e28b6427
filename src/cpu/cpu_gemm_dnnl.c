/* BF16 GEMM through oneDNN's matmul. On CPUs with AVX512-BF16 (and AMX) oneDNN multiplies BF16
   operands natively with FP32 accumulation, where the generic path (cpu_gemm.c) widens both
   operands to FP32 panels for OpenBLAS. Used only where the CPU has AVX512-BF16 (elsewhere
   oneDNN would emulate BF16, slower than widening); MT_CPU_BF16_GEMM=convert forces the
   generic path. Same contract as the generic path: FP32 accumulation, one rounding to BF16
   at the end; the summation order differs, so results agree within BF16 rounding, not bit
   for bit. Operands are described as they lie in memory (strides, transposes; a broadcast
   batch dim, stride 0 or size 1, becomes a dim of size 1), so nothing is copied. The linear
   epilogue (bias, activation) is the matmul's bias argument and an eltwise post-op, applied
   to the FP32 sums before the one rounding. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_dnnl.h"

bool mt_cpu_bf16_gemm_native(void) {
    /* 0 unknown, 1 yes, 2 no. Threads that race to fill it in compute the same answer; the
       atomic makes that race defined (relaxed: nothing else is published with it). */
    static atomic_int state;
    int known = atomic_load_explicit(&state, memory_order_relaxed);
    if (!known) {
        const char *v = getenv("MT_CPU_BF16_GEMM");
        bool off = v && strcmp(v, "convert") == 0;
        bool has = false;
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512bf16");
#endif
        known = has && !off ? 1 : 2;
        atomic_store_explicit(&state, known, memory_order_relaxed);
    }
    return known == 1;
}

/* The primitive's key: every descriptor it depends on (zero-filled padding). */
typedef struct {
    char tag; /* 'm' */
    int nd;
    float alpha, beta;
    int act;   /* mt_activation, as an eltwise post-op */
    bool bias; /* a [1, N] bias of c's dtype */
    int64_t adims[MT_MAX_DIMS], astr[MT_MAX_DIMS];
    int64_t bdims[MT_MAX_DIMS], bstr[MT_MAX_DIMS];
    int64_t cdims[MT_MAX_DIMS];
} matmul_key;

/* Operand t over c's nd dims: missing leading dims and broadcast dims get size 1. */
static void operand(const mt_tensor *t, int nd, int64_t *dims, int64_t *str) {
    int off = nd - t->ndim;
    for (int i = 0; i < nd; i++) {
        if (i < off) {
            dims[i] = 1;
            str[i] = 0;
            continue;
        }
        int64_t s = t->shape[i - off], st = t->strides[i - off];
        bool batch = i < nd - 2, bcast = batch && (s == 1 || st == 0);
        dims[i] = bcast ? 1 : s;
        str[i] = bcast ? 0 : st;
    }
}

/* false when oneDNN cannot describe the layout (then the generic path takes the GEMM) */
static bool describe(dnnl_memory_desc_t *md, int nd, const int64_t *dims, const int64_t *str) {
    dnnl_dims_t d, s;
    for (int i = 0; i < nd; i++) {
        d[i] = dims[i];
        s[i] = dims[i] == 1 ? 1 : str[i]; /* a size-1 dim's stride is never used */
        if (s[i] <= 0) return false;      /* a broadcast row or column: no oneDNN layout */
    }
    return dnnl_memory_desc_init_by_strides(md, nd, d, dnnl_bf16, s) == dnnl_success;
}

/* The post-ops of k (beta's sum, then the activation); 0 or an error. */
static int post_ops(const char *op, const matmul_key *k, dnnl_primitive_attr_t attr) {
    if (k->beta == 0.0f && k->act == MT_ACT_NONE) return 0;
    dnnl_post_ops_t post = NULL;
    int rc = mt_dnnl_check(op, dnnl_post_ops_create(&post), "the matmul's post-ops");
    if (!rc && k->beta != 0.0f) /* c = alpha a b + beta c: a sum post-op reads c */
        rc = mt_dnnl_check(op, dnnl_post_ops_append_sum(post, k->beta), "beta");
    if (!rc && k->act != MT_ACT_NONE) {
        dnnl_alg_kind_t alg = k->act == MT_ACT_RELU   ? dnnl_eltwise_relu
                              : k->act == MT_ACT_GELU ? dnnl_eltwise_gelu_erf
                                                      : dnnl_eltwise_gelu_tanh;
        rc = mt_dnnl_check(op, dnnl_post_ops_append_eltwise(post, 1.0f, alg, 0.0f, 0.0f),
                           "the activation");
    }
    if (!rc) rc = mt_dnnl_check(op, dnnl_primitive_attr_set_post_ops(attr, post), "post-ops");
    if (post) dnnl_post_ops_destroy(post);
    return rc;
}

static dnnl_primitive_t matmul_primitive(const char *op, const matmul_key *k,
                                         const dnnl_memory_desc_t *amd,
                                         const dnnl_memory_desc_t *bmd,
                                         const dnnl_memory_desc_t *biasmd,
                                         const dnnl_memory_desc_t *cmd, bool *unsupported) {
    dnnl_primitive_t prim = mt_dnnl_cache_get(k, sizeof *k);
    if (prim) return prim;
    dnnl_engine_t eng = mt_dnnl_engine(op);
    if (!eng) return NULL;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    /* a layout or broadcast oneDNN's matmul does not take: not an error, the generic path
       does it */
    if (dnnl_matmul_desc_init(&desc, amd, bmd, biasmd, cmd) != dnnl_success) {
        *unsupported = true;
        return NULL;
    }
    int rc = mt_dnnl_check(op, dnnl_primitive_attr_create(&attr), "matmul attributes");
    if (!rc && k->alpha != 1.0f)
        rc = mt_dnnl_check(op, dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha),
                           "the matmul's alpha");
    if (!rc) rc = post_ops(op, k, attr);
    if (!rc) {
        dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, eng, NULL);
        if (st == dnnl_unimplemented || st == dnnl_invalid_arguments) *unsupported = true;
        rc = *unsupported ? -1 : mt_dnnl_check(op, st, "a bf16 matmul");
    }
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc ? NULL : mt_dnnl_cache_put(op, k, sizeof *k, pd);
}

/* c = act(alpha a b + beta c + bias), bias NULL or [N] */
static int bf16_matmul(const char *op, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                       const mt_tensor *bias, double alpha, double beta, mt_activation act,
                       bool *unsupported) {
    *unsupported = false;
    matmul_key k;
    memset(&k, 0, sizeof k);
    k.tag = 'm';
    k.nd = c->ndim;
    k.alpha = (float)alpha;
    k.beta = (float)beta;
    k.act = (int)act;
    k.bias = bias != NULL;
    operand(a, k.nd, k.adims, k.astr);
    operand(b, k.nd, k.bdims, k.bstr);
    for (int i = 0; i < k.nd; i++) k.cdims[i] = c->shape[i];
    dnnl_memory_desc_t amd, bmd, cmd, biasmd;
    if (!describe(&amd, k.nd, k.adims, k.astr) || !describe(&bmd, k.nd, k.bdims, k.bstr)) {
        *unsupported = true;
        return 0;
    }
    if (mt_dnnl_md_of(op, &cmd, c, 1)) return mt_last_status();
    if (bias) { /* [N] as [1, N]: broadcast over the rows */
        int64_t bdims[MT_MAX_DIMS], bstr[MT_MAX_DIMS];
        for (int i = 0; i < k.nd; i++) bdims[i] = bstr[i] = 1;
        bdims[k.nd - 1] = bias->shape[0];
        if (!describe(&biasmd, k.nd, bdims, bstr)) {
            *unsupported = true;
            return 0;
        }
    }
    dnnl_primitive_t prim =
        matmul_primitive(op, &k, &amd, &bmd, bias ? &biasmd : NULL, &cmd, unsupported);
    if (!prim) return *unsupported ? 0 : mt_last_status();
    mt_dnnl_arg args[4];
    memset(args, 0, sizeof args);
    int n = bias ? 4 : 3;
    int rc = mt_dnnl_bind(op, &args[0], a, &amd, &amd, false);
    if (!rc) rc = mt_dnnl_bind(op, &args[1], b, &bmd, &bmd, false);
    if (!rc) rc = mt_dnnl_bind(op, &args[2], c, &cmd, &cmd, true);
    if (!rc && bias) rc = mt_dnnl_bind(op, &args[3], bias, &biasmd, &biasmd, false);
    static const int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    if (!rc) rc = mt_dnnl_execute(op, prim, n, kinds, args);
    mt_dnnl_release(args, n);
    return rc;
}

int mt_cpu_gemm_bf16_dnnl(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha,
                          double beta, bool *unsupported) {
    return bf16_matmul("mt_matmul", c, a, b, NULL, alpha, beta, MT_ACT_NONE, unsupported);
}

int mt_cpu_gemm_bf16_dnnl_epilogue(const mt_gemm_epilogue_args *e, bool *unsupported) {
    return bf16_matmul("mt_linear", e->c, e->a, e->b, e->bias, 1.0, 0.0, e->act, unsupported);
}

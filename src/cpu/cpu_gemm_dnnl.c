/* F32 and BF16 GEMM through oneDNN's matmul.
   - BF16: on CPUs with AVX512-BF16 (and AMX) oneDNN multiplies BF16 operands natively with
     FP32 accumulation, where the generic path (cpu_gemm.c) widens both operands to FP32
     panels for OpenBLAS. Elsewhere oneDNN would emulate BF16, slower than widening.
     MT_CPU_BF16_GEMM=convert forces the generic path.
   - F32: on CPUs with AVX-512 (oneDNN's avx512_core brgemm kernels). On a 2-core Xeon VM
     with AMX, mt_matmul at 2 threads ran n^3 products 1.75x (n = 128) to 1.24x (n = 384,
     512) faster than with OpenBLAS 0.3.21's sgemm, equal at 96 and 1024, slower below 96
     (the primitive lookup and argument wrapping cost microseconds: `MT_CPU_F32_GEMM=openblas
     build/bench/matmul N` against `=onednn`), so products under DNNL_F32_MIN_FLOPS stay on
     OpenBLAS. MT_CPU_F32_GEMM=openblas or =onednn forces one library for every F32 GEMM
     (the tests run both on every machine). The FP32 panels of F16/BF16 GEMMs (cpu_gemm.c)
     use oneDNN's sgemm under the same rule.
   Same contract as the generic path: FP32 accumulation, one rounding at the end; the
   summation order differs between libraries, so results agree within rounding, not bit
   for bit. Operands are described as they lie in memory (strides, transposes; a broadcast
   batch dim, stride 0 or size 1, becomes a dim of size 1), so nothing is copied. The linear
   epilogue (bias, activation) is the matmul's bias argument and an eltwise post-op, applied
   to the FP32 sums before the one rounding. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_dnnl.h"

/* 2 * m * n * k below which OpenBLAS keeps an F32 GEMM (measured above) */
#define DNNL_F32_MIN_FLOPS (2.0 * 96 * 96 * 96)

/* How F32 and BF16 GEMMs are routed, decided once per process. */
typedef enum { ROUTE_UNKNOWN, ROUTE_NEVER, ROUTE_LARGE, ROUTE_ALWAYS } route;

/* Threads that race to fill a route in compute the same answer; the atomic makes that race
   defined (relaxed: nothing else is published with it). */
static atomic_int bf16_route, f32_route;

static bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static route choose_bf16(void) {
    bool native = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    native = __builtin_cpu_supports("avx512bf16");
#endif
    return native && !env_is("MT_CPU_BF16_GEMM", "convert") ? ROUTE_ALWAYS : ROUTE_NEVER;
}

static route choose_f32(void) {
    if (env_is("MT_CPU_F32_GEMM", "onednn")) return ROUTE_ALWAYS;
    if (env_is("MT_CPU_F32_GEMM", "openblas")) return ROUTE_NEVER;
    bool avx512_core = false; /* the ISA of oneDNN's avx512_core brgemm kernels */
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    avx512_core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return avx512_core ? ROUTE_LARGE : ROUTE_NEVER;
}

static route route_of(atomic_int *r, route (*choose)(void)) {
    int known = atomic_load_explicit(r, memory_order_relaxed);
    if (known == ROUTE_UNKNOWN) {
        known = (int)choose();
        atomic_store_explicit(r, known, memory_order_relaxed);
    }
    return (route)known;
}

bool mt_cpu_gemm_dnnl_wanted(mt_dtype dt, int64_t m, int64_t n, int64_t k) {
    if (m <= 0 || n <= 0 || k <= 0) return false; /* oneDNN faults creating empty products */
    route r = dt == MT_BF16  ? route_of(&bf16_route, choose_bf16)
              : dt == MT_F32 ? route_of(&f32_route, choose_f32)
                             : ROUTE_NEVER;
    return r == ROUTE_ALWAYS ||
           (r == ROUTE_LARGE && 2.0 * (double)m * (double)n * (double)k >= DNNL_F32_MIN_FLOPS);
}

/* The primitive's key: every descriptor it depends on (zero-filled padding). */
typedef struct {
    char tag; /* 'm' */
    int nd;
    int dtype; /* dnnl_data_type_t of a, b, bias and c */
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
static bool describe(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int nd, const int64_t *dims,
                     const int64_t *str) {
    dnnl_dims_t d, s;
    for (int i = nd - 1; i >= 0; i--) {
        d[i] = dims[i];
        /* A size-1 dim's stride is never used; it gets the row-major one, so that a [1, n]
           row is "ab" and not the ambiguous (1, 1), which oneDNN 2.6's kernels accept when
           the primitive is created and then refuse to run. */
        s[i] = dims[i] != 1 ? str[i] : i == nd - 1 ? 1 : s[i + 1] * d[i + 1];
        if (s[i] <= 0) return false; /* a broadcast row or column: no oneDNN layout */
    }
    return dnnl_memory_desc_init_by_strides(md, nd, d, dt, s) == dnnl_success;
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
        rc = *unsupported ? -1 : mt_dnnl_check(op, st, "a matmul");
    }
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc ? NULL : mt_dnnl_cache_put(op, k, sizeof *k, pd);
}

/* c = act(alpha a b + beta c + bias), bias NULL or [N] */
static int onednn_matmul(const char *op, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                         const mt_tensor *bias, double alpha, double beta, mt_activation act,
                         bool *unsupported) {
    *unsupported = false;
    matmul_key k;
    memset(&k, 0, sizeof k);
    k.tag = 'm';
    k.nd = c->ndim;
    dnnl_data_type_t dt = mt_dnnl_dtype(c->dtype);
    k.dtype = (int)dt;
    k.alpha = (float)alpha;
    k.beta = (float)beta;
    k.act = (int)act;
    k.bias = bias != NULL;
    operand(a, k.nd, k.adims, k.astr);
    operand(b, k.nd, k.bdims, k.bstr);
    for (int i = 0; i < k.nd; i++) k.cdims[i] = c->shape[i];
    dnnl_memory_desc_t amd, bmd, cmd, biasmd;
    if (!describe(&amd, dt, k.nd, k.adims, k.astr) || !describe(&bmd, dt, k.nd, k.bdims, k.bstr)) {
        *unsupported = true;
        return 0;
    }
    /* c is contiguous, but a size-1 dim may carry any stride (0 from a view): describe()
       gives it the row-major one */
    if (!describe(&cmd, dt, k.nd, k.cdims, c->strides)) {
        *unsupported = true;
        return 0;
    }
    if (bias) { /* [N] as [1, N]: broadcast over the rows */
        int64_t bdims[MT_MAX_DIMS], bstr[MT_MAX_DIMS];
        for (int i = 0; i < k.nd; i++) bdims[i] = bstr[i] = 1;
        bdims[k.nd - 1] = bias->shape[0];
        if (!describe(&biasmd, dt, k.nd, bdims, bstr)) {
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

int mt_cpu_gemm_dnnl(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha,
                     double beta, bool *unsupported) {
    return onednn_matmul("mt_matmul", c, a, b, NULL, alpha, beta, MT_ACT_NONE, unsupported);
}

int mt_cpu_gemm_dnnl_epilogue(const mt_gemm_epilogue_args *e, bool *unsupported) {
    return onednn_matmul("mt_linear", e->c, e->a, e->b, e->bias, 1.0, 0.0, e->act, unsupported);
}

bool mt_cpu_sgemm_dnnl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc) {
    return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
                      ldc) == dnnl_success;
}

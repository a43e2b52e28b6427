/* The GEMM with a bias and activation epilogue (mt_linear, mt_linear_act) on the CPU.
   - BF16 and F32 where oneDNN's matmul takes them (cpu_gemm_dnnl.c): the bias is the
     matmul's bias argument and the activation an eltwise post-op (one primitive, one
     rounding); an F32 GELU runs in the pass below instead, as does writing pre (the
     pre-activation GELU's backward wants). A BF16 GEMM that wants pre takes the FP32 panels.
   - F16/BF16 otherwise: the FP32-panel GEMM (cpu_gemm.c) applies bias and activation to each
     FP32 tile before rounding it, so the output is rounded once, as cuBLASLt's epilogue.
   - F32/F64 on OpenBLAS: the GEMM writes c, then one parallel pass over its rows adds the
     bias, writes pre and applies the activation while the row is in cache (instead of
     copying the bias into c before a beta = 1 GEMM and a separate activation pass).
   The activations are src/math's formulas (mt_relu_f, mt_gelu_f, mt_gelu_tanh_f and the _d
   forms for F64), the ones mt_relu / mt_gelu / mt_gelu_tanh run. */
#include <string.h>
#include "../math/scalar_ops.h"
#include "cpu.h"

/* Rows per part of the pass: enough work per thread to pay for the region. */
#define EPILOGUE_PARALLEL_MIN ((int64_t)1 << 15)

/* Compiled per x86-64 level: GELU's erfc is a chain of FMAs (one instruction each with
   AVX2, a libm call in baseline code). */
MT_CPU_CLONES void mt_cpu_act_f32(mt_activation act, float *v, int64_t n) {
    switch (act) { /* one loop per activation, so each vectorises */
    case MT_ACT_RELU:
        for (int64_t i = 0; i < n; i++) v[i] = mt_relu_f(v[i]);
        break;
    case MT_ACT_GELU:
        for (int64_t i = 0; i < n; i++) v[i] = mt_gelu_f(v[i]);
        break;
    case MT_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) v[i] = mt_gelu_tanh_f(v[i]);
        break;
    default:
        break;
    }
}

static void act_f64(mt_activation act, double *v, int64_t n) {
    switch (act) {
    case MT_ACT_RELU:
        for (int64_t i = 0; i < n; i++) v[i] = mt_relu_d(v[i]);
        break;
    case MT_ACT_GELU:
        for (int64_t i = 0; i < n; i++) v[i] = mt_gelu_d(v[i]);
        break;
    case MT_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) v[i] = mt_gelu_tanh_d(v[i]);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------ the pass over c */

typedef struct {
    const mt_gemm_epilogue_args *e;
    int64_t n; /* row length */
} pass_ctx;

/* Rows [r0, r1) of an F16/BF16 c through FP32 chunks: where no panel GEMM ran (the K == 0
   case, c all zeros), and the ReLU after a BF16 oneDNN GEMM. */
static void pass_rows_low(const mt_gemm_epilogue_args *e, int64_t n, int64_t r0, int64_t r1) {
    mt_dtype dt = e->c->dtype;
    int64_t es = (int64_t)mt_dtype_size(dt);
    float v[256], b[256];
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256, at = (r * n + i) * es;
            mt_cpu_load_f32((const char *)mt_tensor_data(e->c) + at, es, dt, m, v);
            if (e->bias) {
                mt_cpu_load_f32((const char *)mt_tensor_data(e->bias) + i * es, es, dt, m, b);
                for (int64_t k = 0; k < m; k++) v[k] += b[k];
            }
            if (e->pre) mt_cpu_store_f32((char *)mt_tensor_data(e->pre) + at, es, dt, m, v);
            mt_cpu_act_f32(e->act, v, m);
            mt_cpu_store_f32((char *)mt_tensor_data(e->c) + at, es, dt, m, v);
        }
}

/* Rows [r0, r1) of c: c = act(c + bias), pre = c + bias. */
static int pass_rows(void *vctx, int64_t r0, int64_t r1, int part) {
    (void)part;
    const pass_ctx *p = vctx;
    const mt_gemm_epilogue_args *e = p->e;
    int64_t n = p->n;
    if (e->c->dtype == MT_F16 || e->c->dtype == MT_BF16) {
        pass_rows_low(e, n, r0, r1);
        return 0;
    }
    if (e->c->dtype == MT_F32) {
        const float *b = e->bias ? mt_tensor_data(e->bias) : NULL;
        for (int64_t r = r0; r < r1; r++) {
            float *row = (float *)mt_tensor_data(e->c) + r * n;
            if (b)
                for (int64_t i = 0; i < n; i++) row[i] += b[i];
            if (e->pre) memcpy((float *)mt_tensor_data(e->pre) + r * n, row, (size_t)n * 4);
            mt_cpu_act_f32(e->act, row, n);
        }
        return 0;
    }
    const double *b = e->bias ? mt_tensor_data(e->bias) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        double *row = (double *)mt_tensor_data(e->c) + r * n;
        if (b)
            for (int64_t i = 0; i < n; i++) row[i] += b[i];
        if (e->pre) memcpy((double *)mt_tensor_data(e->pre) + r * n, row, (size_t)n * 8);
        act_f64(e->act, row, n);
    }
    return 0;
}

/* The epilogue over a c that holds a @ b. */
static int epilogue_pass(const mt_gemm_epilogue_args *e) {
    if (!e->bias && !e->pre && e->act == MT_ACT_NONE) return 0;
    int64_t rows = e->c->shape[0], n = e->c->shape[1];
    pass_ctx p = {e, n};
    int cost = e->act == MT_ACT_GELU || e->act == MT_ACT_GELU_TANH ? 8 : 1;
    int64_t work = rows * n * cost;
    return mt_cpu_for_parts(pass_rows, &p, rows, work >= EPILOGUE_PARALLEL_MIN ? work : 0);
}

/* ------------------------------------------------------------------ entry */

int mt_cpu_gemm_epilogue(const mt_gemm_epilogue_args *e) {
    mt_tensor *c = e->c;
    mt_dtype dt = c->dtype;
    if (c->ndim != 2 || !mt_is_contiguous(c) || (e->pre && !mt_is_contiguous(e->pre)) ||
        (e->bias && (!mt_is_contiguous(e->bias) || e->bias->dtype != dt)))
        return mt_error_set(MT_ERR_INTERNAL, "mt_cpu_gemm_epilogue: bad operands");
    if ((!e->pre || dt == MT_F32) &&
        mt_cpu_gemm_dnnl_wanted(dt, c->shape[0], c->shape[1], e->a->shape[1])) {
        /* Only the bias goes into the primitive in F32, and the activation runs in the pass
           (src/math's formulas), which also writes pre (F32 only: a rounded BF16 c would be
           rounded twice through pre): F32 output is not rounded after the activation, so
           oneDNN's GELU (another polynomial) would show, and oneDNN's ReLU maps NaN to 0 (a
           max with 0) where mt_relu and torch keep NaN. So ReLU runs in the pass for BF16
           too (exact after the rounding); GELU on a BF16 output stays in the primitive,
           whose rounding hides its polynomial. */
        bool act_in_pass = (dt == MT_F32 && (e->pre || e->act != MT_ACT_NONE)) ||
                           e->act == MT_ACT_RELU;
        mt_gemm_epilogue_args in_dnnl = *e, in_pass = *e;
        in_dnnl.pre = NULL;
        if (act_in_pass) in_dnnl.act = MT_ACT_NONE;
        in_pass.bias = NULL;
        bool unsupported;
        int rc = mt_cpu_gemm_dnnl_epilogue(&in_dnnl, &unsupported);
        if (rc) return rc;
        if (!unsupported) return act_in_pass ? epilogue_pass(&in_pass) : 0;
    }
    /* the panels read an FP32 bias: F32's own data, a converted copy for F16/BF16 */
    int64_t n = c->shape[1];
    float *b32 = NULL;
    bool copied = false;
    if (e->bias && dt == MT_F32) {
        b32 = mt_tensor_data(e->bias);
    } else if (e->bias && dt != MT_F64) {
        b32 = mt_host_alloc((size_t)n * sizeof(float));
        if (!b32)
            return mt_error_set(MT_ERR_OOM, "mt_linear: out of memory for an FP32 bias of %lld",
                                (long long)n);
        mt_cpu_load_f32(mt_tensor_data(e->bias), (int64_t)mt_dtype_size(dt), dt, n, b32);
        copied = true;
    }
    mt_cpu_epilogue ep = {b32, e->pre ? mt_tensor_data(e->pre) : NULL, e->act};
    bool done = false;
    int rc = mt_cpu_gemm_fused(c, e->a, e->b, dt == MT_F64 ? NULL : &ep, &done);
    if (copied) mt_host_free(b32, (size_t)n * sizeof(float));
    if (rc || done || c->numel == 0) return rc;
    return epilogue_pass(e);
}

/* CUDA GEMM on cuBLAS. Tensors are row-major and cuBLAS is column-major, so c = a @ b is
   asked as c^T = b^T a^T: a row-major matrix is its transpose read column-major, so the
   operands are swapped and each one's op and leading dim come from its strides (as
   mt_gemm_layout in cpu_gemm.c). Batch dims that advance each operand by one stride (0 for a
   broadcast operand) become one cublasGemmStridedBatchedEx; the remaining outer batch dims
   are a host loop of such calls. An operand whose matrix strides cuBLAS cannot express is
   first copied to a contiguous device temporary. F16/BF16 run on tensor cores with FP32
   accumulation (alpha/beta as float), F32 in FP32 (TF32 only when allowed), F64 in FP64.
   A plain product (alpha 1, beta 0, one matrix once the batch folds) in those tensor-core
   types or FP32 takes a cached cuBLASLt plan instead (lt_plain_eligible), as the linear's
   epilogue GEMMs do. Everything is queued on the device's stream: nothing here waits for the
   device. */
#include <limits.h>
#include <string.h>
#include "../tensor/gemm_geom.h"
#include "cuda_impl.h"

/* The op users see in messages (the CPU backend reports as mt_matmul too). */
#define GEMM_OP "mt_matmul"

/* The innermost batch dims [*split, nb) in which both operands advance by one stride per
   entry (*sa, *sb; 0 when broadcast): they are one strided-batched call of *inner entries.
   Negative strides stop the run (cuBLAS batch strides are read as offsets forward). */
static void batch_split(const mt_gemm_geom *g, int *split, int64_t *sa, int64_t *sb,
                        int64_t *inner) {
    int64_t ea = 0, eb = 0, n = 1;
    bool first = true;
    int d = g->nb - 1;
    *sa = *sb = 0;
    for (; d >= 0; d--) {
        if (g->shape[d] == 1) continue;
        if (first) {
            if (g->astr[d] < 0 || g->bstr[d] < 0) break;
            *sa = g->astr[d];
            *sb = g->bstr[d];
            first = false;
        } else if (g->astr[d] != ea || g->bstr[d] != eb) {
            break;
        }
        n *= g->shape[d];
        ea = *sa * n;
        eb = *sb * n;
    }
    *split = d + 1;
    *inner = n;
}

/* ------------------------------------------------------------------ cuBLAS calls */

typedef struct {
    cublasHandle_t h;
    cudaDataType type;
    cublasComputeType_t compute;
    const void *alpha, *beta; /* host scalars typed by the compute type */
    cublasOperation_t opa, opb;
    int lda, ldb;
} call_plan;

/* inner entries of c = a @ b (row-major) from the given first matrices, as column-major
   c^T = b^T a^T: cuBLAS's A is our b, its B our a, m = N, n = M. */
static int gemm_enqueue(const call_plan *p, const mt_gemm_geom *g, const char *a, int64_t sa,
                        const char *b, int64_t sb, char *c, int64_t inner) {
    int m = (int)g->N, n = (int)g->M, k = (int)g->K;
    int64_t es = (int64_t)mt_dtype_size(g->dt), sc = g->M * g->N;
    for (int64_t done = 0; done < inner;) {
        int chunk = (int)mt_gemm_imin(inner - done, INT_MAX);
        cublasStatus_t s;
        if (chunk == 1)
            s = mt_cublas()->gemm_ex(p->h, p->opb, p->opa, m, n, k, p->alpha, b, p->type, p->ldb, a,
                                     p->type, p->lda, p->beta, c, p->type, m, p->compute,
                                     CUBLAS_GEMM_DEFAULT);
        else
            s = mt_cublas()->gemm_strided_batched_ex(
                p->h, p->opb, p->opa, m, n, k, p->alpha, b, p->type, p->ldb, sb, a, p->type, p->lda,
                sa, p->beta, c, p->type, m, sc, chunk, p->compute, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) return mt_cublas_check(GEMM_OP, s);
        a += sa * chunk * es;
        b += sb * chunk * es;
        c += sc * chunk * es;
        done += chunk;
    }
    return 0;
}

static cudaDataType blas_type(mt_dtype dt) {
    switch (dt) {
    case MT_F16:
        return CUDA_R_16F;
    case MT_BF16:
        return CUDA_R_16BF;
    case MT_F64:
        return CUDA_R_64F;
    default:
        return CUDA_R_32F;
    }
}

/* Every batch entry: the outer batch dims (those before the split) are a host loop of
   strided-batched calls over the inner ones. */
static int gemm_run(mt_cuda_device_ctx *ctx, const mt_gemm_geom *g, double alpha, double beta) {
    int64_t lda = 0, ldb = 0;
    int al = mt_gemm_layout(g->M, g->K, g->a.rs, g->a.cs, &lda);
    int bl = mt_gemm_layout(g->K, g->N, g->b.rs, g->b.cs, &ldb);
    if (al < 0 || bl < 0) /* operand_prepare made both readable */
        return mt_error_set(MT_ERR_INTERNAL, "mt_cuda_gemm: operand layout left unreadable");
    float alpha32 = (float)alpha, beta32 = (float)beta;
    bool f64 = g->dt == MT_F64;
    call_plan p = {
        .h = ctx->blas,
        .type = blas_type(g->dt),
        /* F32 in full FP32 unless TF32 was allowed; F16/BF16 accumulate in FP32 */
        .compute = f64                                       ? CUBLAS_COMPUTE_64F
                   : g->dt == MT_F32 && mt_cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                             : CUBLAS_COMPUTE_32F,
        .alpha = f64 ? (const void *)&alpha : (const void *)&alpha32,
        .beta = f64 ? (const void *)&beta : (const void *)&beta32,
        /* a row-major (kind 0) matrix read column-major is its transpose: no op */
        .opa = al ? CUBLAS_OP_T : CUBLAS_OP_N,
        .opb = bl ? CUBLAS_OP_T : CUBLAS_OP_N,
        .lda = (int)lda,
        .ldb = (int)ldb,
    };
    int split;
    int64_t sa, sb, inner, es = (int64_t)mt_dtype_size(g->dt);
    batch_split(g, &split, &sa, &sb, &inner);
    int64_t outer = g->count / inner;
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, ao = 0, bo = 0;
        for (int d = split - 1; d >= 0; d--) {
            int64_t idx = rem % g->shape[d];
            rem /= g->shape[d];
            ao += idx * g->astr[d];
            bo += idx * g->bstr[d];
        }
        int rc = gemm_enqueue(&p, g, g->a.p + ao * es, sa, g->b.p + bo * es, sb,
                              g->c + o * inner * g->M * g->N * es, inner);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ helpers */

/* c *= beta (K == 0: no product to add). beta == 0 writes zeros, so NaN in c is not kept. */
static int scale_c(mt_cuda_device_ctx *ctx, mt_tensor *c, double beta) {
    if (beta == 1.0) return 0;
    const mt_tensor *ops[2] = {c, c};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, beta == 0.0 ? 1 : 2, ops);
    int st = beta == 0.0 ? mt_cuda_fill(&ctx->kctx, &it, 0.0)
                         : mt_cuda_unary(&ctx->kctx, MT_OP_MUL_SCALAR, &it, beta);
    return mt_cuda_check(GEMM_OP, (cudaError_t)st);
}

/* dst = src (any layout and dtypes) with the copy kernel, on the context's stream. */
static int copy_kernel(mt_cuda_device_ctx *ctx, const char *op, mt_tensor *dst,
                       const mt_tensor *src) {
    const mt_tensor *ops[2] = {dst, src};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 2, ops);
    return mt_cuda_check(op, (cudaError_t)mt_cuda_copy(&ctx->kctx, &it));
}

/* A contiguous device copy of operand t into *out, queued on the stream. Broadcast batch
   dims (stride 0) stay size 1 in the copy, so a broadcast is never materialised. */
static int dense_copy(mt_cuda_device_ctx *ctx, const mt_tensor *t, mt_tensor **out) {
    int64_t shape[MT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        shape[d] = d < t->ndim - 2 && t->strides[d] == 0 ? 1 : t->shape[d];
    mt_tensor src;
    mt_tensor_header_init(&src, t->storage, t->dtype, t->ndim, shape, t->strides, t->offset);
    mt_tensor *d = mt_tensor_new(GEMM_OP, t->ndim, shape, t->dtype, t->device);
    if (!d) return MT_ERR_OOM;
    int rc = copy_kernel(ctx, GEMM_OP, d, &src);
    if (rc) {
        mt_tensor_unref(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* Points g's operand (a when is_a) at a dense copy of t when cuBLAS cannot read its matrix
   strides; *tmp receives the copy (released by the caller once the GEMM is queued: stream
   order keeps it alive for the queued work). */
static int operand_prepare(mt_cuda_device_ctx *ctx, mt_gemm_geom *g, const mt_tensor *t, bool is_a,
                           mt_tensor **tmp) {
    int64_t ld, rows = is_a ? g->M : g->K, cols = is_a ? g->K : g->N;
    mt_gemm_mat *m = is_a ? &g->a : &g->b;
    if (mt_gemm_layout(rows, cols, m->rs, m->cs, &ld) >= 0) return 0;
    int rc = dense_copy(ctx, t, tmp);
    if (rc) return rc;
    mt_gemm_align_batch(*tmp, g, is_a ? g->astr : g->bstr); /* t's shape or 1: cannot fail */
    *m = (mt_gemm_mat){mt_tensor_data(*tmp), cols, 1};
    return 0;
}

/* ------------------------------------------------------------------ cuBLASLt plans */

/* The most workspace an algorithm may ask for: NVIDIA's recommendation for Hopper (4 MiB
   before it), taken from the caching allocator per call, only as much as the chosen
   algorithm needs. */
#define LT_MAX_WORKSPACE ((uint64_t)32 << 20)
/* What a bias pointer needs for the fused epilogue: the preference describes only A, B, C
   and D, and kernels assume 16 bytes for the others ("misaligned address" faults seen with
   sliced biases; PyTorch falls back to the unfused path there too). */
#define LT_EPILOGUE_ALIGN 16u

/* The largest power of two, up to cuBLASLt's default assumption of 256, dividing p's
   address: what the heuristic may assume of the operand. Sliced or offset tensors have less. */
static uint32_t lt_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && a % (2u * al) == 0) al *= 2;
    return al;
}

/* d[M, N] (row-major, dense) = epilogue(a @ b) as column-major d^T = b^T a^T (cuBLASLt's A is
   our b, m = N, n = M, as gemm_run), bias per row of d^T. d and bias have the operands'
   dtype, or FP32 when d32. The descriptors and algorithm come from the device's plan cache
   (lt_plan_cache.c), keyed by all that decides them: the shapes, layouts, types, epilogue,
   the operands' alignments and the workspace limit; errors name op. A new key in a full cache
   evicts the least recently used plan only when `evict`. *no_algo: no plan with an algorithm
   (cuBLASLt found none, or the cache was full and !evict) and nothing was queued (the caller
   takes the cuBLAS path). */
static int lt_matmul(mt_cuda_device_ctx *ctx, const char *op, const mt_gemm_geom *g, char *d,
                     bool d32, const void *bias, cublasLtEpilogue_t ep, bool evict, bool *no_algo) {
    int64_t lda = 0, ldb = 0;
    int al = mt_gemm_layout(g->M, g->K, g->a.rs, g->a.cs, &lda);
    int bl = mt_gemm_layout(g->K, g->N, g->b.rs, g->b.cs, &ldb);
    cudaDataType t = blas_type(g->dt);
    int32_t opa = bl ? CUBLAS_OP_T : CUBLAS_OP_N, opb = al ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t M = (uint64_t)g->M, N = (uint64_t)g->N, K = (uint64_t)g->K;
    mt_lt_plan_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp */
    k.a_rows = opa ? K : N, k.a_cols = opa ? N : K, k.a_ld = ldb;
    k.b_rows = opb ? M : K, k.b_cols = opb ? K : M, k.b_ld = lda;
    k.d_rows = N, k.d_cols = M, k.d_ld = (int64_t)N;
    k.max_workspace = LT_MAX_WORKSPACE;
    k.type_ab = (int32_t)t, k.type_d = (int32_t)(d32 ? CUDA_R_32F : t);
    k.opa = opa, k.opb = opb;
    k.epilogue = (uint32_t)ep;
    /* cuBLASLt's A and B are our b and a; C is D */
    k.align[0] = lt_alignment(g->b.p), k.align[1] = lt_alignment(g->a.p);
    k.align[2] = k.align[3] = lt_alignment(d);
    k.has_bias = bias != NULL;
    return mt_lt_plan_run(op, ctx, &k, g->a.p, g->b.p, d, bias, evict, no_algo);
}

/* A plain GEMM (alpha 1, beta 0, one matrix product once batch dims are folded) in a
   tensor-core type, or FP32 without TF32, takes a cached cuBLASLt plan: cublasGemmEx sets up
   its descriptors and asks its heuristic on every call, host time on the critical path of
   small matmuls (8x8 F32 took 7.95 us per call on an H200 through cublasGemmEx, an add 4.83).
   They never evict: once the cache is full, a new shape takes cublasGemmEx (whose own
   heuristic cache holds thousands of shapes), so a program cycling through more shapes than
   the cache holds does not pay a heuristic query per call; the linears' plans do evict. */
static bool lt_plain_eligible(const mt_gemm_geom *g, double alpha, double beta) {
    return alpha == 1.0 && beta == 0.0 && g->count == 1 &&
           (g->dt == MT_F16 || g->dt == MT_BF16 || (g->dt == MT_F32 && !mt_cuda_allow_tf32()));
}

/* ------------------------------------------------------------------ entry */

int mt_cuda_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta) {
    mt_dtype dt = c->dtype;
    if (c->ndim < 2 || !mt_is_contiguous(c) || a->dtype != dt || b->dtype != dt ||
        !mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_INTERNAL, "mt_cuda_gemm: bad operands (%s, %s -> %s, %d-d)",
                            mt_dtype_name(a->dtype), mt_dtype_name(b->dtype), mt_dtype_name(dt),
                            c->ndim);
    mt_gemm_geom g;
    if (mt_gemm_geom_init(&g, c, a, b) < 0)
        return mt_error_set(MT_ERR_INTERNAL, "mt_cuda_gemm: operand shapes do not fit the output");
    int rc;
    if (g.count == 0 || g.M == 0 || g.N == 0) return 0;
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get(GEMM_OP, c->device.index);
    if (!ctx) return MT_ERR_DEVICE;
    if (g.K == 0) return scale_c(ctx, c, beta);
    if (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "mt_matmul: a %lld x %lld x %lld matmul exceeds the cuBLAS int range",
                            (long long)g.M, (long long)g.K, (long long)g.N);
    mt_tensor *ta = NULL, *tb = NULL;
    rc = operand_prepare(ctx, &g, a, true, &ta);
    if (!rc) rc = operand_prepare(ctx, &g, b, false, &tb);
    if (!rc) {
        int64_t frs, ld;
        if (mt_gemm_batch_folds(&g, &frs) && g.count * g.M <= INT_MAX &&
            mt_gemm_layout(g.count * g.M, g.K, frs, g.a.cs, &ld) >= 0) {
            g.M *= g.count; /* one GEMM for the whole batch */
            g.a.rs = frs;
            g.count = 1;
            g.nb = 0;
        }
        bool no_algo = true;
        if (lt_plain_eligible(&g, alpha, beta))
            rc = lt_matmul(ctx, GEMM_OP, &g, mt_tensor_data(c), false, NULL,
                           CUBLASLT_EPILOGUE_DEFAULT, false, &no_algo);
        if (!rc && no_algo) rc = gemm_run(ctx, &g, alpha, beta);
    }
    mt_tensor_unref(ta); /* stream order keeps them alive for the queued GEMMs */
    mt_tensor_unref(tb);
    return rc;
}

/* ------------------------------------------------------------------ the epilogue GEMM

   c = act(a @ b + bias) on cuBLASLt. Without an activation, or RELU without a
   pre-activation to keep, it is one cublasLtMatmul whose epilogue adds the bias (and clamps)
   the FP32 sums before the one rounding (the BIAS, RELU(_BIAS) epilogues). Every other
   activation is computed by mixtape's own kernel (the src/math formula both backends share):
   F32 takes the BIAS epilogue into c (or pre), then the activation kernel; F16/BF16 take the
   GEMM and bias into an FP32 scratch, then the activation in FP32 and each output rounded
   once (epilogue_via_f32). cuBLASLt's GELU epilogues (the tanh form, GELU_AUX for the
   pre-activation) are not used: on an H200 they measured up to 4 FP16 ulps from the formula,
   where mixtape promises one rounding of the FP32 result. F64, TF32-allowed F32 and K == 0
   take cuBLAS plus kernels instead (cuBLASLt's epilogues are for the tensor-core types). */
#define EPI_OP "mt_linear"

/* out = op(in) with an elementwise kernel (the activation after a GEMM that had none). */
static int act_kernel(mt_cuda_device_ctx *ctx, mt_activation act, mt_tensor *out,
                      const mt_tensor *in) {
    mt_op_id op = act == MT_ACT_RELU   ? MT_OP_RELU
                  : act == MT_ACT_GELU ? MT_OP_GELU
                                       : MT_OP_GELU_TANH;
    const mt_tensor *ops[2] = {out, in};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 2, ops);
    return mt_cuda_check(EPI_OP, (cudaError_t)mt_cuda_unary(&ctx->kctx, op, &it, 0.0));
}

/* The cuBLAS way: dst = a @ b + bias (the bias copied in first, then beta = 1). */
static int gemm_bias_blas(mt_cuda_device_ctx *ctx, mt_tensor *dst, const mt_tensor *a,
                          const mt_tensor *b, const mt_tensor *bias) {
    if (!bias) return mt_cuda_gemm(dst, a, b, 1.0, 0.0);
    mt_tensor bh;
    mt_tensor_header_init(&bh, bias->storage, bias->dtype, 2,
                          (int64_t[]){dst->shape[0], dst->shape[1]},
                          (int64_t[]){0, bias->strides[0]}, bias->offset);
    int rc = copy_kernel(ctx, EPI_OP, dst, &bh);
    return rc ? rc : mt_cuda_gemm(dst, a, b, 1.0, 1.0);
}

/* F16/BF16 with an activation not fused on cuBLASLt (GELU in either form; RELU with a
   pre-activation to keep): the GEMM and bias into an FP32 scratch, then pre and c each
   rounded once from it (as a fused epilogue would), the activation in FP32 between. */
static int epilogue_via_f32(mt_cuda_device_ctx *ctx, const mt_gemm_epilogue_args *e,
                            const mt_gemm_geom *g, bool *no_algo) {
    mt_tensor *z = mt_tensor_new(EPI_OP, 2, e->c->shape, MT_F32, e->c->device), *b32 = NULL;
    int rc = z ? 0 : MT_ERR_OOM;
    if (!rc && e->bias) { /* cuBLASLt's bias has D's type: FP32 here */
        b32 = mt_tensor_new(EPI_OP, 1, e->bias->shape, MT_F32, e->bias->device);
        rc = b32 ? copy_kernel(ctx, EPI_OP, b32, e->bias) : MT_ERR_OOM;
    }
    if (!rc)
        rc = lt_matmul(ctx, EPI_OP, g, mt_tensor_data(z), true, b32 ? mt_tensor_data(b32) : NULL,
                       b32 ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, true, no_algo);
    bool queued = !rc && !*no_algo; /* else: an error, or nothing ran and the caller falls back */
    if (queued && e->pre) rc = copy_kernel(ctx, EPI_OP, e->pre, z);
    if (queued && !rc) rc = act_kernel(ctx, e->act, z, z);
    if (queued && !rc) rc = copy_kernel(ctx, EPI_OP, e->c, z);
    mt_tensor_unref(z); /* stream order keeps them alive for the queued work */
    mt_tensor_unref(b32);
    return rc;
}

/* The epilogue on cuBLASLt; *no_algo: it had no algorithm and left c and pre unwritten. */
static int epilogue_lt(mt_cuda_device_ctx *ctx, const mt_gemm_epilogue_args *e, mt_gemm_geom *g,
                       bool *no_algo) {
    mt_tensor *ta = NULL, *tb = NULL;
    int rc = operand_prepare(ctx, g, e->a, true, &ta);
    if (!rc) rc = operand_prepare(ctx, g, e->b, false, &tb);
    const void *bias = e->bias ? mt_tensor_data(e->bias) : NULL;
    bool b = bias != NULL;
    char *c = mt_tensor_data(e->c), *pre = e->pre ? mt_tensor_data(e->pre) : NULL;
    if (rc) {
    } else if (e->act == MT_ACT_NONE) {
        rc = lt_matmul(ctx, EPI_OP, g, c, false, bias,
                       b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, true, no_algo);
    } else if (e->act == MT_ACT_RELU && !pre) {
        rc = lt_matmul(ctx, EPI_OP, g, c, false, bias,
                       b ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU, true, no_algo);
    } else if (g->dt == MT_F32) { /* the bias epilogue, then the activation kernel */
        rc = lt_matmul(ctx, EPI_OP, g, pre ? pre : c, false, bias,
                       b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, true, no_algo);
        if (!rc && !*no_algo) rc = act_kernel(ctx, e->act, e->c, pre ? e->pre : e->c);
    } else {
        rc = epilogue_via_f32(ctx, e, g, no_algo);
    }
    mt_tensor_unref(ta); /* stream order keeps them alive for the queued GEMM */
    mt_tensor_unref(tb);
    return rc;
}

int mt_cuda_gemm_epilogue(const mt_gemm_epilogue_args *e) {
    mt_tensor *c = e->c;
    mt_dtype dt = c->dtype;
    mt_gemm_geom g;
    if (c->ndim != 2 || !mt_is_contiguous(c) || e->a->dtype != dt || e->b->dtype != dt ||
        (e->pre && !mt_is_contiguous(e->pre)) ||
        (e->bias && (e->bias->dtype != dt || !mt_is_contiguous(e->bias))) ||
        mt_gemm_geom_init(&g, c, e->a, e->b) < 0)
        return mt_error_set(MT_ERR_INTERNAL, "mt_cuda_gemm_epilogue: bad operands");
    if (g.M == 0 || g.N == 0) return 0;
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get(EPI_OP, c->device.index);
    if (!ctx) return MT_ERR_DEVICE;
    /* a bias less aligned than the epilogue needs (a slice): cuBLAS and kernels */
    bool lt = dt != MT_F64 && !(dt == MT_F32 && mt_cuda_allow_tf32()) && g.K > 0 &&
              g.M <= INT_MAX && g.N <= INT_MAX && g.K <= INT_MAX &&
              (!e->bias || lt_alignment(mt_tensor_data(e->bias)) >= LT_EPILOGUE_ALIGN);
    bool no_algo = false;
    if (lt) {
        int rc = epilogue_lt(ctx, e, &g, &no_algo);
        if (rc || !no_algo) return rc;
    }
    mt_tensor *dst = e->pre ? e->pre : c;
    int rc = gemm_bias_blas(ctx, dst, e->a, e->b, e->bias);
    if (!rc && e->act != MT_ACT_NONE) rc = act_kernel(ctx, e->act, c, dst);
    return rc;
}

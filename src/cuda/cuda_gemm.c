/* CUDA GEMM on cuBLAS. Tensors are row-major and cuBLAS is column-major, so c = a @ b is
   asked as c^T = b^T a^T: a row-major matrix is its transpose read column-major, so the
   operands are swapped and each one's op and leading dim come from its strides (as
   mt_gemm_layout in cpu_gemm.c). Batch dims that advance each operand by one stride (0 for a
   broadcast operand) become one cublasGemmStridedBatchedEx; the remaining outer batch dims
   are a host loop of such calls. An operand whose matrix strides cuBLAS cannot express is
   first copied to a contiguous device temporary. F16/BF16 run on tensor cores with FP32
   accumulation (alpha/beta as float), F32 in FP32 (TF32 only when allowed), F64 in FP64.
   Everything is queued on the device's stream: nothing here waits for the device. */
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
    const mt_tensor *ops[2] = {d, &src};
    mt_cuda_iter it;
    mt_cuda_iter_init(&it, 2, ops);
    int rc = mt_cuda_check(GEMM_OP, (cudaError_t)mt_cuda_copy(&ctx->kctx, &it));
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
        rc = gemm_run(ctx, &g, alpha, beta);
    }
    mt_tensor_unref(ta); /* stream order keeps them alive for the queued GEMMs */
    mt_tensor_unref(tb);
    return rc;
}

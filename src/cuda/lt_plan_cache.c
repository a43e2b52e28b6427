/* The per-device cache of cuBLASLt plans for the fused linear and the plain 2-D matmul
   (cuda_gemm.c's lt_matmul).

   A plan is what the key decides: the matmul descriptor with its transposes, epilogue and
   bias type; the three matrix layouts; the preference (workspace limit, the four operand
   alignments, and the reduction schemes allowed: none in the output type, see plan_pick);
   and the heuristic's answer (algo + workspace size), or "no algorithm" (then no cuBLASLt
   object is kept: the caller falls back every time without asking again). Creating those
   and asking the heuristic costs microseconds of host time per call on a GPU, on the
   critical path of small GEMMs; a hit costs a look-up.

   Pointers are not in the key. The bias pointer is a descriptor attribute, so it is set on
   the cached descriptor on every call (cheap); A, B and D are arguments of cublasLtMatmul,
   and their alignments (what the algorithm may assume) are in the key. The
   cache's lock is held from the look-up to the queued cublasLtMatmul, so two threads never
   set pointers on one descriptor at once (host work only; the device runs it later).

   Bounded: MT_LT_PLAN_CAP entries per device, the least recently used evicted (its objects
   destroyed). Freed with the device's context. */
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "cuda_impl.h"

/* Keys are compared with memcmp: every byte of one is a field (no padding). */
_Static_assert(sizeof(mt_lt_plan_key) == 10 * 8 + 5 * 4 + 4 * 4 + 4, "mt_lt_plan_key has padding");

typedef struct {
    mt_lt_plan_key key;
    cublasLtMatmulDesc_t desc; /* all NULL when !found */
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t r;
    bool found;
    uint64_t last_use; /* the cache's tick at the last hit: the smallest is evicted */
} lt_plan;

struct mt_lt_plan_cache {
    mtx_t lock;
    lt_plan plans[MT_LT_PLAN_CAP]; /* tens of distinct linears in a network: a linear scan */
    int n;
    uint64_t tick;
};

static void plan_objs_free(lt_plan *p) {
    const mt_cublas_api *api = mt_cublas();
    if (p->pref) api->lt_pref_destroy(p->pref);
    if (p->desc) api->lt_desc_destroy(p->desc);
    if (p->la) api->lt_layout_destroy(p->la);
    if (p->lb) api->lt_layout_destroy(p->lb);
    if (p->ld) api->lt_layout_destroy(p->ld);
    p->pref = NULL, p->desc = NULL, p->la = p->lb = p->ld = NULL;
}

mt_lt_plan_cache *mt_lt_plan_cache_new(void) {
    mt_lt_plan_cache *c = mt_heap_calloc(1, sizeof *c);
    if (c && mtx_init(&c->lock, mtx_plain) != thrd_success) {
        free(c);
        c = NULL;
    }
    return c;
}

void mt_lt_plan_cache_free(mt_lt_plan_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) plan_objs_free(&c->plans[i]);
    mtx_destroy(&c->lock);
    free(c);
}

int mt_lt_plan_cache_clear(mt_lt_plan_cache *c) {
    mtx_lock(&c->lock);
    int n = c->n;
    for (int i = 0; i < c->n; i++) plan_objs_free(&c->plans[i]);
    c->n = 0;
    mtx_unlock(&c->lock);
    return n;
}

int mt_lt_plan_cache_size(mt_lt_plan_cache *c) {
    mtx_lock(&c->lock);
    int n = c->n;
    mtx_unlock(&c->lock);
    return n;
}

static int desc_set(const char *op, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                    const void *v, size_t n) {
    return mt_cublas_check(op, mt_cublas()->lt_desc_set(d, attr, v, n));
}

/* The per-call attribute: the bias pointer. */
static int set_pointers(const char *op, const lt_plan *p, const void *bias) {
    return p->key.has_bias
               ? desc_set(op, p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)
               : 0;
}

static int layout(const char *op, cublasLtMatrixLayout_t *l, int32_t type, uint64_t rows,
                  uint64_t cols, int64_t ld) {
    return mt_cublas_check(op,
                           mt_cublas()->lt_layout_create(l, (cudaDataType)type, rows, cols, ld));
}

/* The descriptor and layouts of k (the pointers of this call set too: the heuristic sees
   the descriptor as the matmul will). Compute and scale types are always FP32 (the
   epilogue's tensor-core types), so they are not in the key. */
static int plan_describe(const char *op, lt_plan *p, const void *bias) {
    const mt_lt_plan_key *k = &p->key;
    int rc =
        mt_cublas_check(op, mt_cublas()->lt_desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (!rc) rc = layout(op, &p->la, k->type_ab, k->a_rows, k->a_cols, k->a_ld);
    if (!rc) rc = layout(op, &p->lb, k->type_ab, k->b_rows, k->b_cols, k->b_ld);
    if (!rc) rc = layout(op, &p->ld, k->type_d, k->d_rows, k->d_cols, k->d_ld);
    int32_t ty = k->type_d;
    if (!rc) rc = desc_set(op, p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &k->opa, sizeof k->opa);
    if (!rc) rc = desc_set(op, p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &k->opb, sizeof k->opb);
    if (!rc)
        rc = desc_set(op, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &k->epilogue, sizeof k->epilogue);
    if (!rc) rc = set_pointers(op, p, bias);
    if (!rc && k->has_bias)
        rc = desc_set(op, p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty, sizeof ty);
    return rc;
}

/* An algorithm that assumes no more alignment than the key's and needs at most its workspace
   limit (cublasLtMatmul with algo NULL would assume 256 bytes for every matrix), and that
   reduces split-K partial sums in the compute type (FP32) or not at all: the default allows
   the INPLACE and OUTPUT_TYPE schemes, which add FP16/BF16 partials in FP16/BF16 (mixtape
   accumulates in FP32 and rounds the output once; PyTorch sets the same mask unless
   allow_fp16_reduced_precision_reduction). found false: cuBLASLt has none (its NOT_SUPPORTED
   is not an error: the caller falls back). */
static int plan_pick(const char *op, mt_cuda_device_ctx *ctx, lt_plan *p) {
    const mt_cublas_api *api = mt_cublas();
    static const cublasLtMatmulPreferenceAttributes_t attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    int rc = mt_cublas_check(op, api->lt_pref_create(&p->pref));
    if (!rc)
        rc = mt_cublas_check(op,
                             api->lt_pref_set(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &p->key.max_workspace, sizeof p->key.max_workspace));
    for (int i = 0; i < 4 && !rc; i++)
        rc = mt_cublas_check(
            op, api->lt_pref_set(p->pref, attr[i], &p->key.align[i], sizeof p->key.align[i]));
    uint32_t reduction =
        (uint32_t)(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_NONE);
    if (!rc)
        rc = mt_cublas_check(op,
                             api->lt_pref_set(p->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &reduction, sizeof reduction));
    if (rc) return rc;
    int n = 0;
    memset(&p->r, 0, sizeof p->r);
    cublasStatus_t s =
        api->lt_heuristic(ctx->blas_lt, p->desc, p->la, p->lb, p->ld, p->ld, p->pref, 1, &p->r, &n);
    p->found = s == CUBLAS_STATUS_SUCCESS && n > 0 && p->r.state == CUBLAS_STATUS_SUCCESS;
    return s == CUBLAS_STATUS_NOT_SUPPORTED ? 0 : mt_cublas_check(op, s);
}

/* A new plan for key in *p; on failure nothing is left created. A plan without an algorithm
   keeps no object (it is never run). */
static int plan_create(const char *op, mt_cuda_device_ctx *ctx, lt_plan *p,
                       const mt_lt_plan_key *key, const void *bias) {
    memset(p, 0, sizeof *p);
    p->key = *key;
    int rc = plan_describe(op, p, bias);
    if (!rc) rc = plan_pick(op, ctx, p);
    if (rc || !p->found) plan_objs_free(p);
    return rc;
}

/* The cached plan of key (pointers set for this call), or a new one stored in the least
   recently used slot; NULL with the error of a failed create (the cache unchanged), or, when
   the key is absent, the cache full and !evict, NULL with *rc 0 (nothing made). Under the
   cache's lock. */
static lt_plan *plan_get(const char *op, mt_cuda_device_ctx *ctx, mt_lt_plan_cache *c,
                         const mt_lt_plan_key *key, const void *bias, bool evict, int *rc) {
    c->tick++;
    for (int i = 0; i < c->n; i++) {
        lt_plan *p = &c->plans[i];
        if (memcmp(&p->key, key, sizeof *key) != 0) continue;
        p->last_use = c->tick;
        *rc = p->found ? set_pointers(op, p, bias) : 0;
        return *rc ? NULL : p;
    }
    if (c->n == MT_LT_PLAN_CAP && !evict) {
        *rc = 0;
        return NULL;
    }
    lt_plan fresh;
    *rc = plan_create(op, ctx, &fresh, key, bias);
    if (*rc) return NULL;
    int slot = c->n;
    if (c->n == MT_LT_PLAN_CAP) {
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->plans[i].last_use < c->plans[slot].last_use) slot = i;
        plan_objs_free(&c->plans[slot]);
    } else {
        c->n++;
    }
    fresh.last_use = c->tick;
    c->plans[slot] = fresh;
    return &c->plans[slot];
}

int mt_lt_plan_run(const char *op, mt_cuda_device_ctx *ctx, const mt_lt_plan_key *key,
                   const void *a, const void *b, void *d, const void *bias, bool evict,
                   bool *no_algo) {
    const mt_cublas_api *api = mt_cublas();
    mt_lt_plan_cache *c = ctx->lt_plans;
    int rc = 0;
    mtx_lock(&c->lock);
    lt_plan *p = plan_get(op, ctx, c, key, bias, evict, &rc);
    *no_algo = !rc && (!p || !p->found);
    size_t wss = p && p->found ? p->r.workspaceSize : 0;
    void *ws = NULL;
    if (wss > 0 && !(ws = mt_cuda_alloc(ctx->device, wss)))
        rc = mt_error_set(
            MT_ERR_OOM, "%s: out of device memory for a cuBLASLt workspace of %zu bytes", op, wss);
    float one = 1.0f, zero = 0.0f;
    /* cuBLASLt's A is our b (column-major d^T = b^T a^T, see lt_matmul); beta 0: C (given as
       D) is not read */
    if (!rc && p && p->found)
        rc = mt_cublas_check(op,
                             api->lt_matmul(ctx->blas_lt, p->desc, &one, b, p->la, a, p->lb, &zero,
                                            d, p->ld, d, p->ld, &p->r.algo, ws, wss, ctx->stream));
    mtx_unlock(&c->lock);
    if (ws) mt_cuda_free(ctx->device, ws, wss); /* stream order keeps it for the queued call */
    return rc;
}

/* ---- test hooks (the emulated device's tests): by device index, the context made if need be */
int mt_cuda_lt_plans_clear(int device) {
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get("mt_linear", device);
    return ctx ? mt_lt_plan_cache_clear(ctx->lt_plans) : -1;
}

int mt_cuda_lt_plans_count(int device) {
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get("mt_linear", device);
    return ctx ? mt_lt_plan_cache_size(ctx->lt_plans) : -1;
}

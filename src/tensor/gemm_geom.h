/* The geometry of a batched, broadcasting, possibly transposed GEMM, shared by the backends'
   gemm families (src/cpu/cpu_gemm.c, src/cuda/cuda_gemm.c): which operand layouts a BLAS
   reads without a copy, batch strides aligned to the output, and the batch that folds into
   one GEMM. Device-neutral: it only looks at shapes and strides. */
#ifndef MT_TENSOR_GEMM_GEOM_H
#define MT_TENSOR_GEMM_GEOM_H
#include <limits.h>
#include <string.h>
#include "tensor_impl.h"

/* One matrix of an operand: first element and strides in elements. */
typedef struct {
    const char *p;
    int64_t rs, cs;
} mt_gemm_mat;

static inline int64_t mt_gemm_imax(int64_t a, int64_t b) {
    return a > b ? a : b;
}
static inline int64_t mt_gemm_imin(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* How BLAS reads a rows x cols matrix with strides (rs, cs): 0 row-major, 1 column-major
   (a transposed row-major matrix), -1 neither (needs a copy). *ld gets the leading dim. */
static inline int mt_gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld) {
    int64_t l;
    int kind;
    if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
        kind = 0;
        l = rows == 1 ? mt_gemm_imax(cols, 1) : rs;
    } else if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
        kind = 1;
        l = cols == 1 ? mt_gemm_imax(rows, 1) : cs;
    } else {
        return -1;
    }
    if (l > INT_MAX) return -1;
    *ld = l;
    return kind;
}

/* ------------------------------------------------------------------ batch geometry */

typedef struct {
    int nb;                     /* batch dims (of c) */
    int64_t shape[MT_MAX_DIMS]; /* c's batch shape */
    int64_t astr[MT_MAX_DIMS];  /* a's batch strides aligned to c (0: broadcast) */
    int64_t bstr[MT_MAX_DIMS];
    int64_t count; /* batch entries */
    int64_t M, N, K;
    mt_gemm_mat a, b; /* the first matrix of each operand */
    char *c;
    size_t es;
    mt_dtype dt;
} mt_gemm_geom;

/* Batch strides of operand t aligned to c's batch dims; -1 when a dim does not fit. */
static inline int mt_gemm_align_batch(const mt_tensor *t, const mt_gemm_geom *g, int64_t *str) {
    int tb = t->ndim - 2, off = g->nb - tb;
    if (tb < 0 || off < 0) return -1;
    for (int i = 0; i < g->nb; i++) {
        if (i < off) {
            str[i] = 0;
            continue;
        }
        int64_t s = t->shape[i - off];
        if (s != g->shape[i] && s != 1) return -1;
        str[i] = s == 1 ? 0 : t->strides[i - off];
    }
    return 0;
}

/* When b is the same matrix for every batch entry and a's batch dims and rows collapse into
   one row dim (a contiguous batch of row-major matrices), the batch is one GEMM with
   count * M rows: stores the row stride in *rs and returns true. */
static inline bool mt_gemm_batch_folds(const mt_gemm_geom *g, int64_t *rs) {
    if (g->count <= 1) return false;
    for (int i = 0; i < g->nb; i++)
        if (g->bstr[i] != 0 && g->shape[i] != 1) return false;
    /* chain of (size, stride) over the batch dims and M, size-1 dims skipped */
    int64_t inner_size = g->M, inner_stride = g->a.rs;
    bool have_inner = g->M != 1;
    for (int i = g->nb - 1; i >= 0; i--) {
        if (g->shape[i] == 1) continue;
        if (have_inner && g->astr[i] != inner_size * inner_stride) return false;
        if (!have_inner) inner_stride = g->astr[i];
        inner_size = have_inner ? inner_size * g->shape[i] : g->shape[i];
        have_inner = true;
    }
    *rs = inner_stride;
    return true;
}

/* The geometry of c = a @ b (c contiguous [..., M, N]; a, b of the same dtype, possibly
   transposed and batch-broadcast): -1 when the operands do not fit c. */
static inline int mt_gemm_geom_init(mt_gemm_geom *g, const mt_tensor *c, const mt_tensor *a,
                                    const mt_tensor *b) {
    memset(g, 0, sizeof *g);
    g->dt = c->dtype;
    g->es = mt_dtype_size(c->dtype);
    g->nb = c->ndim - 2;
    g->M = c->shape[c->ndim - 2];
    g->N = c->shape[c->ndim - 1];
    g->K = a->shape[a->ndim - 1];
    g->count = 1;
    for (int i = 0; i < g->nb; i++) {
        g->shape[i] = c->shape[i];
        g->count *= c->shape[i];
    }
    if (a->ndim < 2 || b->ndim < 2 || mt_gemm_align_batch(a, g, g->astr) < 0 ||
        mt_gemm_align_batch(b, g, g->bstr) < 0 || a->shape[a->ndim - 2] != g->M ||
        b->shape[b->ndim - 2] != g->K || b->shape[b->ndim - 1] != g->N)
        return -1;
    g->a = (mt_gemm_mat){mt_tensor_data(a), a->strides[a->ndim - 2], a->strides[a->ndim - 1]};
    g->b = (mt_gemm_mat){mt_tensor_data(b), b->strides[b->ndim - 2], b->strides[b->ndim - 1]};
    g->c = mt_tensor_data(c);
    return 0;
}
#endif

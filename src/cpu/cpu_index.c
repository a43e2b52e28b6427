/* Indexing kernels on the CPU: index_select and its index_add adjoint, gather and its
   scatter_add adjoint, argmax. Every tensor is contiguous and every index range-checked by
   the op. The adjoints accumulate into an F32/F64 destination in a fixed order (index order
   within each column range), so their results do not depend on the thread count. */
#include <math.h>
#include <string.h>
#include "cpu.h"

#define COLS 256 /* columns per index_add task */

typedef struct {
    const char *src;
    char *dst;
    const int64_t *index;
    int64_t outer, n, k, inner, es;
    mt_dtype sdt, ddt;
} index_ctx;

static int select_rows(void *vctx, int64_t b, int64_t e, int part) {
    (void)part;
    const index_ctx *c = vctx;
    size_t row = (size_t)(c->inner * c->es);
    for (int64_t r = b; r < e; r++) {
        int64_t o = r / c->k, j = r % c->k;
        memcpy(c->dst + r * (int64_t)row, c->src + (o * c->n + c->index[j]) * (int64_t)row, row);
    }
    return 0;
}

int mt_cpu_index_select(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                        mt_op_id op) {
    (void)op; /* the op checked the indices on the host */
    index_ctx c = {.src = mt_tensor_data(x),
                   .dst = mt_tensor_data(out),
                   .index = mt_tensor_data(index),
                   .k = index->numel,
                   .es = (int64_t)mt_dtype_size(x->dtype)};
    mt_split_at_dim(x, dim, &c.outer, &c.n, &c.inner);
    return mt_cpu_for_parts(select_rows, &c, c.outer * c.k, out->numel);
}

/* tasks: (o, column block); each adds its columns of every index row, in index order */
static int add_blocks(void *vctx, int64_t b, int64_t e, int part) {
    (void)part;
    const index_ctx *c = vctx;
    int64_t nblk = (c->inner + COLS - 1) / COLS, ses = (int64_t)mt_dtype_size(c->sdt);
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / nblk, i0 = (t % nblk) * COLS;
        int64_t m = c->inner - i0 < COLS ? c->inner - i0 : COLS;
        for (int64_t j = 0; j < c->k; j++) {
            const char *s = c->src + ((o * c->k + j) * c->inner + i0) * ses;
            int64_t d = (o * c->n + c->index[j]) * c->inner + i0;
            if (c->ddt == MT_F64) {
                double v[COLS], *dp = (double *)c->dst + d;
                mt_cpu_load_f64(s, ses, c->sdt, m, v);
                for (int64_t i = 0; i < m; i++) dp[i] += v[i];
            } else { /* an F32 source read in place; others converted through v */
                float v[COLS], *dp = (float *)c->dst + d;
                const float *sv = (const float *)s;
                if (c->sdt != MT_F32) {
                    mt_cpu_load_f32(s, ses, c->sdt, m, v);
                    sv = v;
                }
                for (int64_t i = 0; i < m; i++) dp[i] += sv[i];
            }
        }
    }
    return 0;
}

int mt_cpu_index_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    index_ctx c = {.src = mt_tensor_data(src),
                   .dst = mt_tensor_data(dst),
                   .index = mt_tensor_data(index),
                   .k = index->numel,
                   .sdt = src->dtype,
                   .ddt = dst->dtype};
    mt_split_at_dim(dst, dim, &c.outer, &c.n, &c.inner);
    int64_t tasks = c.outer * ((c.inner + COLS - 1) / COLS);
    return mt_cpu_for_parts(add_blocks, &c, tasks, src->numel * 2);
}

/* Walks every position of index (row-major) with the offset of the element of x (or dst)
   it names: fn(ctx, flat position, offset in elements). */
typedef void (*gather_fn)(void *ctx, int64_t p, int64_t off);

static void walk(const mt_tensor *index, const mt_tensor *x, int dim, gather_fn fn, void *ctx) {
    int nd = index->ndim;
    int64_t coord[MT_MAX_DIMS] = {0}, xs[MT_MAX_DIMS];
    mt_contiguous_strides(x->ndim, x->shape, xs);
    const int64_t *idx = mt_tensor_data(index);
    int64_t base = 0; /* offset of the current position with coordinate dim at 0 */
    for (int64_t p = 0; p < index->numel; p++) {
        fn(ctx, p, base + idx[p] * (nd ? xs[dim] : 0));
        for (int d = nd - 1; d >= 0; d--) { /* next coordinate, carrying */
            if (++coord[d] < index->shape[d]) {
                if (d != dim) base += xs[d];
                break;
            }
            if (d != dim) base -= (coord[d] - 1) * xs[d];
            coord[d] = 0;
        }
    }
}

typedef struct {
    const char *src;
    char *dst;
    size_t es;
    mt_dtype sdt;
} walk_ctx;

static void gather_one(void *vctx, int64_t p, int64_t off) {
    walk_ctx *c = vctx;
    memcpy(c->dst + p * (int64_t)c->es, c->src + off * (int64_t)c->es, c->es);
}

int mt_cpu_gather(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index) {
    walk_ctx c = {mt_tensor_data(x), mt_tensor_data(out), mt_dtype_size(x->dtype), x->dtype};
    walk(index, x, dim, gather_one, &c);
    return 0;
}

static void scatter_one(void *vctx, int64_t p, int64_t off) {
    walk_ctx *c = vctx;
    double v;
    mt_cpu_load_f64(c->src + p * (int64_t)mt_dtype_size(c->sdt), 0, c->sdt, 1, &v);
    if (c->es == 8)
        ((double *)c->dst)[off] += v;
    else
        ((float *)c->dst)[off] += (float)v;
}

int mt_cpu_scatter_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    walk_ctx c = {mt_tensor_data(src), mt_tensor_data(dst), mt_dtype_size(dst->dtype), src->dtype};
    walk(index, dst, dim, scatter_one, &c); /* sequential: a fixed order of additions */
    return 0;
}

/* per o: the running best value and its index for every inner position */
static int argmax_outer(void *vctx, int64_t b, int64_t e, int part) {
    (void)part;
    const index_ctx *c = vctx;
    size_t bytes = (size_t)c->inner * 2 * sizeof(double);
    double *best = mt_host_alloc(bytes ? bytes : 1);
    if (!best) return 1;
    double *row = best + c->inner;
    int64_t *out = (int64_t *)c->dst;
    for (int64_t o = b; o < e; o++) {
        int64_t *oi = out + o * c->inner;
        for (int64_t j = 0; j < c->n; j++) {
            const char *s = c->src + (o * c->n + j) * c->inner * c->es;
            mt_cpu_load_f64(s, c->es, c->sdt, c->inner, j ? row : best);
            for (int64_t i = 0; i < c->inner; i++) {
                if (j == 0) {
                    oi[i] = 0;
                    continue;
                }
                /* strictly larger wins (the first maximum stays); NaN beats numbers */
                if (!isnan(best[i]) && (row[i] > best[i] || isnan(row[i]))) {
                    best[i] = row[i];
                    oi[i] = j;
                }
            }
        }
    }
    mt_host_free(best, bytes ? bytes : 1);
    return 0;
}

/* I64 compared as integers: as doubles, values above 2^53 would tie. */
static int argmax_outer_i64(void *vctx, int64_t b, int64_t e, int part) {
    (void)part;
    const index_ctx *c = vctx;
    const int64_t *x = (const int64_t *)c->src;
    int64_t *out = (int64_t *)c->dst;
    for (int64_t o = b; o < e; o++)
        for (int64_t i = 0; i < c->inner; i++) {
            int64_t best_j = 0, best = x[o * c->n * c->inner + i];
            for (int64_t j = 1; j < c->n; j++) {
                int64_t v = x[(o * c->n + j) * c->inner + i];
                if (v > best) { /* strictly larger: the first maximum stays */
                    best = v;
                    best_j = j;
                }
            }
            out[o * c->inner + i] = best_j;
        }
    return 0;
}

int mt_cpu_argmax(mt_tensor *out, const mt_tensor *x, int dim) {
    index_ctx c = {.src = mt_tensor_data(x),
                   .dst = mt_tensor_data(out),
                   .es = (int64_t)mt_dtype_size(x->dtype),
                   .sdt = x->dtype};
    mt_split_at_dim(x, dim, &c.outer, &c.n, &c.inner);
    if (mt_cpu_for_parts(x->dtype == MT_I64 ? argmax_outer_i64 : argmax_outer, &c, c.outer,
                         x->numel))
        return mt_error_set(MT_ERR_OOM, "mt_argmax: out of memory for a row buffer");
    return 0;
}

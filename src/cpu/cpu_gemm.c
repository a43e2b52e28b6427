/* CPU GEMM. F32 and F64 go straight to OpenBLAS on the tensors' own memory (transposes come
   from the strides, batch broadcasting from stride 0). F16/BF16 (and F32 operands whose
   strides BLAS cannot express) run through FP32 panels: blocks of the operands are converted
   to FP32, multiplied by sgemm into an FP32 tile and the tile is rounded into c once. Panels
   are bounded in size, so the temporary memory of a low-precision GEMM stays small whatever
   the operand sizes (mixed precision must not cost more memory than FP32). */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "cpu.h"

/* OpenBLAS runs a GEMM with m*n*k at most this on one thread (SMP_THRESHOLD_MIN times
   GEMM_MULTITHREAD_THRESHOLD in interface/gemm.c); batches of such GEMMs are spread over our
   threads instead. */
#define BLAS_SINGLE_THREAD_MNK 262144.0
/* Below this many multiply-adds in the whole batch a parallel region costs more than it saves. */
#define BATCH_PARALLEL_MIN_FLOPS 131072.0
/* Elements of one FP32 panel (operand block or output tile): 512 KiB. */
#define PANEL_FLOATS ((int64_t)128 * 1024)
/* Longest K block: a panel then still holds at least 64 rows or columns. */
#define PANEL_K_MAX (PANEL_FLOATS / 64)

/* One matrix of an operand: first element and strides in elements. */
typedef struct {
    const char *p;
    int64_t rs, cs;
} mat;

static inline int64_t imax(int64_t a, int64_t b) {
    return a > b ? a : b;
}
static inline int64_t imin(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* How BLAS reads a rows x cols matrix with strides (rs, cs): 0 row-major, 1 column-major
   (a transposed row-major matrix), -1 neither (needs a copy). *ld gets the leading dim. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld) {
    int64_t l;
    int kind;
    if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
        kind = 0;
        l = rows == 1 ? imax(cols, 1) : rs;
    } else if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
        kind = 1;
        l = cols == 1 ? imax(rows, 1) : cs;
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
    mat a, b; /* the first matrix of each operand */
    char *c;
    size_t es;
} geom;

/* Batch strides of operand t aligned to c's batch dims; -1 when a dim does not fit. */
static int align_batch(const mt_tensor *t, const geom *g, int64_t *str) {
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

static void batch_offsets(const geom *g, int64_t bi, int64_t *ao, int64_t *bo) {
    int64_t oa = 0, ob = 0;
    for (int i = g->nb - 1; i >= 0; i--) {
        int64_t idx = bi % g->shape[i];
        bi /= g->shape[i];
        oa += idx * g->astr[i];
        ob += idx * g->bstr[i];
    }
    *ao = oa;
    *bo = ob;
}

/* When b is the same matrix for every batch entry and a's batch dims and rows collapse into
   one row dim (a contiguous batch of row-major matrices), the batch is one GEMM with
   count * M rows: stores the row stride in *rs and returns true. */
static bool batch_folds(const geom *g, int64_t *rs) {
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

/* ------------------------------------------------------------------ FP32 panels */

/* Converts the rows x cols block at src (strides rs, cs) to FP32 in dst, row-major (ld cols)
   or, when the source runs down its columns, column-major (ld rows). Returns true for
   column-major. */
static bool convert_block(const char *src, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                          mt_dtype dt, float *dst) {
    int64_t es = (int64_t)mt_dtype_size(dt);
    bool colmajor = cols == 1 || (rows > 1 && llabs(rs) < llabs(cs));
    int64_t lines = colmajor ? cols : rows, len = colmajor ? rows : cols;
    int64_t lstride = (colmajor ? cs : rs) * es, estride = (colmajor ? rs : cs) * es;
#pragma omp parallel for if (lines * len > MT_CPU_PARALLEL_MIN && lines > 1)                       \
    num_threads(mt_cpu_num_threads())
    for (int64_t l = 0; l < lines; l++)
        mt_cpu_load_f32(src + l * lstride, estride, dt, len, dst + l * len);
    return colmajor;
}

/* Per-thread scratch of the panel path: the FP32 blocks of a and b (with the block each one
   holds, so a block used again is not converted again) and the output tile. */
typedef struct {
    float *buf[3];
    size_t cap[3]; /* floats */
    struct {
        const char *p;
        int64_t rows, cols;
        bool colmajor;
    } held[2];
} panels;

static int panels_init(panels *w, int64_t amax, int64_t bmax, int64_t cmax) {
    memset(w, 0, sizeof *w);
    int64_t want[3] = {amax, bmax, cmax};
    for (int i = 0; i < 3; i++) {
        w->cap[i] = (size_t)imax(want[i], 1);
        w->buf[i] = mt_host_alloc(w->cap[i] * sizeof(float));
        if (!w->buf[i]) return MT_ERR_OOM;
    }
    return 0;
}

static void panels_free(panels *w) {
    for (int i = 0; i < 3; i++) mt_host_free(w->buf[i], w->cap[i] * sizeof(float));
    memset(w, 0, sizeof *w);
}

/* The FP32 copy of a block of operand `which` (0: a, 1: b): converts it unless held. */
static const float *panel_get(panels *w, int which, const char *p, int64_t rows, int64_t cols,
                              int64_t rs, int64_t cs, mt_dtype dt, bool *colmajor) {
    if (w->held[which].p != p || w->held[which].rows != rows || w->held[which].cols != cols) {
        w->held[which].colmajor = convert_block(p, rows, cols, rs, cs, dt, w->buf[which]);
        w->held[which].p = p;
        w->held[which].rows = rows;
        w->held[which].cols = cols;
    }
    *colmajor = w->held[which].colmajor;
    return w->buf[which];
}

typedef struct {
    int64_t mb, nb, kb;
    bool n_outer; /* loop order: which operand is converted once */
} tiling;

/* Splits n into the fewest blocks of at most cap, of even size (multiples of 16 when split). */
static int64_t block_size(int64_t n, int64_t cap) {
    if (n <= cap) return n;
    int64_t blocks = (n + cap - 1) / cap, b = (n + blocks - 1) / blocks;
    b = (b + 15) & ~(int64_t)15;
    return b <= cap ? b : cap;
}

static tiling plan_tiles(int64_t M, int64_t N, int64_t K) {
    tiling t;
    t.kb = block_size(K, PANEL_K_MAX);
    int64_t cap = imax(PANEL_FLOATS / imax(t.kb, 1), 1);
    int64_t mcap = cap, ncap = cap;
    if (imin(M, mcap) * imin(N, ncap) > PANEL_FLOATS) { /* the output tile is bounded too */
        int64_t side = (int64_t)sqrt((double)PANEL_FLOATS);
        if (M <= side)
            ncap = imin(ncap, PANEL_FLOATS / M);
        else if (N <= side)
            mcap = imin(mcap, PANEL_FLOATS / N);
        else
            mcap = ncap = imin(cap, side);
    }
    t.mb = block_size(M, mcap);
    t.nb = block_size(N, ncap);
    /* converted elements: m-outer converts a once (when K is one block) and b once per row
       block; n-outer the other way round */
    double mblocks = (double)((M + t.mb - 1) / t.mb), nblocks = (double)((N + t.nb - 1) / t.nb);
    double m_outer = (double)M * K * (t.kb == K ? 1.0 : nblocks) + (double)K * N * mblocks;
    double n_outer = (double)K * N * (t.kb == K ? 1.0 : mblocks) + (double)M * K * nblocks;
    t.n_outer = n_outer < m_outer;
    return t;
}

/* c (M x N, row stride ldc, dtype dt) = alpha * a @ b + beta * c through FP32 panels. */
static void panel_gemm(panels *w, const tiling *t, mt_dtype dt, int64_t M, int64_t N, int64_t K,
                       mat a, mat b, char *c, int64_t ldc, float alpha, float beta) {
    int64_t es = (int64_t)mt_dtype_size(dt);
    int64_t mblocks = (M + t->mb - 1) / t->mb, nblocks = (N + t->nb - 1) / t->nb;
    int64_t outer_n = t->n_outer ? nblocks : mblocks, inner_n = t->n_outer ? mblocks : nblocks;
    float *tile = w->buf[2];
    for (int64_t o = 0; o < outer_n; o++) {
        for (int64_t in = 0; in < inner_n; in++) {
            int64_t mi = t->n_outer ? in : o, ni = t->n_outer ? o : in;
            int64_t m0 = mi * t->mb, n0 = ni * t->nb;
            int64_t mc = imin(t->mb, M - m0), nc = imin(t->nb, N - n0);
            char *ct = c + (m0 * ldc + n0) * es;
            if (beta != 0.0f)
                for (int64_t r = 0; r < mc; r++)
                    mt_cpu_load_f32(ct + r * ldc * es, es, dt, nc, tile + r * nc);
            for (int64_t k0 = 0; k0 < K; k0 += t->kb) {
                int64_t kc = imin(t->kb, K - k0);
                bool acm, bcm;
                const float *ap = panel_get(w, 0, a.p + (m0 * a.rs + k0 * a.cs) * es, mc, kc, a.rs,
                                            a.cs, dt, &acm);
                const float *bp = panel_get(w, 1, b.p + (k0 * b.rs + n0 * b.cs) * es, kc, nc, b.rs,
                                            b.cs, dt, &bcm);
                cblas_sgemm(CblasRowMajor, acm ? CblasTrans : CblasNoTrans,
                            bcm ? CblasTrans : CblasNoTrans, (int)mc, (int)nc, (int)kc, alpha, ap,
                            (int)(acm ? mc : kc), bp, (int)(bcm ? kc : nc), k0 == 0 ? beta : 1.0f,
                            tile, (int)nc);
            }
            if (nc == ldc) {
                mt_cpu_store_f32(ct, es, dt, mc * nc, tile);
            } else {
                for (int64_t r = 0; r < mc; r++)
                    mt_cpu_store_f32(ct + r * ldc * es, es, dt, nc, tile + r * nc);
            }
        }
    }
}

/* ------------------------------------------------------------------ F32 / F64 on BLAS */

/* A contiguous copy of a strided matrix for F64 operands BLAS cannot read. */
static void copy_f64(const mat *m, int64_t rows, int64_t cols, double *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            dst[r * cols + k] = *(const double *)(m->p + (r * m->rs + k * m->cs) * 8);
}

static void blas_gemm(mt_dtype dt, int64_t M, int64_t N, int64_t K, mat a, int al, int64_t lda,
                      mat b, int bl, int64_t ldb, char *c, int64_t ldc, double alpha, double beta) {
    CBLAS_TRANSPOSE ta = al ? CblasTrans : CblasNoTrans, tb = bl ? CblasTrans : CblasNoTrans;
    if (dt == MT_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, (float)alpha, (const float *)a.p,
                    (int)lda, (const float *)b.p, (int)ldb, (float)beta, (float *)c, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, alpha, (const double *)a.p,
                    (int)lda, (const double *)b.p, (int)ldb, beta, (double *)c, (int)ldc);
}

/* ------------------------------------------------------------------ entry */

/* c *= beta over all of c (contiguous): the K == 0 case, where BLAS is not asked. */
static void scale_c(mt_tensor *c, double beta) {
    char *p = mt_tensor_data(c);
    size_t es = mt_dtype_size(c->dtype);
    if (beta == 0.0) {
        if (c->dtype == MT_F32 || c->dtype == MT_F64) {
            memset(p, 0, (size_t)c->numel * es);
            return;
        }
    }
    double buf[256];
    for (int64_t i = 0; i < c->numel; i += 256) {
        int64_t n = imin(256, c->numel - i);
        mt_cpu_load_f64(p + i * (int64_t)es, (int64_t)es, c->dtype, n, buf);
        for (int64_t j = 0; j < n; j++) buf[j] = beta == 0.0 ? 0.0 : buf[j] * beta;
        mt_cpu_store_f64(p + i * (int64_t)es, (int64_t)es, c->dtype, n, buf);
    }
}

static int gemm_f64(const geom *g, double alpha, double beta) {
    int64_t lda, ldb;
    int al = blas_layout(g->M, g->K, g->a.rs, g->a.cs, &lda);
    int bl = blas_layout(g->K, g->N, g->b.rs, g->b.cs, &ldb);
    double *ta = NULL, *tb = NULL;
    size_t na = (size_t)(g->M * g->K), nbb = (size_t)(g->K * g->N);
    if (al < 0 && !(ta = mt_host_alloc(na * 8))) goto oom;
    if (bl < 0 && !(tb = mt_host_alloc(nbb * 8))) goto oom;
    const char *held_a = NULL, *held_b = NULL;
    for (int64_t bi = 0; bi < g->count; bi++) {
        int64_t ao, bo;
        batch_offsets(g, bi, &ao, &bo);
        mat a = {g->a.p + ao * 8, g->a.rs, g->a.cs}, b = {g->b.p + bo * 8, g->b.rs, g->b.cs};
        int la = al, lb = bl;
        int64_t xa = lda, xb = ldb;
        if (al < 0) { /* copy once per distinct source matrix */
            if (held_a != a.p) copy_f64(&a, g->M, g->K, ta);
            held_a = a.p;
            a = (mat){(const char *)ta, g->K, 1};
            la = 0;
            xa = imax(g->K, 1);
        }
        if (bl < 0) {
            if (held_b != b.p) copy_f64(&b, g->K, g->N, tb);
            held_b = b.p;
            b = (mat){(const char *)tb, g->N, 1};
            lb = 0;
            xb = imax(g->N, 1);
        }
        blas_gemm(MT_F64, g->M, g->N, g->K, a, la, xa, b, lb, xb, g->c + bi * g->M * g->N * 8,
                  imax(g->N, 1), alpha, beta);
    }
    mt_host_free(ta, ta ? na * 8 : 0);
    mt_host_free(tb, tb ? nbb * 8 : 0);
    return 0;
oom:
    mt_host_free(ta, ta ? na * 8 : 0);
    return mt_error_set(MT_ERR_OOM, "mt_matmul: out of memory for a %lld x %lld f64 operand copy",
                        (long long)(al < 0 ? g->M : g->K), (long long)(al < 0 ? g->K : g->N));
}

/* F32 with both operands readable by BLAS: no copies at all. */
static void gemm_f32_direct(const geom *g, int al, int64_t lda, int bl, int64_t ldb, double alpha,
                            double beta) {
    double mnk = (double)g->M * (double)g->N * (double)g->K;
    bool par = g->count > 1 && mnk <= BLAS_SINGLE_THREAD_MNK &&
               mnk * (double)g->count >= BATCH_PARALLEL_MIN_FLOPS && mt_cpu_num_threads() > 1;
#pragma omp parallel for if (par) num_threads(mt_cpu_num_threads()) schedule(static)
    for (int64_t bi = 0; bi < g->count; bi++) {
        int64_t ao, bo;
        batch_offsets(g, bi, &ao, &bo);
        mat a = {g->a.p + ao * 4, 0, 0}, b = {g->b.p + bo * 4, 0, 0};
        blas_gemm(MT_F32, g->M, g->N, g->K, a, al, lda, b, bl, ldb, g->c + bi * g->M * g->N * 4,
                  imax(g->N, 1), alpha, beta);
    }
}

/* The panel path over the batch; small matrices are spread over threads, each with its own
   panels. */
static int gemm_panels(const geom *g, mt_dtype dt, double alpha, double beta) {
    tiling t = plan_tiles(g->M, g->N, g->K);
    int64_t es = (int64_t)g->es;
    double mnk = (double)g->M * (double)g->N * (double)g->K;
    bool par = g->count > 1 && mnk <= BLAS_SINGLE_THREAD_MNK &&
               mnk * (double)g->count >= BATCH_PARALLEL_MIN_FLOPS && mt_cpu_num_threads() > 1;
    int failed = 0;
#pragma omp parallel if (par) num_threads(mt_cpu_num_threads())
    {
        panels w;
        if (panels_init(&w, t.mb * t.kb, t.kb * t.nb, t.mb * t.nb) != 0) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t bi = 0; bi < g->count; bi++) {
                int64_t ao, bo;
                batch_offsets(g, bi, &ao, &bo);
                mat a = {g->a.p + ao * es, g->a.rs, g->a.cs};
                mat b = {g->b.p + bo * es, g->b.rs, g->b.cs};
                panel_gemm(&w, &t, dt, g->M, g->N, g->K, a, b, g->c + bi * g->M * g->N * es, g->N,
                           (float)alpha, (float)beta);
            }
        }
        panels_free(&w);
    }
    if (failed)
        return mt_error_set(MT_ERR_OOM,
                            "mt_matmul: out of memory for the f32 panels of a %lld x %lld x %lld "
                            "%s matmul",
                            (long long)g->M, (long long)g->K, (long long)g->N, mt_dtype_name(dt));
    return 0;
}

int mt_cpu_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta) {
    mt_dtype dt = c->dtype;
    if (c->ndim < 2 || !mt_is_contiguous(c) || a->dtype != dt || b->dtype != dt ||
        !mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_INTERNAL, "mt_cpu_gemm: bad operands (%s, %s -> %s, %d-d)",
                            mt_dtype_name(a->dtype), mt_dtype_name(b->dtype), mt_dtype_name(dt),
                            c->ndim);
    geom g;
    memset(&g, 0, sizeof g);
    g.nb = c->ndim - 2;
    g.M = c->shape[c->ndim - 2];
    g.N = c->shape[c->ndim - 1];
    g.K = a->shape[a->ndim - 1];
    g.es = mt_dtype_size(dt);
    g.count = 1;
    for (int i = 0; i < g.nb; i++) {
        g.shape[i] = c->shape[i];
        g.count *= c->shape[i];
    }
    if (align_batch(a, &g, g.astr) < 0 || align_batch(b, &g, g.bstr) < 0 ||
        a->shape[a->ndim - 2] != g.M || b->shape[b->ndim - 2] != g.K ||
        b->shape[b->ndim - 1] != g.N)
        return mt_error_set(MT_ERR_INTERNAL, "mt_cpu_gemm: operand shapes do not fit the output");
    if (g.count == 0 || g.M == 0 || g.N == 0) return 0;
    if (g.K == 0) {
        scale_c(c, beta);
        return 0;
    }
    if (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "mt_matmul: a %lld x %lld x %lld matmul exceeds the BLAS int range",
                            (long long)g.M, (long long)g.K, (long long)g.N);
    g.a = (mat){mt_tensor_data(a), a->strides[a->ndim - 2], a->strides[a->ndim - 1]};
    g.b = (mat){mt_tensor_data(b), b->strides[b->ndim - 2], b->strides[b->ndim - 1]};
    g.c = mt_tensor_data(c);

    int64_t frs;
    if (batch_folds(&g, &frs) && g.count * g.M <= INT_MAX) { /* one GEMM for the whole batch */
        g.M *= g.count;
        g.a.rs = frs;
        g.count = 1;
        g.nb = 0;
    }
    if (dt == MT_F64) return gemm_f64(&g, alpha, beta);
    if (dt == MT_F32) {
        int64_t lda, ldb;
        int al = blas_layout(g.M, g.K, g.a.rs, g.a.cs, &lda);
        int bl = blas_layout(g.K, g.N, g.b.rs, g.b.cs, &ldb);
        if (al >= 0 && bl >= 0) {
            gemm_f32_direct(&g, al, lda, bl, ldb, alpha, beta);
            return 0;
        }
    }
    return gemm_panels(&g, dt, alpha, beta);
}

/* CPU GEMM. F32 and F64 go straight to OpenBLAS on the tensors' own memory (transposes come
   from the strides, batch broadcasting from stride 0), except where oneDNN's matmul takes
   F32 or BF16 (cpu_gemm_dnnl.c). F16/BF16 (and F32 operands whose
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
#include "../tensor/gemm_geom.h"
#include "cpu.h"

/* OpenBLAS runs a GEMM with m*n*k at most this on one thread (SMP_THRESHOLD_MIN times
   GEMM_MULTITHREAD_THRESHOLD in interface/gemm.c); batches of such GEMMs are spread over our
   threads instead. */
#define BLAS_SINGLE_THREAD_MNK 262144.0
/* Below this many multiply-adds in the whole batch a parallel region costs more than it saves. */
#define BATCH_PARALLEL_MIN_FLOPS 131072.0

/* ------------------------------------------------------------------ FP32 conversion */

/* n elements at src (stride in bytes) to FP32; contiguous F16/BF16 runs take vector paths. */
static void load_run(const char *src, int64_t stride, mt_dtype dt, int64_t n, float *dst) {
    if (dt == MT_F16 && stride == 2) {
        mt_cpu_f16_to_f32((const uint16_t *)src, dst, n);
    } else if (dt == MT_BF16 && stride == 2) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(dst + i, &u, 4);
        }
    } else {
        mt_cpu_load_f32(src, stride, dt, n, dst);
    }
}

/* FP32 to n elements at dst, rounding to nearest even (the same bits as src/math/half.h). */
static void store_run(char *dst, int64_t stride, mt_dtype dt, int64_t n, const float *src) {
    if (dt == MT_F16 && stride == 2) {
        mt_cpu_f32_to_f16(src, (uint16_t *)dst, n);
    } else if (dt == MT_BF16 && stride == 2) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) { /* branch-free, so it vectorises */
            uint32_t u;
            memcpy(&u, src + i, 4);
            uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
        }
    } else {
        mt_cpu_store_f32(dst, stride, dt, n, src);
    }
}

/* A rows x cols block of an operand (strides in elements). Its FP32 copy is row-major (ld
   cols), or column-major (ld rows) when the source runs down its columns, so that every
   converted line is a contiguous run where the source allows. */
typedef struct {
    const char *p;
    int64_t rows, cols, rs, cs;
} blk;

static bool blk_colmajor(const blk *b) {
    return b->cols == 1 || (b->rows > 1 && llabs(b->rs) < llabs(b->cs));
}

static void blk_convert(const blk *b, bool cm, mt_dtype dt, float *dst, int64_t l0, int64_t l1) {
    int64_t es = (int64_t)mt_dtype_size(dt), len = cm ? b->rows : b->cols;
    int64_t lstride = (cm ? b->cs : b->rs) * es, estride = (cm ? b->rs : b->cs) * es;
    for (int64_t l = l0; l < l1; l++) load_run(b->p + l * lstride, estride, dt, len, dst + l * len);
}

/* tile (mc x nc, row-major) = alpha * A @ B + beta * tile, A and B FP32 blocks; oneDNN's
   sgemm where it takes F32 GEMMs of this size (cpu_gemm_dnnl.c). Runs on any thread of a
   parallel region: a oneDNN failure (no memory for its packing buffers) sets *failed, and
   the GEMM reports it once the region is over (the tile may be half written then, so
   OpenBLAS cannot simply redo it). */
static void tile_sgemm(int64_t mc, int64_t nc, int64_t kc, float alpha, const float *ap, bool acm,
                       const float *bp, bool bcm, float beta, float *tile, int *failed) {
    if (mt_cpu_gemm_dnnl_wanted(MT_F32, mc, nc, kc)) {
        if (!mt_cpu_sgemm_dnnl(acm, bcm, mc, nc, kc, alpha, ap, acm ? mc : kc, bp, bcm ? kc : nc,
                               beta, tile, nc)) {
#pragma omp atomic write
            *failed = 1;
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, acm ? CblasTrans : CblasNoTrans, bcm ? CblasTrans : CblasNoTrans,
                (int)mc, (int)nc, (int)kc, alpha, ap, (int)(acm ? mc : kc), bp,
                (int)(bcm ? kc : nc), beta, tile, (int)nc);
}

static void tile_load(const char *c, int64_t ldc, mt_dtype dt, int64_t mc, int64_t nc,
                      float *tile) {
    int64_t es = (int64_t)mt_dtype_size(dt);
    if (nc == ldc) {
        load_run(c, es, dt, mc * nc, tile);
        return;
    }
    for (int64_t r = 0; r < mc; r++) load_run(c + r * ldc * es, es, dt, nc, tile + r * nc);
}

static void tile_store(char *c, int64_t ldc, mt_dtype dt, int64_t mc, int64_t nc,
                       const float *tile) {
    int64_t es = (int64_t)mt_dtype_size(dt);
    if (nc == ldc) {
        store_run(c, es, dt, mc * nc, tile);
        return;
    }
    for (int64_t r = 0; r < mc; r++) store_run(c + r * ldc * es, es, dt, nc, tile + r * nc);
}

/* Splits n into the fewest blocks of at most cap, of even size (multiples of 16 when split). */
static int64_t block_size(int64_t n, int64_t cap) {
    if (n <= cap) return n;
    int64_t blocks = (n + cap - 1) / cap, b = (n + blocks - 1) / blocks;
    b = (b + 15) & ~(int64_t)15;
    return b <= cap ? b : cap;
}

/* ------------------------------------------------------------------ one large low-precision GEMM

   One parallel region per GEMM and no barrier inside it: on a busy machine every
   synchronisation can cost a scheduler slice, so the threads never wait for each other. The
   output is split into a tm x tn grid of blocks, one per thread (the grid that converts the
   fewest operand elements). Each thread walks its block in tiles: for every k-block it
   converts the tile's rows of a and columns of b to FP32, accumulates the FP32 tile with a
   single-threaded sgemm and finally rounds the tile into c once. Scratch is one tile's worth
   per thread, LP_THREAD_FLOATS, whatever the operand sizes. */
#define LP_BUDGET_FLOATS ((int64_t)256 * 1024) /* scratch of all threads together: 1 MiB */
#define LP_THREAD_MIN    ((int64_t)48 * 1024)  /* but tiles no smaller than this per thread */

typedef struct {
    mt_dtype dt;
    int64_t M, N, K;
    mt_gemm_mat a, b;
    char *c;
    int64_t ldc;
    float alpha, beta;
    const mt_cpu_epilogue *ep; /* NULL, or applied to each FP32 tile before its rounding */
    int *failed;               /* set by a tile GEMM that failed (tile_sgemm) */
} lp_job;

typedef struct {
    int tm, tn;         /* thread grid */
    int64_t bm, bn;     /* rows and columns of c per thread */
    int64_t mt, nt, kb; /* tile */
    bool n_outer;       /* walk tiles column-major (b's blocks reused) instead of row-major */
    int64_t per;        /* scratch floats per thread */
} lp_plan;

/* Cost of a tiling, in converted-element equivalents: conversions of a and b (the operand
   of the outer loop is converted once when K is one block), OpenBLAS's packing of each tile's
   operands and its passes over the tile per k-block (cheaper: the data is in cache) and a
   fixed cost per sgemm call. */
static double lp_cost(const lp_plan *p, int64_t K) {
    double bm = (double)p->bm, bn = (double)p->bn, k = (double)K;
    double mtiles = ceil(bm / (double)p->mt), ntiles = ceil(bn / (double)p->nt);
    double nkb = ceil(k / (double)p->kb);
    double a_conv = bm * k * (nkb == 1 && !p->n_outer ? 1 : ntiles);
    double b_conv = bn * k * (nkb == 1 && p->n_outer ? 1 : mtiles);
    double pack = bm * bn * k * (1.0 / (double)p->mt + 1.0 / (double)p->nt);
    double c_traffic = 2.0 * bm * bn * nkb; /* sgemm reads and writes the tile per k-block */
    return a_conv + b_conv + 0.5 * (pack + c_traffic) + 2000.0 * mtiles * ntiles * nkb;
}

static lp_plan lp_plan_for(int64_t M, int64_t N, int64_t K, int threads) {
    lp_plan p = {0}, best_p = {0};
    /* thread grid converting the fewest elements: tn copies of a, tm copies of b */
    double best = -1;
    for (int tm = 1; tm <= threads; tm++) {
        int tn = threads / tm;
        if (tm > M || tn > N) continue;
        double cost = (double)tn * (double)M * (double)K + (double)tm * (double)K * (double)N;
        if (best < 0 || cost < best || (cost == best && tm * tn > p.tm * p.tn)) {
            best = cost;
            p.tm = tm;
            p.tn = tn;
        }
    }
    if (best < 0) p.tm = p.tn = 1;
    p.bm = (M + p.tm - 1) / p.tm;
    p.bn = (N + p.tn - 1) / p.tn;
    int64_t budget = mt_gemm_imax(LP_BUDGET_FLOATS / (p.tm * p.tn), LP_THREAD_MIN);
    /* search k-block, loop order and the outer tile size; the inner tile takes the rest of
       the budget: outer*kb (its operand) + kb*inner (the other) + outer*inner (tile) */
    static const int64_t kb_caps[] = {2048, 1024, 512, 256, 128};
    best = -1;
    for (size_t ki = 0; ki < sizeof kb_caps / sizeof kb_caps[0]; ki++) {
        p.kb = block_size(K, kb_caps[ki]);
        for (int order = 0; order < 2; order++) {
            p.n_outer = order == 1;
            int64_t bo = p.n_outer ? p.bn : p.bm, bi = p.n_outer ? p.bm : p.bn;
            int64_t step = mt_gemm_imax(16, (bo / 64 + 15) & ~(int64_t)15);
            for (int64_t to = bo; to >= 1; to = to == bo ? (bo - 1) / step * step : to - step) {
                int64_t ti = (budget - to * p.kb) / (p.kb + to);
                if (ti >= 1 && (ti >= 16 || ti >= bi)) {
                    int64_t o = block_size(bo, to), i = block_size(bi, mt_gemm_imin(bi, ti));
                    p.mt = p.n_outer ? i : o;
                    p.nt = p.n_outer ? o : i;
                    double cost = lp_cost(&p, K);
                    if (best < 0 || cost < best) {
                        best = cost;
                        best_p = p;
                    }
                }
                if (to <= step) break;
            }
        }
    }
    if (best < 0) { /* budget below one minimal tile: take 16 x 16 tiles of 128-deep blocks */
        best_p = p;
        best_p.kb = block_size(K, 128);
        best_p.mt = mt_gemm_imin(p.bm, 16);
        best_p.nt = mt_gemm_imin(p.bn, 16);
        best_p.n_outer = false;
    }
    best_p.per = best_p.mt * best_p.kb + best_p.kb * best_p.nt + best_p.mt * best_p.nt;
    return best_p;
}

/* Rounds a finished FP32 tile into c, after the epilogue when there is one: bias and
   activation act on the FP32 sums, so the output is rounded once (and pre once). */
static void tile_finish(const lp_job *j, float *tile, int64_t m0, int64_t n0, int64_t mc,
                        int64_t nc) {
    int64_t es = (int64_t)mt_dtype_size(j->dt), at = (m0 * j->ldc + n0) * es;
    const mt_cpu_epilogue *ep = j->ep;
    if (ep) {
        if (ep->bias)
            for (int64_t r = 0; r < mc; r++)
                for (int64_t i = 0; i < nc; i++) tile[r * nc + i] += ep->bias[n0 + i];
        if (ep->pre) tile_store(ep->pre + at, j->ldc, j->dt, mc, nc, tile);
        mt_cpu_act_f32(ep->act, tile, mc * nc);
    }
    tile_store(j->c + at, j->ldc, j->dt, mc, nc, tile);
}

/* One thread's block of c: rows [r0, r1), columns [c0, c1). */
static void lp_block(const lp_job *j, const lp_plan *p, float *scratch, int64_t r0, int64_t r1,
                     int64_t c0, int64_t c1) {
    int64_t es = (int64_t)mt_dtype_size(j->dt), K = j->K;
    float *ap = scratch, *bp = ap + p->mt * p->kb, *tile = bp + p->kb * p->nt;
    /* the blocks held in ap and bp: with one k-block, the outer loop's block is reused */
    const char *held_a = NULL, *held_b = NULL;
    bool acm = false, bcm = false;
    int64_t olen = p->n_outer ? c1 - c0 : r1 - r0, ilen = p->n_outer ? r1 - r0 : c1 - c0;
    int64_t ostep = p->n_outer ? p->nt : p->mt, istep = p->n_outer ? p->mt : p->nt;
    for (int64_t o = 0; o < olen; o += ostep) {
        for (int64_t i = 0; i < ilen; i += istep) {
            int64_t m0 = r0 + (p->n_outer ? i : o), n0 = c0 + (p->n_outer ? o : i);
            int64_t mc = mt_gemm_imin(p->mt, r1 - m0), nc = mt_gemm_imin(p->nt, c1 - n0);
            char *ct = j->c + (m0 * j->ldc + n0) * es;
            for (int64_t k0 = 0; k0 < K; k0 += p->kb) {
                int64_t kc = mt_gemm_imin(p->kb, K - k0);
                blk A = {j->a.p + (m0 * j->a.rs + k0 * j->a.cs) * es, mc, kc, j->a.rs, j->a.cs};
                blk B = {j->b.p + (k0 * j->b.rs + n0 * j->b.cs) * es, kc, nc, j->b.rs, j->b.cs};
                if (held_a != A.p || kc != K) {
                    acm = blk_colmajor(&A);
                    blk_convert(&A, acm, j->dt, ap, 0, acm ? A.cols : A.rows);
                    held_a = kc == K ? A.p : NULL;
                }
                if (held_b != B.p || kc != K) {
                    bcm = blk_colmajor(&B);
                    blk_convert(&B, bcm, j->dt, bp, 0, bcm ? B.cols : B.rows);
                    held_b = kc == K ? B.p : NULL;
                }
                float beta = k0 == 0 ? j->beta : 1.0f;
                if (k0 == 0 && beta != 0.0f) tile_load(ct, j->ldc, j->dt, mc, nc, tile);
                tile_sgemm(mc, nc, kc, j->alpha, ap, acm, bp, bcm, beta, tile, j->failed);
            }
            tile_finish(j, tile, m0, n0, mc, nc);
        }
    }
}

static int lp_gemm(const lp_job *j, int threads) {
    lp_plan p = lp_plan_for(j->M, j->N, j->K, threads);
    int used = p.tm * p.tn;
    float *scratch = mt_host_alloc((size_t)used * (size_t)p.per * sizeof(float));
    if (!scratch)
        return mt_error_set(MT_ERR_OOM,
                            "mt_matmul: out of memory for the f32 panels of a %lld x %lld x %lld "
                            "%s matmul",
                            (long long)j->M, (long long)j->K, (long long)j->N,
                            mt_dtype_name(j->dt));
#pragma omp parallel for num_threads(used) if (used > 1) schedule(static, 1)
    for (int t = 0; t < used; t++) {
        int64_t r0 = (t / p.tn) * p.bm, c0 = (t % p.tn) * p.bn;
        lp_block(j, &p, scratch + (size_t)t * (size_t)p.per, r0, mt_gemm_imin(r0 + p.bm, j->M), c0,
                 mt_gemm_imin(c0 + p.bn, j->N));
    }
    mt_host_free(scratch, (size_t)used * (size_t)p.per * sizeof(float));
    return 0;
}

/* ------------------------------------------------------------------ many small low-precision GEMMs

   A batch of matrices each too small for threads: one matrix per thread at a time, each
   thread with its own FP32 copies of the whole (small) operands. */
static void small_gemm(float *ab, const lp_job *j) {
    blk A = {j->a.p, j->M, j->K, j->a.rs, j->a.cs}, B = {j->b.p, j->K, j->N, j->b.rs, j->b.cs};
    bool acm = blk_colmajor(&A), bcm = blk_colmajor(&B);
    float *ap = ab, *bp = ab + j->M * j->K, *cp = bp + j->K * j->N;
    blk_convert(&A, acm, j->dt, ap, 0, acm ? A.cols : A.rows);
    blk_convert(&B, bcm, j->dt, bp, 0, bcm ? B.cols : B.rows);
    if (j->beta != 0.0f) tile_load(j->c, j->ldc, j->dt, j->M, j->N, cp);
    tile_sgemm(j->M, j->N, j->K, j->alpha, ap, acm, bp, bcm, j->beta, cp, j->failed);
    tile_store(j->c, j->ldc, j->dt, j->M, j->N, cp);
}

/* ------------------------------------------------------------------ F32 / F64 on BLAS */

/* A contiguous copy of a strided matrix for F64 operands BLAS cannot read. */
static void copy_f64(const mt_gemm_mat *m, int64_t rows, int64_t cols, double *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            dst[r * cols + k] = *(const double *)(m->p + (r * m->rs + k * m->cs) * 8);
}

static void blas_gemm(mt_dtype dt, int64_t M, int64_t N, int64_t K, mt_gemm_mat a, int al,
                      int64_t lda, mt_gemm_mat b, int bl, int64_t ldb, char *c, int64_t ldc,
                      double alpha, double beta) {
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
        int64_t n = mt_gemm_imin(256, c->numel - i);
        mt_cpu_load_f64(p + i * (int64_t)es, (int64_t)es, c->dtype, n, buf);
        for (int64_t j = 0; j < n; j++) buf[j] = beta == 0.0 ? 0.0 : buf[j] * beta;
        mt_cpu_store_f64(p + i * (int64_t)es, (int64_t)es, c->dtype, n, buf);
    }
}

static int gemm_f64(const mt_gemm_geom *g, double alpha, double beta) {
    int64_t lda, ldb;
    int al = mt_gemm_layout(g->M, g->K, g->a.rs, g->a.cs, &lda);
    int bl = mt_gemm_layout(g->K, g->N, g->b.rs, g->b.cs, &ldb);
    double *ta = NULL, *tb = NULL;
    size_t na = (size_t)(g->M * g->K), nbb = (size_t)(g->K * g->N);
    if (al < 0 && !(ta = mt_host_alloc(na * 8))) goto oom;
    if (bl < 0 && !(tb = mt_host_alloc(nbb * 8))) goto oom;
    const char *held_a = NULL, *held_b = NULL;
    for (int64_t bi = 0; bi < g->count; bi++) {
        int64_t ao, bo;
        mt_cpu_offsets2(g->nb, g->shape, g->astr, g->bstr, bi, &ao, &bo);
        mt_gemm_mat a = {g->a.p + ao * 8, g->a.rs, g->a.cs},
                    b = {g->b.p + bo * 8, g->b.rs, g->b.cs};
        int la = al, lb = bl;
        int64_t xa = lda, xb = ldb;
        if (al < 0) { /* copy once per distinct source matrix */
            if (held_a != a.p) copy_f64(&a, g->M, g->K, ta);
            held_a = a.p;
            a = (mt_gemm_mat){(const char *)ta, g->K, 1};
            la = 0;
            xa = mt_gemm_imax(g->K, 1);
        }
        if (bl < 0) {
            if (held_b != b.p) copy_f64(&b, g->K, g->N, tb);
            held_b = b.p;
            b = (mt_gemm_mat){(const char *)tb, g->N, 1};
            lb = 0;
            xb = mt_gemm_imax(g->N, 1);
        }
        blas_gemm(MT_F64, g->M, g->N, g->K, a, la, xa, b, lb, xb, g->c + bi * g->M * g->N * 8,
                  mt_gemm_imax(g->N, 1), alpha, beta);
    }
    mt_host_free(ta, ta ? na * 8 : 0);
    mt_host_free(tb, tb ? nbb * 8 : 0);
    return 0;
oom:
    mt_host_free(ta, ta ? na * 8 : 0);
    return mt_error_set(MT_ERR_OOM, "mt_matmul: out of memory for a %lld x %lld f64 operand copy",
                        (long long)(al < 0 ? g->M : g->K), (long long)(al < 0 ? g->K : g->N));
}

static void gemm_f32_entry(const mt_gemm_geom *g, int64_t bi, int al, int64_t lda, int bl,
                           int64_t ldb, double alpha, double beta) {
    int64_t ao, bo;
    mt_cpu_offsets2(g->nb, g->shape, g->astr, g->bstr, bi, &ao, &bo);
    mt_gemm_mat a = {g->a.p + ao * 4, 0, 0}, b = {g->b.p + bo * 4, 0, 0};
    blas_gemm(MT_F32, g->M, g->N, g->K, a, al, lda, b, bl, ldb, g->c + bi * g->M * g->N * 4,
              mt_gemm_imax(g->N, 1), alpha, beta);
}

/* F32 with both operands readable by BLAS: no copies at all. Large matrices are left to
   OpenBLAS's threads, called outside any parallel region (inside one, even an inactive one,
   it runs slower); batches of small ones are spread over our threads. */
static void gemm_f32_direct(const mt_gemm_geom *g, int al, int64_t lda, int bl, int64_t ldb,
                            double alpha, double beta) {
    double mnk = (double)g->M * (double)g->N * (double)g->K;
    int nt = mt_cpu_num_threads();
    if (g->count > 1 && mnk <= BLAS_SINGLE_THREAD_MNK &&
        mnk * (double)g->count >= BATCH_PARALLEL_MIN_FLOPS && nt > 1) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t bi = 0; bi < g->count; bi++)
            gemm_f32_entry(g, bi, al, lda, bl, ldb, alpha, beta);
        return;
    }
    for (int64_t bi = 0; bi < g->count; bi++) gemm_f32_entry(g, bi, al, lda, bl, ldb, alpha, beta);
}

static int panel_failure(const mt_gemm_geom *g, mt_dtype dt) {
    return mt_error_set(MT_ERR_OOM,
                        "mt_matmul: oneDNN's sgemm failed on the f32 panels of a %lld x %lld x "
                        "%lld %s matmul (out of memory for its packing buffers)",
                        (long long)g->M, (long long)g->K, (long long)g->N, mt_dtype_name(dt));
}

/* The FP32-panel path over the batch: small matrices are spread over the threads, large
   ones are split by lp_gemm. */
static int gemm_panels(const mt_gemm_geom *g, mt_dtype dt, double alpha, double beta,
                       const mt_cpu_epilogue *ep) {
    int64_t es = (int64_t)g->es;
    double mnk = (double)g->M * (double)g->N * (double)g->K;
    int nt = mt_cpu_num_threads();
    int failed = 0;
    lp_job j = {.dt = dt,
                .M = g->M,
                .N = g->N,
                .K = g->K,
                .a = g->a,
                .b = g->b,
                .c = g->c,
                .ldc = g->N,
                .alpha = (float)alpha,
                .beta = (float)beta,
                .ep = ep,
                .failed = &failed};
    size_t per = (size_t)(g->M * g->K + g->K * g->N + g->M * g->N);
    if (mnk > BLAS_SINGLE_THREAD_MNK || g->count == 1 || per > (size_t)LP_THREAD_MIN || ep) {
        int threads = mnk > BLAS_SINGLE_THREAD_MNK ? nt : 1;
        for (int64_t bi = 0; bi < g->count; bi++) {
            int64_t ao, bo;
            mt_cpu_offsets2(g->nb, g->shape, g->astr, g->bstr, bi, &ao, &bo);
            j.a.p = g->a.p + ao * es;
            j.b.p = g->b.p + bo * es;
            j.c = g->c + bi * g->M * g->N * es;
            int rc = lp_gemm(&j, threads);
            if (rc || failed) return rc ? rc : panel_failure(g, dt);
        }
        return 0;
    }
    bool par = mnk * (double)g->count >= BATCH_PARALLEL_MIN_FLOPS && nt > 1;
    int threads = par ? (int)mt_gemm_imin(nt, g->count) : 1;
    float *buf = mt_host_alloc((size_t)threads * per * sizeof(float));
    if (!buf)
        return mt_error_set(MT_ERR_OOM,
                            "mt_matmul: out of memory for the f32 panels of %d %lld x %lld x %lld "
                            "%s matmuls",
                            threads, (long long)g->M, (long long)g->K, (long long)g->N,
                            mt_dtype_name(dt));
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t bi = 0; bi < g->count; bi++) {
        int64_t ao, bo;
        mt_cpu_offsets2(g->nb, g->shape, g->astr, g->bstr, bi, &ao, &bo);
        lp_job jb = j;
        jb.a.p = g->a.p + ao * es;
        jb.b.p = g->b.p + bo * es;
        jb.c = g->c + bi * g->M * g->N * es;
        small_gemm(buf + (size_t)omp_get_thread_num() * per, &jb);
    }
    mt_host_free(buf, (size_t)threads * per * sizeof(float));
    return failed ? panel_failure(g, dt) : 0;
}

/* The GEMM; an epilogue is applied by the FP32-panel path only (*ep_done then), the caller
   applies it to the other paths' output. */
static int gemm_impl(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha,
                     double beta, const mt_cpu_epilogue *ep, bool *ep_done) {
    mt_dtype dt = c->dtype;
    *ep_done = false;
    if (c->ndim < 2 || !mt_is_contiguous(c) || a->dtype != dt || b->dtype != dt ||
        !mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_INTERNAL, "mt_cpu_gemm: bad operands (%s, %s -> %s, %d-d)",
                            mt_dtype_name(a->dtype), mt_dtype_name(b->dtype), mt_dtype_name(dt),
                            c->ndim);
    mt_gemm_geom g;
    if (mt_gemm_geom_init(&g, c, a, b) < 0)
        return mt_error_set(MT_ERR_INTERNAL, "mt_cpu_gemm: operand shapes do not fit the output");
    if (g.count == 0 || g.M == 0 || g.N == 0) return 0;
    if (g.K == 0) {
        scale_c(c, beta);
        return 0;
    }
    if (!ep && mt_cpu_gemm_dnnl_wanted(dt, g.count * g.M, g.N, g.K)) {
        bool unsupported;
        int rc = mt_cpu_gemm_dnnl(c, a, b, alpha, beta, &unsupported);
        if (rc || !unsupported) return rc;
    }
    if (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "mt_matmul: a %lld x %lld x %lld matmul exceeds the BLAS int range",
                            (long long)g.M, (long long)g.K, (long long)g.N);

    int64_t frs;
    if (mt_gemm_batch_folds(&g, &frs) &&
        g.count * g.M <= INT_MAX) { /* one GEMM for the whole batch */
        g.M *= g.count;
        g.a.rs = frs;
        g.count = 1;
        g.nb = 0;
    }
    if (dt == MT_F64) return gemm_f64(&g, alpha, beta);
    if (dt == MT_F32) {
        int64_t lda, ldb;
        int al = mt_gemm_layout(g.M, g.K, g.a.rs, g.a.cs, &lda);
        int bl = mt_gemm_layout(g.K, g.N, g.b.rs, g.b.cs, &ldb);
        if (al >= 0 && bl >= 0) {
            gemm_f32_direct(&g, al, lda, bl, ldb, alpha, beta);
            return 0;
        }
    }
    *ep_done = ep != NULL;
    return gemm_panels(&g, dt, alpha, beta, ep);
}

int mt_cpu_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta) {
    bool done;
    return gemm_impl(c, a, b, alpha, beta, NULL, &done);
}

int mt_cpu_gemm_fused(mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                      const mt_cpu_epilogue *ep, bool *ep_done) {
    return gemm_impl(c, a, b, 1.0, 0.0, ep, ep_done);
}

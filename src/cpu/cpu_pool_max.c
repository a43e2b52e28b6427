/* Max pooling on the CPU with torch's semantics: each window's first maximum in row-major
   order, a NaN winning (the last NaN of the window, as torch's CPU `val > max || isnan(val)`).
   The forward finds the argmax once and, when the op will record a node, writes it to idx (I32,
   y's shape and format: the flat offset h * W + w within the input plane, as torch's indices);
   the backward only scatters gy through idx, it never searches a window again.
   NCHW (or any strides): one (n, c) plane per task, widened to F32 into a copy padded with
   -inf columns, and each output row computed input row by kernel column, branch-free over all
   the row's outputs, so that the select vectorises and no branch depends on the data. NHWC
   (channel stride 1): one (n, oh) output row per task in the forward, a sample or a block of
   its channels per task in the backward (a block's scatter never touches another's gradient),
   C channels at a time. F64 keeps plain double loops (gradchecks). Gradients sum in F32 (F64 for
   F64), each rounded once to a low dtype. */
#pragma GCC optimize("no-trapping-math") /* else GCC keeps the NaN-aware selects scalar */
#include <math.h>
#include <string.h>
#include "cpu_pool_rows.h"

/* ---- planes */

/* The plane loops read each plane widened to floats into a padded copy: pw columns of -inf on
   the left and enough on the right (Wp = padded_width()) that every kernel column of every
   output lies inside the row, so the loops over a row's outputs run over all OW of them with
   no per-column ranges (short loops whose remainders cost more than the work). -inf never
   wins a window (strict >, and it is no NaN), and a window of -inf only keeps its first
   element, so the padding changes nothing. */
static int64_t padded_width(const mt_pool2d_params *p, int64_t W, int64_t OW) {
    int64_t need = (OW - 1) * p->stride[1] + p->kernel[1];
    return need > p->padding[1] + W ? need : p->padding[1] + W;
}

static void pad_plane(const mt_cpu_plane *xp, int64_t H, int64_t W, int64_t pw, int64_t Wp,
                      float *dst) {
    for (int64_t h = 0; h < H; h++) {
        float *r = dst + h * Wp;
        for (int64_t v = 0; v < pw; v++) r[v] = -INFINITY;
        mt_cpu_load_f32(mt_cpu_pix(xp, h, 0), xp->sw, xp->t->dtype, W, r + pw);
        for (int64_t v = pw + W; v < Wp; v++) r[v] = -INFINITY;
    }
}

/* best[o], arg[o] over input rows [h0, h1) of the padded plane x and kernel columns
   [0, KW), for o in [0, OW): the element at padded column o * S + kw takes over where it is
   larger or a NaN (row-major window order: the first maximum, the last NaN). Its index is
   unpadded: h * W + o * S + kw - pw. Branch-free, so that it vectorises over o; inlined with
   S a constant for the common strides. (Kernel columns inside the o loop, in registers,
   measured 1.5x slower: GCC vectorises that shape worse.) */
MT_CPU_INLINE void max_row_s(const float *restrict x, int64_t Wp, int64_t W, int64_t h0, int64_t h1,
                             int64_t KW, int64_t S, int64_t pw, int64_t OW, float *restrict best,
                             int32_t *restrict arg) {
    for (int64_t o = 0; o < OW; o++) {
        int64_t ws = o * S - pw;
        best[o] = -INFINITY;
        arg[o] = (int32_t)(uint32_t)(h0 * W + (ws > 0 ? ws : 0)); /* all -inf: the first */
    }
    for (int64_t h = h0; h < h1; h++)
        for (int64_t kw = 0; kw < KW; kw++) {
            const float *r = x + h * Wp + kw;
            /* unsigned: no overflow where planes outgrow int32 (no indices are kept then) */
            uint32_t at = (uint32_t)(h * W + kw - pw);
            for (int64_t o = 0; o < OW; o++) {
                float e = r[o * S], b = best[o];
                bool take = e > b || e != e;
                best[o] = take ? e : b;
                arg[o] = take ? (int32_t)(at + (uint32_t)(o * S)) : arg[o];
            }
        }
}

MT_CPU_CLONES static void max_row(const float *restrict x, int64_t Wp, int64_t W, int64_t h0,
                                  int64_t h1, int64_t KW, int64_t S, int64_t pw, int64_t OW,
                                  float *restrict best, int32_t *restrict arg) {
    if (S == 1)
        max_row_s(x, Wp, W, h0, h1, KW, 1, pw, OW, best, arg);
    else if (S == 2)
        max_row_s(x, Wp, W, h0, h1, KW, 2, pw, OW, best, arg);
    else
        max_row_s(x, Wp, W, h0, h1, KW, S, pw, OW, best, arg);
}

/* Per-thread scratch of the plane loops, one block: the plane widened to floats (or the
   gradient plane summed), and one output row of maxima (or gradients) and argmax. */
typedef struct {
    void *plane; /* H * W floats, or doubles for F64 */
    void *row;   /* OW floats or doubles */
    int32_t *arg;
} plane_scratch;

/* plane: n elements of es bytes; row and arg: OW each */
static size_t plane_scratch_bytes(int64_t n, int64_t OW, size_t es) {
    return (size_t)(n + OW) * es + (size_t)OW * sizeof(int32_t);
}

static plane_scratch plane_scratch_at(void *block, int64_t n, int64_t OW, size_t es) {
    char *row = (char *)block + (size_t)n * es;
    return (plane_scratch){block, row, (int32_t *)(row + (size_t)OW * es)};
}

static inline int32_t *idx_at(const mt_cpu_plane *ip, int64_t h, int64_t w) {
    return (int32_t *)mt_cpu_pix(ip, h, w);
}

/* One F32/F16/BF16 plane: y (and idx when ip) from x, an output row at a time. */
static void max_plane_f32(mt_cpu_plane *yp, const mt_cpu_plane *ip, const mt_cpu_plane *xp,
                          const mt_pool2d_params *p, int64_t H, int64_t W, int64_t Wp,
                          plane_scratch *s) {
    int64_t OH = yp->t->shape[2], OW = yp->t->shape[3], KH = p->kernel[0];
    float *x = s->plane, *best = s->row;
    pad_plane(xp, H, W, p->padding[1], Wp, x);
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t hs = oh * p->stride[0] - p->padding[0];
        int64_t h0 = hs > 0 ? hs : 0, h1 = hs + KH < H ? hs + KH : H;
        max_row(x, Wp, W, h0, h1, p->kernel[1], p->stride[1], p->padding[1], OW, best, s->arg);
        mt_cpu_store_f32(mt_cpu_pix(yp, oh, 0), yp->sw, yp->t->dtype, OW, best);
        if (ip)
            for (int64_t ow = 0; ow < OW; ow++) *idx_at(ip, oh, ow) = s->arg[ow];
    }
}

/* One F64 plane, exactly, window by window. */
static void max_plane_f64(mt_cpu_plane *yp, const mt_cpu_plane *ip, const mt_cpu_plane *xp,
                          const mt_pool2d_params *p, int64_t H, int64_t W) {
    int64_t OH = yp->t->shape[2], OW = yp->t->shape[3];
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            mt_cpu_window w;
            mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
            int64_t at = w.h0 * W + w.w0;
            double best = -INFINITY;
            for (int64_t h = w.h0; h < w.h1; h++)
                for (int64_t v = w.w0; v < w.w1; v++) {
                    double e = *(const double *)mt_cpu_pix(xp, h, v);
                    if (e > best || isnan(e)) best = e, at = h * W + v;
                }
            *(double *)mt_cpu_pix(yp, oh, ow) = best;
            if (ip) *idx_at(ip, oh, ow) = (int32_t)at;
        }
}

/* One (n, c) plane; block: the F32 plane loops' scratch (NULL for F64). */
static void max_plane(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p,
                      int64_t n, int64_t c, int64_t Wp, void *block) {
    int64_t H = x->shape[2], W = x->shape[3];
    mt_cpu_plane xp = mt_cpu_plane_of(x, n, c), yp = mt_cpu_plane_of(y, n, c), ip;
    if (idx) ip = mt_cpu_plane_of(idx, n, c);
    if (!block) {
        max_plane_f64(&yp, idx ? &ip : NULL, &xp, p, H, W);
        return;
    }
    plane_scratch s = plane_scratch_at(block, H * Wp, y->shape[3], sizeof(float));
    max_plane_f32(&yp, idx ? &ip : NULL, &xp, p, H, W, Wp, &s);
}

static int max_pool_planes(mt_tensor *y, mt_tensor *idx, const mt_tensor *x,
                           const mt_pool2d_params *p) {
    int64_t Wp = padded_width(p, x->shape[3], y->shape[3]);
    size_t nbytes =
        x->dtype == MT_F64 ? 0 : plane_scratch_bytes(x->shape[2] * Wp, y->shape[3], sizeof(float));
    bool ok;
    MT_CPU_POOL_TASKS(ok, y->numel * 4, nbytes, y->shape[0], y->shape[1], n, c, block,
                      max_plane(y, idx, x, p, n, c, Wp, block););
    return ok ? 0 : mt_error_set(MT_ERR_OOM, "mt_max_pool2d: out of memory for an input plane");
}

/* gx's plane = the scatter of gy's plane through idx. F32/F16/BF16: summed in F32, in gx's
   own plane when that is dense F32. */
static void max_plane_backward_f32(mt_cpu_plane *gp, const mt_cpu_plane *gyp,
                                   const mt_cpu_plane *ip, int64_t H, int64_t W, plane_scratch *s) {
    int64_t OH = gyp->t->shape[2], OW = gyp->t->shape[3];
    bool direct = gp->t->dtype == MT_F32 && gp->sw == 4 && gp->sh == 4 * W;
    float *acc = direct ? (float *)gp->base : s->plane, *g = s->row;
    memset(acc, 0, (size_t)(H * W) * sizeof(float));
    for (int64_t oh = 0; oh < OH; oh++) {
        mt_cpu_load_f32(mt_cpu_pix(gyp, oh, 0), gyp->sw, gyp->t->dtype, OW, g);
        for (int64_t ow = 0; ow < OW; ow++) acc[*idx_at(ip, oh, ow)] += g[ow];
    }
    if (!direct)
        for (int64_t h = 0; h < H; h++)
            mt_cpu_store_f32(mt_cpu_pix(gp, h, 0), gp->sw, gp->t->dtype, W, acc + h * W);
}

static void max_plane_backward_f64(mt_cpu_plane *gp, const mt_cpu_plane *gyp,
                                   const mt_cpu_plane *ip, int64_t H, int64_t W, plane_scratch *s) {
    int64_t OH = gyp->t->shape[2], OW = gyp->t->shape[3];
    double *acc = s->plane, *g = s->row;
    memset(acc, 0, (size_t)(H * W) * sizeof(double));
    for (int64_t oh = 0; oh < OH; oh++) {
        mt_cpu_load_f64(mt_cpu_pix(gyp, oh, 0), gyp->sw, gyp->t->dtype, OW, g);
        for (int64_t ow = 0; ow < OW; ow++) acc[*idx_at(ip, oh, ow)] += g[ow];
    }
    for (int64_t h = 0; h < H; h++)
        mt_cpu_store_f64(mt_cpu_pix(gp, h, 0), gp->sw, gp->t->dtype, W, acc + h * W);
}

static void max_backward_plane(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx, int64_t n,
                               int64_t c, void *block) {
    int64_t H = gx->shape[2], W = gx->shape[3];
    bool f64 = gx->dtype == MT_F64;
    plane_scratch s =
        plane_scratch_at(block, H * W, gy->shape[3], f64 ? sizeof(double) : sizeof(float));
    mt_cpu_plane gp = mt_cpu_plane_of(gx, n, c), gyp = mt_cpu_plane_of(gy, n, c);
    mt_cpu_plane ip = mt_cpu_plane_of(idx, n, c);
    if (f64)
        max_plane_backward_f64(&gp, &gyp, &ip, H, W, &s);
    else
        max_plane_backward_f32(&gp, &gyp, &ip, H, W, &s);
}

/* one (n, c) plane per task: the planes' scatters are disjoint, so no races */
static int max_pool_backward_planes(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx) {
    size_t es = gx->dtype == MT_F64 ? sizeof(double) : sizeof(float);
    size_t nbytes = plane_scratch_bytes(gx->shape[2] * gx->shape[3], gy->shape[3], es);
    bool ok;
    MT_CPU_POOL_TASKS(ok, gx->numel * 4, nbytes, gx->shape[0], gx->shape[1], n, c, block,
                      max_backward_plane(gx, gy, idx, n, c, block););
    return ok ? 0 : mt_error_set(MT_ERR_OOM, "mt_max_pool2d: out of memory for a gradient plane");
}

/* ---- NHWC rows */

/* yr = max(yr, xr) per channel, a NaN taking over; branch-free so that it vectorises. */
MT_CPU_CLONES static void row_max(float *restrict yr, const float *restrict xr, int64_t C) {
    for (int64_t c = 0; c < C; c++) {
        float a = yr[c], b = xr[c];
        yr[c] = (b > a || b != b) ? b : a;
    }
}

/* The same, also moving each channel's argmax to position at where xr takes over. */
MT_CPU_CLONES static void row_argmax(float *restrict best, int32_t *restrict arg,
                                     const float *restrict xr, int32_t at, int64_t C) {
    for (int64_t c = 0; c < C; c++) {
        float a = best[c], b = xr[c];
        bool take = b > a || b != b;
        best[c] = take ? b : a;
        arg[c] = take ? at : arg[c];
    }
}

/* The input rows [h0, h1) of sample n as F32 pixels of C channels (pixel (h, v) at
   ((h - h0) * W + v) * C): a low x widened once per output row, not once per window that
   reads it; an F32 x is read in place (NULL). */
static const float *input_rows(const mt_tensor *x, int64_t n, int64_t h0, int64_t h1, float *buf) {
    int64_t C = x->shape[1], W = x->shape[3];
    if (x->dtype == MT_F32) return NULL;
    bool dense = x->strides[3] == C && x->strides[2] == W * C;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t v = 0; v < W; v += dense ? W : 1)
            mt_cpu_row_widen(mt_cpu_row_at(x, n, h, v), x->dtype, dense ? W * C : C,
                             buf + ((h - h0) * W + v) * C);
    return buf;
}

/* One output row (n, oh): y and, when idx, the argmax of each window. */
static void max_out_row_nhwc(mt_tensor *y, mt_tensor *idx, const mt_tensor *x,
                             const mt_pool2d_params *p, int64_t n, int64_t oh, float *acc,
                             float *rows) {
    int64_t C = y->shape[1], OH = y->shape[2], OW = y->shape[3], H = x->shape[2], W = x->shape[3];
    mt_cpu_window w;
    mt_cpu_window_of(p, oh, 0, H, W, OH, OW, &w); /* the rows are the same for every ow */
    const float *xs = input_rows(x, n, w.h0, w.h1, rows);
    for (int64_t ow = 0; ow < OW; ow++) {
        mt_cpu_window_of(p, oh, ow, H, W, OH, OW, &w);
        float *yr = mt_cpu_row_out(y, n, oh, ow, acc);
        int32_t *ar = idx ? (int32_t *)mt_cpu_row_at(idx, n, oh, ow) : NULL;
        for (int64_t c = 0; c < C; c++) yr[c] = -INFINITY;
        if (ar)
            for (int64_t c = 0; c < C; c++) ar[c] = (int32_t)(w.h0 * W + w.w0);
        for (int64_t h = w.h0; h < w.h1; h++)
            for (int64_t v = w.w0; v < w.w1; v++) {
                const float *xr =
                    xs ? xs + ((h - w.h0) * W + v) * C : (const float *)mt_cpu_row_at(x, n, h, v);
                if (ar)
                    row_argmax(yr, ar, xr, (int32_t)(h * W + v), C);
                else
                    row_max(yr, xr, C);
            }
        if (yr == acc) mt_cpu_row_store(y, n, oh, ow, acc);
    }
}

/* Returns false when the per-thread rows cannot be had. */
static bool max_pool_nhwc(mt_tensor *y, mt_tensor *idx, const mt_tensor *x,
                          const mt_pool2d_params *p) {
    int64_t C = y->shape[1];
    int64_t rows = x->dtype == MT_F32 ? 0 : p->kernel[0] * x->shape[3] * C;
    bool ok;
    MT_CPU_POOL_TASKS(ok, y->numel * 4, (size_t)(C + rows) * sizeof(float), y->shape[0],
                      y->shape[2], n, oh, acc,
                      max_out_row_nhwc(y, idx, x, p, n, oh, acc, (float *)acc + C););
    return ok;
}

/* g0[arg[c] * rs + c] += gr[c]: the rows of a sample's gradient lie dense, rs apart. */
MT_CPU_CLONES static void row_scatter(float *restrict g0, int64_t rs, const int32_t *restrict arg,
                                      const float *restrict gr, int64_t C) {
    for (int64_t c = 0; c < C; c++) g0[arg[c] * rs + c] += gr[c];
}

/* One task of the backward: channels [c0, c0 + cn) of gx[n] = the scatter of gy[n] through
   idx[n] (an index moves a gradient within its channel, so blocks of channels never touch
   each other's elements). gacc: the block's gradient in F32 for a low gx (rows cn apart),
   else the sums go to gx's F32 rows in place. */
static void max_backward_block(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx, int64_t n,
                               int64_t c0, int64_t cn, float *gbuf, float *gacc) {
    int64_t H = gx->shape[2], W = gx->shape[3], OH = gy->shape[2], OW = gy->shape[3];
    bool dense = gacc || gx->strides[2] == W * gx->strides[3];
    /* the whole sample's rows at once where they lie together */
    bool whole = cn == gx->shape[1] && gx->strides[3] == cn && gx->strides[2] == W * cn;
    if (gacc)
        memset(gacc, 0, (size_t)(H * W * cn) * sizeof(float));
    else
        for (int64_t h = 0; h < H; h++)
            for (int64_t v = 0; v < W; v += whole ? W : 1)
                memset((float *)mt_cpu_row_at(gx, n, h, v) + c0, 0,
                       (size_t)((whole ? W : 1) * cn) * sizeof(float));
    float *g0 = gacc ? gacc : (float *)mt_cpu_row_at(gx, n, 0, 0) + c0;
    int64_t rs = gacc ? cn : gx->strides[3];
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *gr = mt_cpu_row_part_load(gy, n, oh, ow, c0, cn, gbuf);
            const int32_t *ar = (const int32_t *)mt_cpu_row_at(idx, n, oh, ow) + c0;
            if (dense) {
                row_scatter(g0, rs, ar, gr, cn);
                continue;
            }
            for (int64_t c = 0; c < cn; c++)
                ((float *)mt_cpu_row_at(gx, n, ar[c] / W, ar[c] % W))[c0 + c] += gr[c];
        }
    if (gacc && whole)
        mt_cpu_row_part_store(gx, n, 0, 0, 0, H * W * cn, gacc);
    else if (gacc)
        for (int64_t h = 0; h < H; h++)
            for (int64_t v = 0; v < W; v++)
                mt_cpu_row_part_store(gx, n, h, v, c0, cn, gacc + (h * W + v) * cn);
}

/* Returns false when the per-thread scratch cannot be had. Tasks are (sample, channel block):
   whole samples when there are enough of them for the threads, else blocks of channels (whole
   64-byte lines of F32), so that a small batch still spreads over the threads. */
static bool max_pool_backward_nhwc(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx) {
    int64_t N = gx->shape[0], C = gx->shape[1], HW = gx->shape[2] * gx->shape[3];
    int64_t threads = mt_cpu_num_threads(), parts = N >= threads ? 1 : (threads + N - 1) / N;
    int64_t cb = ((C + parts - 1) / parts + 15) / 16 * 16;
    cb = cb < C ? cb : C;
    int64_t nb = (C + cb - 1) / cb;
    size_t nbytes = (size_t)(cb + (gx->dtype == MT_F32 ? 0 : HW * cb)) * sizeof(float);
    bool ok;
    MT_CPU_POOL_TASKS(ok, gx->numel * 4, nbytes, N, nb, n, b, gbuf, int64_t c0 = b * cb,
                      cn = C - c0 < cb ? C - c0 : cb;
                      max_backward_block(gx, gy, idx, n, c0, cn, gbuf,
                                         gx->dtype != MT_F32 ? (float *)gbuf + cb : NULL););
    return ok;
}

/* ---- entry points (through cpu_pool.c's families) */

static bool nhwc_rows(const mt_tensor *a, const mt_tensor *b, const mt_tensor *idx) {
    return a->dtype == b->dtype && mt_cpu_pool_nhwc(a) && mt_cpu_pool_nhwc(b) &&
           idx->strides[1] == 1;
}

int mt_cpu_max_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p) {
    if (idx && x->shape[2] * x->shape[3] > INT32_MAX)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "mt_max_pool2d: input planes of %lld x %lld elements do not fit the "
                            "int32 argmax indices of the CPU backend",
                            (long long)x->shape[2], (long long)x->shape[3]);
    if (y->numel == 0) return 0;
    if (nhwc_rows(x, y, idx ? idx : y))
        return max_pool_nhwc(y, idx, x, p) ? 0
                                           : mt_error_set(MT_ERR_OOM,
                                                          "mt_max_pool2d: out of memory for %lld "
                                                          "channels",
                                                          (long long)y->shape[1]);
    return max_pool_planes(y, idx, x, p);
}

int mt_cpu_max_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *idx,
                               const mt_pool2d_params *p) {
    (void)p; /* the indices carry the geometry */
    if (!idx)
        return mt_error_set(MT_ERR_INTERNAL,
                            "mt_max_pool2d: backward without the forward's argmax indices");
    if (gx->numel == 0) return 0;
    if (!nhwc_rows(gx, gx, idx) || gy->dtype != gx->dtype)
        return max_pool_backward_planes(gx, gy, idx);
    const mt_tensor *rows;
    mt_tensor *copy;
    int rc = mt_cpu_pool_rows_like("mt_max_pool2d", gy, &rows, &copy);
    if (rc == 0 && !max_pool_backward_nhwc(gx, rows, idx))
        rc = mt_error_set(MT_ERR_OOM, "mt_max_pool2d: out of memory for %lld channels",
                          (long long)gx->shape[1]);
    mt_tensor_unref(copy);
    return rc;
}

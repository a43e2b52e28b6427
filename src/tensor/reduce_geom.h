/* The geometry of a reduction over a dim mask, shared by the backends' reduce families
   (src/cpu/cpu_reduce.c, src/cuda/reduce.cu) so that both walk the same dims in the same
   order and round alike. Size-1 dims are dropped; kept dims stay in order and merge where
   both input and output nest; reduced dims are sorted by |stride| (largest first) and merge
   where they nest, the last one being the innermost run. Column mode: when a kept dim of at
   least 4 is the contiguous one and the run is not (a sum over dim 0 of [N, C]), that dim
   moves last and kept flat indices follow the new order. Strides in elements; device-neutral
   (it only looks at shapes and strides). */
#ifndef MT_TENSOR_REDUCE_GEOM_H
#define MT_TENSOR_REDUCE_GEOM_H
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "mixtape.h"

typedef struct {
    int nk, nr;   /* kept dims (at least 1), reduced dims (at least 1) */
    bool column;  /* the last kept dim is the contiguous one */
    int64_t K, R; /* outputs, and values reduced into each */
    int64_t kshape[MT_MAX_DIMS], kstride[MT_MAX_DIMS], ostride[MT_MAX_DIMS];
    int64_t rshape[MT_MAX_DIMS], rstride[MT_MAX_DIMS];
} mt_reduce_geom;

static inline void mt_reduce_geom_sort(int n, int64_t *rs, int64_t *rsh) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && llabs(rs[j]) > llabs(rs[j - 1]); j--) {
            int64_t t = rs[j];
            rs[j] = rs[j - 1], rs[j - 1] = t;
            t = rsh[j];
            rsh[j] = rsh[j - 1], rsh[j - 1] = t;
        }
}

static inline void mt_reduce_geom_column(mt_reduce_geom *g) {
    int vec = -1;
    for (int k = 0; k < g->nk; k++)
        if (g->kstride[k] == 1 && g->kshape[k] >= 4) vec = k;
    if (vec < 0 || g->rstride[g->nr - 1] == 1 || g->R <= 1) return;
    int64_t s0 = g->kshape[vec], s1 = g->kstride[vec], s2 = g->ostride[vec];
    for (int k = vec; k < g->nk - 1; k++) {
        g->kshape[k] = g->kshape[k + 1];
        g->kstride[k] = g->kstride[k + 1];
        g->ostride[k] = g->ostride[k + 1];
    }
    g->kshape[g->nk - 1] = s0;
    g->kstride[g->nk - 1] = s1;
    g->ostride[g->nk - 1] = s2;
    g->column = true;
}

/* a (shape, astrides) reduced over the dims in mask into an output with ostrides (same
   rank, size 1 on reduced dims). K == 0 (an empty output) leaves nothing to do. */
static inline void mt_reduce_geom_make(mt_reduce_geom *g, int ndim, const int64_t *shape,
                                       const int64_t *astrides, const int64_t *ostrides,
                                       uint32_t mask) {
    int64_t rs[MT_MAX_DIMS], rsh[MT_MAX_DIMS];
    int nr = 0;
    memset(g, 0, sizeof *g);
    g->K = g->R = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t n = shape[d], s = astrides[d], os = ostrides[d];
        if (mask & (1u << d)) {
            g->R *= n;
            if (n != 1) rsh[nr] = n, rs[nr++] = s;
            continue;
        }
        g->K *= n;
        if (n == 1) continue;
        int k = g->nk;
        if (k > 0 && g->kstride[k - 1] == s * n && g->ostride[k - 1] == os * n) {
            g->kshape[k - 1] *= n; /* nests in the previous kept dim */
            g->kstride[k - 1] = s;
            g->ostride[k - 1] = os;
            continue;
        }
        g->kshape[k] = n;
        g->kstride[k] = s;
        g->ostride[k] = os;
        g->nk++;
    }
    mt_reduce_geom_sort(nr, rs, rsh);
    for (int i = 0; i < nr; i++) {
        if (g->nr > 0 && g->rstride[g->nr - 1] == rs[i] * rsh[i]) {
            g->rshape[g->nr - 1] *= rsh[i];
            g->rstride[g->nr - 1] = rs[i];
            continue;
        }
        g->rshape[g->nr] = rsh[i];
        g->rstride[g->nr++] = rs[i];
    }
    if (g->nr == 0) { /* nothing to reduce: one run of one element */
        g->rshape[0] = g->rstride[0] = 1;
        g->nr = 1;
    }
    mt_reduce_geom_column(g);
    if (g->nk == 0) { /* one output */
        g->kshape[0] = 1;
        g->kstride[0] = g->ostride[0] = 0;
        g->nk = 1;
    }
}
#endif

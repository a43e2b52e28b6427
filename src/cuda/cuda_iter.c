/* Tensors to the plain data that kernels take: one operand (mt_cuda_array), or same-shape
   operands walked together (mt_cuda_iter, dims coalesced like the CPU iterator so that a
   kernel's per-element index arithmetic covers as few dims as possible). */
#include <string.h>
#include "cuda_impl.h"

void mt_cuda_array_of(const mt_tensor *t, mt_cuda_array *out) {
    memset(out, 0, sizeof *out);
    if (!t) return;
    out->data = (char *)mt_tensor_data(t);
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    out->numel = t->numel;
    for (int d = 0; d < t->ndim; d++) {
        out->shape[d] = t->shape[d];
        out->strides[d] = t->strides[d];
    }
}

/* The dims of the walk, outermost first: operand 0's (the output's) memory order, its dims by
   decreasing |stride| (ties keep the logical order), size-1 dims left out. A channels-last
   output is then walked N, H, W, C, so operands in its layout are one dense run and the
   output's stores are coalesced whatever the inputs' layouts (the CPU iterator walks NHWC
   outputs in that order too). On the H200 the logical NCHW walk of channels-last tensors made
   every elementwise op of a channels-last ResNet-50 take the strided kernel with uncoalesced
   accesses (20 ms of its 116 ms step). */
static int walk_order(const mt_tensor *t0, int *order) {
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 1) continue;
        int64_t s = t0->strides[d] < 0 ? -t0->strides[d] : t0->strides[d];
        int j = nd++;
        for (; j > 0; j--) { /* insertion: stable, at most MT_MAX_DIMS entries */
            int64_t sp = t0->strides[order[j - 1]];
            if ((sp < 0 ? -sp : sp) >= s) break;
            order[j] = order[j - 1];
        }
        order[j] = d;
    }
    return nd;
}

void mt_cuda_iter_init(mt_cuda_iter *it, int nops, const mt_tensor *const *ts) {
    const mt_tensor *t0 = ts[0];
    memset(it, 0, sizeof *it);
    it->nops = nops;
    it->numel = t0->numel;
    it->contiguous = true;
    for (int k = 0; k < nops; k++) {
        it->data[k] = (char *)mt_tensor_data(ts[k]);
        it->dtype[k] = ts[k]->dtype;
        it->contiguous = it->contiguous && mt_is_contiguous(ts[k]);
    }
    if (it->contiguous) {
        it->ndim = 1;
        it->shape[0] = t0->numel;
        for (int k = 0; k < nops; k++) it->strides[k][0] = 1;
        return;
    }
    /* in the walk's order, merge a dim into the previous kept one when every operand allows */
    int order[MT_MAX_DIMS];
    int walk = walk_order(t0, order), nd = 0;
    for (int j = 0; j < walk; j++) {
        int d = order[j];
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++)
            merge = it->strides[k][nd - 1] == ts[k]->strides[d] * t0->shape[d];
        if (merge) {
            it->shape[nd - 1] *= t0->shape[d];
            for (int k = 0; k < nops; k++) it->strides[k][nd - 1] = ts[k]->strides[d];
            continue;
        }
        it->shape[nd] = t0->shape[d];
        for (int k = 0; k < nops; k++) it->strides[k][nd] = ts[k]->strides[d];
        nd++;
    }
    if (nd == 0) { /* a single element */
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = 1;
        nd = 1;
    }
    it->ndim = nd;
    /* every operand one dense run in the same order (channels-last alike, say): element i of
       each is data + i * element size, the vectorised kernels' case */
    bool dense = nd == 1;
    for (int k = 0; k < nops && dense; k++) dense = it->strides[k][0] == 1;
    it->contiguous = dense;
}

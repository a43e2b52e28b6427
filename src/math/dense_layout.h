/* Dense layouts, written once for the tensor layer (src/tensor/memory_format.c) and the CUDA
   multi-tensor kernels' host code, which sees plain shape and stride arrays. */
#ifndef MT_MATH_DENSE_LAYOUT_H
#define MT_MATH_DENSE_LAYOUT_H
#include <stdbool.h>
#include <stdint.h>
#include "hd.h"

/* torch's is_non_overlapping_and_dense: the dims of size > 1, ordered by stride, step as a
   dense row-major block of some permutation of them (strides positive), so the elements fill
   numel consecutive slots from element 0. Any row-major or channels-last tensor is. */
MT_HD bool mt_dims_dense(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t stride[16], size[16]; /* ndim <= MT_MAX_DIMS */
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) return true;
        if (shape[d] == 1) continue;
        int k = nd++; /* insertion by stride */
        for (; k > 0 && stride[k - 1] > strides[d]; k--) {
            stride[k] = stride[k - 1];
            size[k] = size[k - 1];
        }
        stride[k] = strides[d];
        size[k] = shape[d];
    }
    int64_t expect = 1;
    for (int k = 0; k < nd; k++) {
        if (stride[k] != expect) return false;
        expect *= size[k];
    }
    return true;
}

/* The same strides on every dim of size > 1 (shapes already equal): element i of one and of
   the other sit at the same memory position. */
MT_HD bool mt_dims_same_strides(int ndim, const int64_t *shape, const int64_t *a,
                                const int64_t *b) {
    for (int d = 0; d < ndim; d++)
        if (shape[d] > 1 && a[d] != b[d]) return false;
    return true;
}
#endif

/* The pooling launchers (pool.cu), called by pool_cuda.c: plain data only, as kernels.h. */
#ifndef MT_CUDA_POOL_KERNELS_H
#define MT_CUDA_POOL_KERNELS_H
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One 2-d pooling: x [N, C, H, W] and y [N, C, OH, OW] of one floating dtype, any strides
   (elements). Forward reads x and writes y; backward reads gy (y's geometry, strides ys) and
   x (max only) and writes every element of gx (x's geometry, strides gxs). */
typedef struct {
    const char *x, *gy;
    char *y, *gx;
    mt_dtype dt;
    bool adaptive, max, count_include_pad;
    int64_t kernel[2], stride[2], padding[2];
    int64_t N, C, H, W, OH, OW;
    int64_t xs[4], ys[4], gxs[4];
} mt_cuda_pool_args;

int mt_cuda_pool2d(const mt_cuda_ctx *c, const mt_cuda_pool_args *a);
int mt_cuda_pool2d_backward(const mt_cuda_ctx *c, const mt_cuda_pool_args *a);

#ifdef __cplusplus
}
#endif
#endif

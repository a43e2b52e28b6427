// Element access shared by the reduction-shaped kernels (reduce.cu, softmax.cu): any
// floating element widened to the accumulator type, and stores rounded to nearest even with
// src/math/half.h (a double goes through FP32 for F16/BF16, as the CPU does).
#ifndef MT_CUDA_ELEMENT_ACCESS_CUH
#define MT_CUDA_ELEMENT_ACCESS_CUH
#include "cuda_compat.h"
#include "kernels.h"
#include "../math/half.h"

#define MT_DEV  static __device__ __forceinline__
#define MT_FULL 0xffffffffu
#ifdef __CUDACC__
#define MT_UNROLL _Pragma("unroll")
#else
#define MT_UNROLL
#endif

template <typename A> MT_DEV A mt_load(const char *p, mt_dtype dt, int64_t i) {
    switch (dt) {
    case MT_F64:
        return (A)((const double *)p)[i];
    case MT_F16:
        return (A)mt_f16_to_f32(((const uint16_t *)p)[i]);
    case MT_BF16:
        return (A)mt_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return (A)((const float *)p)[i];
    }
}

template <typename A> MT_DEV void mt_store(char *p, mt_dtype dt, int64_t i, A v) {
    switch (dt) {
    case MT_F64:
        ((double *)p)[i] = (double)v;
        break;
    case MT_F16:
        ((uint16_t *)p)[i] = mt_f32_to_f16((float)v);
        break;
    case MT_BF16:
        ((uint16_t *)p)[i] = mt_f32_to_bf16((float)v);
        break;
    default:
        ((float *)p)[i] = (float)v;
        break;
    }
}

static inline bool mt_is_floating(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F64 || dt == MT_F16 || dt == MT_BF16;
}

// The smallest power of two >= n, at most cap (block and warp sizes).
static inline int mt_pow2_at_least(int64_t n, int cap) {
    int p = 1;
    while (p < n && p < cap) p *= 2;
    return p;
}
#endif

/* MT_HD marks a function compiled for the host by the C compiler and for both host and
   device by nvcc, so each formula in src/math is written once for every backend. */
#ifndef MT_MATH_HD_H
#define MT_MATH_HD_H
#ifdef __CUDACC__
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif
#endif

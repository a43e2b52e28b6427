/* MT_HD marks a function compiled for the host by the C compiler and for both host and
   device by nvcc, so each formula in src/math is written once for every backend. */
#ifndef MT_MATH_HD_H
#define MT_MATH_HD_H
#ifdef __CUDACC__
#define MT_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
/* always inlined: a formula left out of line would be compiled for baseline x86-64 and lose
   the FMA and vector instructions of the AVX2/AVX-512 clones that call it */
#define MT_HD static inline __attribute__((always_inline))
#else
#define MT_HD static inline
#endif
#endif

/* MT_HD marks a function compiled for the host by the C compiler and for both host and
   device by nvcc, so each formula in src/math is written once for every backend. */
#ifndef MT_MATH_HD_H
#define MT_MATH_HD_H
#ifdef __CUDACC__
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif

/* MT_HD_FMA marks a formula with explicit FMAs (MT_FMAF in scalar_ops.h) or one that calls
   such a formula. On the host it is always inlined: a copy left out of line is compiled for
   baseline x86-64, where fmaf is a libm call, and the AVX2/AVX-512 clones of the CPU kernels
   (MT_CPU_CLONES) would call it instead of running its FMAs in their vector loops. Only
   these: forcing every MT_HD function inline made other kernels slower (the F16 add 1.3x). */
#if defined(__CUDACC__) || !defined(__GNUC__)
#define MT_HD_FMA MT_HD
#else
#define MT_HD_FMA static inline __attribute__((always_inline))
#endif
#endif

/* What every .cu file includes first. Kernel code is plain CUDA C++ with three rules, so that
   the same source runs on a GPU (nvcc) and on the emulated device (g++ against
   test/cuda_emu/mtemu.h, a fiber per CUDA thread):
   - launch only through MT_LAUNCH (never <<< >>>), then return cudaGetLastError();
   - shared memory only through MT_SHARED (static size) and MT_DYN_SHARED (launch size), which
     the emulator poisons at every block start;
   - device-side API only from this set: threadIdx/blockIdx/blockDim/gridDim, warpSize,
     __syncthreads, __syncwarp, __shfl_sync/_up/_down/_xor_sync, __ballot_sync, __any_sync,
     __all_sync, atomicAdd/atomicCAS/atomicExch/atomicMax/atomicOr, __threadfence, and the
     standard C math functions (expf, logf, sqrtf, fmaf, ...) and src/math formulas. No
     inline PTX, wmma/mma, cp.async, cooperative groups, __ldg or CUDA-only intrinsics. */
#ifndef MT_CUDA_COMPAT_H
#define MT_CUDA_COMPAT_H

#if defined(__CUDACC__)
#include <cuda_runtime.h>
/* MT_LAUNCH(kernel, grid, block, shared_bytes, stream, args...) */
#define MT_LAUNCH(k, grid, block, smem, stream, ...)                                               \
    k<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define MT_SHARED(T, name, n) __shared__ T name[n]
#define MT_DYN_SHARED(T, name)                                                                     \
    extern __shared__ __align__(16) unsigned char mt_dyn_smem_[];                                  \
    T *name = reinterpret_cast<T *>(mt_dyn_smem_)
#elif defined(MT_CUDA_EMU)
#include "mtemu.h" /* defines the same three macros and the device-side API */
#else
#error "cuda_compat.h: compile with nvcc, or define MT_CUDA_EMU for the emulated device"
#endif

#endif

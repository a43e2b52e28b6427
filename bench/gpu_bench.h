/* What the CUDA benchmarks (bench/gemm, bench/op_overhead --device cuda) share: the --device
   argument, the device's name (the emulated device labelled as such, so that its timings are
   never read as GPU figures) and the answer when there is no CUDA device.

   Built in every build: MT_BENCH_CUDART (set by bench/meson.build where the CUDA backend is
   built, real or emulated) adds the CUDA runtime's view of the device; MT_BENCH_EMULATED
   marks the emulated build (test/cuda_emu). */
#ifndef MT_GPU_BENCH_H
#define MT_GPU_BENCH_H
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "mixtape.h"
#ifdef MT_BENCH_CUDART
#include <cuda_runtime_api.h>
#endif

/* The exit status of a CUDA benchmark run without a CUDA device: meson counts it as skipped
   (never passed), and tools/gpu_test.sh records it as a failure on a GPU machine. */
#define MT_GPU_BENCH_NO_DEVICE 77

/* "cuda" or "cuda:N" -> N (0 for "cuda"); -1 for anything else. */
static inline int mt_gpu_bench_parse_device(const char *s) {
    if (strcmp(s, "cuda") == 0) return 0;
    if (strncmp(s, "cuda:", 5) != 0 || !s[5] || strspn(s + 5, "0123456789") != strlen(s + 5))
        return -1;
    return atoi(s + 5);
}

/* True when cuda:index exists; otherwise says so on stderr (prog: no CUDA device ...). */
static inline bool mt_gpu_bench_have_device(const char *prog, int index) {
    if (mt_cuda_available() && index < mt_cuda_device_count()) return true;
    fprintf(stderr, "%s: no CUDA device cuda:%d (%d available%s): nothing measured\n", prog, index,
            mt_cuda_device_count(),
            mt_cuda_available() ? "" : "; this build or machine has no CUDA backend or device");
    return false;
}

static inline bool mt_gpu_bench_emulated(void) {
#ifdef MT_BENCH_EMULATED
    return true;
#else
    return false;
#endif
}

/* The device's name as the CUDA runtime reports it, with the emulated device labelled. */
static inline void mt_gpu_bench_device_name(int index, char *buf, size_t cap) {
    snprintf(buf, cap, "cuda:%d", index);
#ifdef MT_BENCH_CUDART
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess)
        snprintf(buf, cap, "%.200s (cuda:%d, sm_%d%d)", prop.name, index, prop.major, prop.minor);
#endif
    if (mt_gpu_bench_emulated()) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, " [EMULATED: test/cuda_emu, timings are not GPU figures]");
    }
}

#endif

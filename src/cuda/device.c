/* CUDA device discovery, compiled in every build. The library runs on the CPU on machines
   without a GPU or driver: any error from cudaGetDeviceCount (e.g. "insufficient driver")
   means no GPU. Without the CUDA backend in the build (MT_WITH_CUDA), there is no GPU either,
   so no tensor is ever placed on a device we cannot run. */
#include <stdatomic.h>
#include <threads.h>
#include "mixtape.h"
#ifdef MT_HAVE_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

static int device_count = -1;
static once_flag probe_once = ONCE_FLAG_INIT;

static void probe(void) {
    device_count = 0;
#ifdef MT_HAVE_CUDA_RUNTIME
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
        device_count = n;
    else
        (void)cudaGetLastError(); /* clear the sticky runtime error */
#endif
}

int mt_cuda_runtime_device_count(void) {
    call_once(&probe_once, probe);
    return device_count;
}

bool mt_cuda_available(void) {
#ifdef MT_WITH_CUDA
    return mt_cuda_runtime_device_count() > 0;
#else
    return false;
#endif
}

int mt_cuda_device_count(void) {
    return mt_cuda_available() ? mt_cuda_runtime_device_count() : 0;
}

static atomic_bool allow_tf32;

void mt_cuda_set_allow_tf32(bool on) {
    atomic_store_explicit(&allow_tf32, on, memory_order_relaxed);
}

bool mt_cuda_allow_tf32(void) {
    return atomic_load_explicit(&allow_tf32, memory_order_relaxed);
}

// The emulated device's internal interface, shared by its parts: the fiber runtime
// (mtemu_runtime.cpp), the fake CUDA runtime (fake_cudart.cpp) and the fake cuBLAS
// (fake_cublas.cpp). Not for kernel code (that sees mtemu.h) nor for the library.
#ifndef MTEMU_INTERNAL_H
#define MTEMU_INTERNAL_H
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <cuda_runtime_api.h>

namespace mtemu {

// Queues fn on stream s (0 = the legacy default stream). Work runs in order, only when the
// host synchronises (cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy,
// cudaFree, ...), with device memory readable and writable while it runs.
void enqueue(cudaStream_t s, std::function<void()> fn);

// True when [p, p + n) lies inside one live device allocation (cudaMalloc'd).
bool device_range(const void *p, size_t n);

// True when p points into memory the device may read: a device allocation, or mapped pinned
// host memory (cudaHostAlloc with cudaHostAllocMapped).
bool device_accessible(const void *p, size_t n);

// Records an error as the runtime's sticky "last error" and prints one line to stderr naming
// what failed (the emulator is a test tool: a misuse must be loud). Returns e.
cudaError_t report(cudaError_t e, const char *what);

namespace detail {
struct launch_config; // mtemu.h
// One more kernel launch (mtemu_cudart_counts.h), from the launch that passed its checks (and one more
// in the MTEMU_LAUNCH_CENSUS of its kernel, when asked for).
void count_launch(const launch_config &cfg);
} // namespace detail

} // namespace mtemu

// In a function `(..., const char *fmt, ...)`: declares char what[512] holding fmt's text with
// the variadic arguments, printf-style; the fakes' failure helpers report it.
#define MTEMU_FORMAT(what, fmt)                                                                    \
    char what[512];                                                                                \
    do {                                                                                           \
        va_list mtemu_ap_;                                                                         \
        va_start(mtemu_ap_, fmt);                                                                  \
        std::vsnprintf(what, sizeof what, fmt, mtemu_ap_);                                         \
        va_end(mtemu_ap_);                                                                         \
    } while (0)
#endif

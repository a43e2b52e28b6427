/* The emulated CUDA runtime's call counters (fake_cudart.cpp, mtemu_runtime.cpp), for tests of
   the emulated device: what the library asks of the CUDA runtime per op and per training
   step. On a GPU each of these is host time (a launch costs microseconds, a cudaMalloc or a
   synchronisation far more), so the counts stand in for the host overhead that only a real
   device can time. C and C++. */
#ifndef MTEMU_CUDART_COUNTS_H
#define MTEMU_CUDART_COUNTS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t launches;      /* kernel launches that passed the launch checks */
    int64_t runtime_calls; /* calls of the runtime's entry points, launches not included (a
                              wrapper that calls another entry point, as cudaMallocHost does,
                              counts once) */
    int64_t allocs;        /* cudaMalloc, cudaHostAlloc and cudaMallocHost */
    int64_t frees;         /* cudaFree and cudaFreeHost (which wait for the device) */
    int64_t syncs;         /* calls that wait for the device: cudaStreamSynchronize,
                              cudaDeviceSynchronize, cudaEventSynchronize, cudaFree, cudaFreeHost,
                              and cudaMemcpy unless device to device */
    int64_t copies;        /* cudaMemcpy, cudaMemcpyAsync and cudaMemcpyPeerAsync */
    int64_t memsets;       /* cudaMemsetAsync and cudaMemset */
} mtemu_cudart_counts;

/* The counts since the process started, over every thread. */
void mtemu_cudart_counts_get(mtemu_cudart_counts *out);

/* Between _begin and _end (nested), the calling thread's runtime calls are not counted: the
   emulated build's own checking work (refilling reused device blocks with NaN), which a GPU
   build does not do. */
void mtemu_cudart_uncounted_begin(void);
void mtemu_cudart_uncounted_end(void);

#ifdef __cplusplus
}
#endif
#endif

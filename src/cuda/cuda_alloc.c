/* The CUDA caching allocator. cudaMalloc costs tens of microseconds and cudaFree waits for the
   whole device, so freed blocks are kept in per-size free lists and handed out again. All of
   the library's work on a device runs on that device's one stream, so a block freed by the
   host may be reused at once: any kernel that gets it later is queued after every kernel that
   used it before (stream order), the same argument as PyTorch's allocator for a block's own
   stream. Sizes are rounded to classes so that a training loop's repeated shapes hit exactly:
   512-byte steps below 1 MiB, then 16 steps per power of two (at most 6.25% slack). A failed
   cudaMalloc gives every cached block of the device back and tries once more. */
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "cuda_impl.h"

#define MAX_DEVICES 64
#define SMALL_LIMIT ((size_t)1 << 20)

typedef struct {
    size_t size;
    void **blocks;
    int n, cap;
} size_class;

typedef struct {
    mtx_t lock;
    size_class *classes; /* sorted by size */
    int nclasses, cap;
    int64_t live, peak, cached;
} device_pool;

static device_pool pools[MAX_DEVICES];
static once_flag pools_once = ONCE_FLAG_INIT;

static void pools_init(void) {
    for (int i = 0; i < MAX_DEVICES; i++) mtx_init(&pools[i].lock, mtx_plain);
}

static size_t round_size(size_t n) {
    if (n == 0) n = 1;
    if (n < SMALL_LIMIT) return (n + 511) & ~(size_t)511;
    size_t p = SMALL_LIMIT;
    while (p < n / 2 + 1 && p < ((size_t)1 << 62)) p <<= 1; /* p <= n < 2p */
    size_t step = p / 16;
    return (n + step - 1) / step * step;
}

/* The class of `size`, inserted when `create`; NULL when absent or out of memory. */
static size_class *class_of(device_pool *dp, size_t size, bool create) {
    int lo = 0, hi = dp->nclasses;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (dp->classes[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < dp->nclasses && dp->classes[lo].size == size) return &dp->classes[lo];
    if (!create) return NULL;
    if (dp->nclasses == dp->cap) {
        int cap = dp->cap ? dp->cap * 2 : 32;
        size_class *c = mt_heap_realloc(dp->classes, (size_t)cap * sizeof *c);
        if (!c) return NULL;
        dp->classes = c;
        dp->cap = cap;
    }
    memmove(&dp->classes[lo + 1], &dp->classes[lo],
            (size_t)(dp->nclasses - lo) * sizeof *dp->classes);
    dp->classes[lo] = (size_class){.size = size};
    dp->nclasses++;
    return &dp->classes[lo];
}

/* Gives every cached block of the device back. cudaFree waits for the device, which is what
   makes it safe for blocks that queued kernels still use. Called with the lock held. */
static void release_cached(device_pool *dp) {
    for (int i = 0; i < dp->nclasses; i++) {
        size_class *c = &dp->classes[i];
        for (int k = 0; k < c->n; k++) cudaFree(c->blocks[k]);
        dp->cached -= (int64_t)c->size * c->n;
        c->n = 0;
    }
}

static void account(device_pool *dp, int64_t delta) {
    dp->live += delta;
    if (dp->live > dp->peak) dp->peak = dp->live;
    mt_mem_account_device(delta);
}

/* Makes `device` the calling thread's current one, which cudaMalloc and the default stream
   act on (a cache hit needs no switch; the contexts set the device again before their next
   call). False, with the runtime's error cleared, when it cannot. */
static bool make_current(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return true;
    if (cudaSetDevice(device) == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
}

static void *device_malloc(int device, size_t size) {
    void *p = NULL;
    if (!make_current(device)) return NULL;
    if (cudaMalloc(&p, size) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

#if defined(MT_CUDA_EMU)
#include "mtemu_cudart_counts.h"
/* On the emulated device a block handed out again is refilled with 0xFF (NaN in every float
   format, like the emulator's fresh cudaMalloc blocks), so a kernel that reads an output
   before writing it (an accumulation into memory nobody zeroed) fails the same way every
   time instead of reading whatever the block's last tensor left there. Queued on the
   device's queue, it runs after every kernel that used the block before it was freed. */
static void poison_reused(int device, void *p, size_t size) {
    mtemu_cudart_uncounted_begin(); /* not part of what a GPU build asks of the runtime */
    if (make_current(device) && cudaMemsetAsync(p, 0xFF, size, NULL) != cudaSuccess)
        (void)cudaGetLastError();
    mtemu_cudart_uncounted_end();
}
#endif

void *mt_cuda_alloc(int device, size_t nbytes) {
    if (mt_alloc_injected_failure()) return NULL;
    size_t limit = mt_alloc_limit();
    if ((limit && nbytes > limit) || device < 0 || device >= MAX_DEVICES) return NULL;
    call_once(&pools_once, pools_init);
    device_pool *dp = &pools[device];
    size_t size = round_size(nbytes);
    void *p = NULL;
    mtx_lock(&dp->lock);
    size_class *c = class_of(dp, size, false);
    if (c && c->n > 0) {
        p = c->blocks[--c->n];
        dp->cached -= (int64_t)size;
#if defined(MT_CUDA_EMU)
        poison_reused(device, p, size);
#endif
    } else {
        p = device_malloc(device, size);
        if (!p) {
            release_cached(dp);
            p = device_malloc(device, size);
        }
    }
    if (p) account(dp, (int64_t)size);
    mtx_unlock(&dp->lock);
    return p;
}

void mt_cuda_free(int device, void *p, size_t nbytes) {
    if (!p) return;
    device_pool *dp = &pools[device];
    size_t size = round_size(nbytes);
    mtx_lock(&dp->lock);
    account(dp, -(int64_t)size);
    size_class *c = class_of(dp, size, true);
    if (c && c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 4;
        void **b = mt_heap_realloc(c->blocks, (size_t)cap * sizeof *b);
        if (b) {
            c->blocks = b;
            c->cap = cap;
        }
    }
    if (c && c->n < c->cap) {
        c->blocks[c->n++] = p;
        dp->cached += (int64_t)size;
    } else {
        cudaFree(p); /* no memory for the free list itself: give the block back */
    }
    mtx_unlock(&dp->lock);
}

int mt_cuda_memory_stats(int device, mt_memory_stats *out) {
    call_once(&pools_once, pools_init);
    device_pool *dp = &pools[device];
    mtx_lock(&dp->lock);
    *out = (mt_memory_stats){dp->live, dp->peak, dp->cached};
    mtx_unlock(&dp->lock);
    return 0;
}

void mt_cuda_memory_peak_reset(int device) {
    call_once(&pools_once, pools_init);
    device_pool *dp = &pools[device];
    mtx_lock(&dp->lock);
    dp->peak = dp->live;
    mtx_unlock(&dp->lock);
}

int mt_cuda_empty_cache(int device) {
    call_once(&pools_once, pools_init);
    device_pool *dp = &pools[device];
    mtx_lock(&dp->lock);
    release_cached(dp);
    mtx_unlock(&dp->lock);
    return 0;
}

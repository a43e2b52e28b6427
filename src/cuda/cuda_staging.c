/* Uploads through a ring of pinned staging blocks. cudaMemcpyAsync from pageable host memory
   first waits for the stream to drain (CUDA's documented behaviour), which would put a hidden
   host sync into every training step that uploads its batch. Instead the host copies the
   data into a free pinned block (a memcpy), queues the DMA from it, and records an event; a
   block is reused once its event has completed. When every block is still in flight, the
   upload waits for the oldest one (counted in mt_host_sync_count), so any number of uploads
   per step works. Larger uploads than a block may grow to go straight from pageable memory. */
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "cuda_impl.h"

#define STAGING_SLOTS 4
#define STAGING_MAX   ((size_t)64 << 20) /* per block */
#define STAGING_ROUND ((size_t)1 << 20)

typedef struct {
    void *host; /* pinned */
    size_t cap;
    cudaEvent_t done; /* recorded after the copy that reads the block */
    bool in_flight;
} staging_slot;

struct mt_cuda_staging {
    mtx_t lock; /* one ring per device, shared by the threads that upload to it */
    staging_slot slots[STAGING_SLOTS];
    int next;
};

mt_cuda_staging *mt_cuda_staging_new(void) {
    mt_cuda_staging *s = mt_heap_calloc(1, sizeof *s);
    if (s && mtx_init(&s->lock, mtx_plain) != thrd_success) {
        free(s);
        return NULL;
    }
    return s;
}

void mt_cuda_staging_free(mt_cuda_staging *s) {
    if (!s) return;
    for (int i = 0; i < STAGING_SLOTS; i++) {
        staging_slot *b = &s->slots[i];
        if (b->in_flight) cudaEventSynchronize(b->done);
        if (b->done) cudaEventDestroy(b->done);
        if (b->host) cudaFreeHost(b->host);
    }
    mtx_destroy(&s->lock);
    free(s);
}

/* Makes the block free and at least n bytes; false when it cannot (then the caller copies
   from pageable memory). */
static bool slot_ready(const char *op, staging_slot *b, size_t n) {
    if (b->in_flight) {
        if (cudaEventQuery(b->done) != cudaSuccess) {
            (void)cudaGetLastError(); /* cudaErrorNotReady is no error */
            mt_host_sync_counted();
            if (mt_cuda_check(op, cudaEventSynchronize(b->done)) < 0) return false;
        }
        b->in_flight = false;
    }
    if (!b->done && cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        b->done = NULL;
        return false;
    }
    if (b->cap >= n) return true;
    if (b->host) cudaFreeHost(b->host);
    b->host = NULL;
    b->cap = 0;
    size_t cap = (n + STAGING_ROUND - 1) / STAGING_ROUND * STAGING_ROUND;
    if (cudaHostAlloc(&b->host, cap, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of pinned memory: not an error, a slower path */
        b->host = NULL;
        return false;
    }
    b->cap = cap;
    return true;
}

int mt_cuda_upload_bytes(const char *op, mt_cuda_device_ctx *c, void *dst, const void *src,
                         size_t n) {
    if (n == 0) return 0;
    mt_cuda_staging *s = c->staging;
    if (s && n <= STAGING_MAX) {
        mtx_lock(&s->lock);
        staging_slot *b = &s->slots[s->next];
        s->next = (s->next + 1) % STAGING_SLOTS;
        int rc = 0;
        bool staged = slot_ready(op, b, n);
        if (staged) {
            memcpy(b->host, src, n);
            rc = mt_cuda_check(op,
                               cudaMemcpyAsync(dst, b->host, n, cudaMemcpyHostToDevice, c->stream));
            if (!rc) rc = mt_cuda_check(op, cudaEventRecord(b->done, c->stream));
            b->in_flight = rc == 0;
        }
        mtx_unlock(&s->lock);
        if (staged || rc) return rc;
    }
    return mt_cuda_check(op, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
}

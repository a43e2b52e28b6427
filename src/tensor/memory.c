/* Host memory with live/peak accounting, and the live-tensor counter. Every block handed out
   counts, kernel temporaries included, so the peak is the honest high-water mark. Large blocks are
   recycled through a small size-keyed cache so that a training loop does not pay page faults
   for every activation (the CPU analogue of the CUDA caching allocator). */
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <threads.h>
#include "tensor_impl.h"

/* Live bytes are kept per side, the host's and the devices' together, and summed when read,
   so that an allocation or a free costs one atomic add (two counters, each updated on every
   host block, made the accounting half the time of a tiny op). The peak over every device is
   raised by allocations only, from the side's new total plus the other side's live bytes:
   of two concurrent allocations on the two sides, at least one sees the other's add (both
   are sequentially consistent), so the peak of the sum is never missed. */
static atomic_int_fast64_t host_live, host_peak, device_live, peak_bytes, live_tensors;
static atomic_size_t alloc_limit;
/* mt_debug_fail_nth_alloc: the number of allocation requests until the one that fails
   (1: the next); 0 or less: none pending */
static atomic_int_fast64_t fail_countdown;

static void raise_peak(atomic_int_fast64_t *peak, int64_t now) {
    int64_t p = atomic_load(peak);
    while (now > p && !atomic_compare_exchange_weak(peak, &p, now)) {
    }
}

void mt_mem_account_device(int64_t delta) {
    int64_t now = atomic_fetch_add(&device_live, delta) + delta;
    if (delta > 0) raise_peak(&peak_bytes, now + atomic_load(&host_live));
}

void mt_mem_account(int64_t delta) {
    int64_t now = atomic_fetch_add(&host_live, delta) + delta;
    if (delta > 0) {
        raise_peak(&host_peak, now);
        raise_peak(&peak_bytes, now + atomic_load(&device_live));
    }
}

size_t mt_alloc_limit(void) {
    return atomic_load_explicit(&alloc_limit, memory_order_relaxed);
}

void mt_host_memory_stats(mt_memory_stats *out) {
    out->live_bytes = atomic_load(&host_live);
    out->peak_bytes = atomic_load(&host_peak);
    out->cached_bytes = mt_cached_bytes();
}

void mt_host_peak_reset(void) {
    atomic_store(&host_peak, atomic_load(&host_live));
}
void mt_tensor_count(int delta) {
    atomic_fetch_add(&live_tensors, delta);
}

int64_t mt_live_tensors(void) {
    return atomic_load(&live_tensors);
}
int64_t mt_live_bytes(void) {
    return atomic_load(&host_live) + atomic_load(&device_live);
}
int64_t mt_peak_bytes(void) {
    return atomic_load(&peak_bytes);
}
void mt_peak_bytes_reset(void) {
    atomic_store(&peak_bytes, mt_live_bytes());
}
void mt_debug_set_alloc_limit(size_t bytes) {
    atomic_store(&alloc_limit, bytes);
}

bool mt_debug_fail_nth_alloc(int64_t n) {
    return atomic_exchange(&fail_countdown, n > 0 ? n : 0) > 0;
}

bool mt_alloc_injected_failure(void) {
    /* one relaxed load when nothing is pending; of two threads that race past it, only the
       one that takes the countdown from 1 to 0 fails */
    if (atomic_load_explicit(&fail_countdown, memory_order_relaxed) <= 0) return false;
    return atomic_fetch_sub(&fail_countdown, 1) == 1;
}

void *mt_heap_alloc(size_t nbytes) {
    return mt_alloc_injected_failure() ? NULL : malloc(nbytes);
}
void *mt_heap_calloc(size_t n, size_t size) {
    return mt_alloc_injected_failure() ? NULL : calloc(n, size);
}
void *mt_heap_realloc(void *p, size_t nbytes) {
    return mt_alloc_injected_failure() ? NULL : realloc(p, nbytes);
}
char *mt_heap_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = mt_heap_alloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* --- block cache: blocks of at least CACHE_MIN bytes are kept on free, up to CACHE_MAX
   bytes in all, and handed out again for a request of the same rounded size. */
#define CACHE_MIN   (64u << 10)
#define CACHE_MAX   ((size_t)512 << 20)
#define CACHE_SLOTS 64
typedef struct {
    void *p;
    size_t size;
} cached_block;
static cached_block cache[CACHE_SLOTS];
static size_t cache_bytes;
static mtx_t cache_lock;
static once_flag cache_once = ONCE_FLAG_INIT;
static void cache_init(void) {
    mtx_init(&cache_lock, mtx_plain);
}

/* Under AddressSanitizer every block goes back to the allocator so use-after-free is seen. */
#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ENABLED 0
#else
#define CACHE_ENABLED 1
#endif

static size_t round_size(size_t n) {
    if (n < CACHE_MIN) return (n + 63) & ~(size_t)63;
    return (n + 4095) & ~(size_t)4095;
}

/* RAM + swap: a block larger than that can never be backed, so it fails here, the same way
   under any overcommit policy or sanitizer allocator (which may abort instead of returning
   NULL). Computed once; a benign race writes the same value. */
static atomic_size_t host_capacity;
static size_t capacity(void) {
    size_t cap = atomic_load_explicit(&host_capacity, memory_order_relaxed);
    if (!cap) {
        struct sysinfo si;
        cap = (size_t)1 << 46; /* no machine has this; also avoids size overflow */
        if (sysinfo(&si) == 0 && si.mem_unit > 0) {
            size_t total = ((size_t)si.totalram + (size_t)si.totalswap) * si.mem_unit;
            if (total > 0 && total < cap) cap = total;
        }
        atomic_store_explicit(&host_capacity, cap, memory_order_relaxed);
    }
    return cap;
}

/* Blocks under CACHE_MIN come from malloc (thread-cached by glibc, so a tiny op's output
   costs a few nanoseconds) and are aligned here: aligned_alloc would split and free a padded
   chunk on every call, which costs more than the op. The distance back to the malloc'd
   pointer (16..64) sits in the byte before the block. */
static void *small_alloc(size_t size) {
    unsigned char *raw = malloc(size + 64);
    if (!raw) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + 64) & ~(uintptr_t)63);
    p[-1] = (unsigned char)(p - raw);
    return p;
}
static void small_free(void *p) {
    unsigned char *q = p;
    free(q - q[-1]);
}

/* Tiny blocks (up to TINY_MAX bytes, 64-byte classes) are recycled through per-thread free
   lists, so a tiny op's output costs a list pop rather than a malloc/free pair. Bounded per
   class, drained when the thread exits, off under AddressSanitizer like the block cache. */
#define TINY_MAX  1024
#define TINY_KEEP 32 /* blocks kept per class and thread */
typedef struct tiny_block {
    struct tiny_block *next;
} tiny_block;
typedef struct {
    tiny_block *head[TINY_MAX / 64];
    int n[TINY_MAX / 64];
    bool registered; /* the thread-exit destructor knows this thread's lists */
} tiny_lists;
static _Thread_local tiny_lists tiny;
static tss_t tiny_key;
static bool tiny_key_ok;
static once_flag tiny_once = ONCE_FLAG_INIT;

static void tiny_drain(void *arg) {
    tiny_lists *l = arg;
    for (int c = 0; c < TINY_MAX / 64; c++) {
        while (l->head[c]) {
            tiny_block *b = l->head[c];
            l->head[c] = b->next;
            small_free(b);
        }
        l->n[c] = 0;
    }
}
static void tiny_init(void) {
    tiny_key_ok = tss_create(&tiny_key, tiny_drain) == thrd_success;
}

static void *tiny_alloc(size_t size) {
    int c = (int)(size / 64) - 1;
    tiny_block *b = tiny.head[c];
    if (!b) return small_alloc(size);
    tiny.head[c] = b->next;
    tiny.n[c]--;
    return b;
}

static void tiny_free(void *p, size_t size) {
    int c = (int)(size / 64) - 1;
    if (tiny.n[c] < TINY_KEEP) {
        if (!tiny.registered) {
            call_once(&tiny_once, tiny_init);
            tiny.registered = tiny_key_ok && tss_set(tiny_key, &tiny) == thrd_success;
        }
        if (tiny.registered) {
            tiny_block *b = p;
            b->next = tiny.head[c];
            tiny.head[c] = b;
            tiny.n[c]++;
            return;
        }
    }
    small_free(p);
}

/* Frees every block the large-block cache holds. */
static void cache_release(void) {
    if (!CACHE_ENABLED) return;
    call_once(&cache_once, cache_init);
    mtx_lock(&cache_lock);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        free(cache[i].p);
        cache[i].p = NULL;
    }
    cache_bytes = 0;
    mtx_unlock(&cache_lock);
}

void mt_empty_cache(void) {
    cache_release();
    tiny_drain(&tiny);
}

int64_t mt_cached_bytes(void) {
    if (!CACHE_ENABLED) return 0;
    call_once(&cache_once, cache_init);
    mtx_lock(&cache_lock);
    int64_t n = (int64_t)cache_bytes;
    mtx_unlock(&cache_lock);
    return n;
}

void *mt_host_alloc(size_t nbytes) {
    if (mt_alloc_injected_failure()) return NULL;
    size_t limit = atomic_load_explicit(&alloc_limit, memory_order_relaxed);
    if (limit && nbytes > limit) return NULL;
    if (nbytes > capacity()) return NULL;
    size_t size = round_size(nbytes ? nbytes : 1);
    if (CACHE_ENABLED && size >= CACHE_MIN) {
        call_once(&cache_once, cache_init);
        mtx_lock(&cache_lock);
        for (int i = 0; i < CACHE_SLOTS; i++) {
            if (cache[i].p && cache[i].size == size) {
                void *p = cache[i].p;
                cache[i].p = NULL;
                cache_bytes -= size;
                mtx_unlock(&cache_lock);
                mt_mem_account((int64_t)nbytes);
                return p;
            }
        }
        mtx_unlock(&cache_lock);
    }
    void *p = CACHE_ENABLED && size <= TINY_MAX ? tiny_alloc(size)
              : size < CACHE_MIN                ? small_alloc(size)
                                                : aligned_alloc(64, size);
    if (!p && size >= CACHE_MIN && mt_cached_bytes() > 0) {
        /* the cache must never be the reason an allocation fails: give it back, retry */
        cache_release();
        p = aligned_alloc(64, size);
    }
    if (p) mt_mem_account((int64_t)nbytes);
    return p;
}

void mt_host_free(void *p, size_t nbytes) {
    if (!p) return;
    mt_mem_account(-(int64_t)nbytes);
    size_t size = round_size(nbytes ? nbytes : 1);
    if (CACHE_ENABLED && size >= CACHE_MIN) {
        call_once(&cache_once, cache_init);
        mtx_lock(&cache_lock);
        if (cache_bytes + size <= CACHE_MAX) {
            for (int i = 0; i < CACHE_SLOTS; i++) {
                if (!cache[i].p) {
                    cache[i] = (cached_block){p, size};
                    cache_bytes += size;
                    mtx_unlock(&cache_lock);
                    return;
                }
            }
        }
        mtx_unlock(&cache_lock);
    }
    if (CACHE_ENABLED && size <= TINY_MAX)
        tiny_free(p, size);
    else if (size < CACHE_MIN)
        small_free(p);
    else
        free(p);
}

/* The global Philox generator: a seed and a counter offset. Each draw reserves a counter
   range, so results do not depend on thread count or backend. */
#include <threads.h>
#include "tensor_impl.h"

static uint64_t rng_seed = 0x5eed5eedULL;
static uint64_t rng_offset;
static mtx_t rng_lock;
static once_flag rng_once = ONCE_FLAG_INIT;
static void rng_init(void) {
    mtx_init(&rng_lock, mtx_plain);
}

void mt_manual_seed(uint64_t seed) {
    call_once(&rng_once, rng_init);
    mtx_lock(&rng_lock);
    rng_seed = seed;
    rng_offset = 0;
    mtx_unlock(&rng_lock);
}

void mt_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset) {
    call_once(&rng_once, rng_init);
    mtx_lock(&rng_lock);
    *seed = rng_seed;
    *offset = rng_offset;
    rng_offset += (n + 3) / 4; /* one Philox block gives four numbers */
    mtx_unlock(&rng_lock);
}

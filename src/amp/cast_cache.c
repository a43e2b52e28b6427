/* The autocast cast cache: inside a region, the low-precision copy of an FP32 leaf that
   requires grad (a parameter) is made once and reused by every op of the region; the cache
   empties when the outermost region ends. Entries remember the source's version, so an
   in-place update of the parameter (an optimizer step inside the region) is seen. */
#include <stdlib.h>
#include "../autograd/node.h"
#include "autocast.h"

typedef struct {
    mt_tensor *src;  /* strong: keeps the key alive so its address is not reused */
    mt_tensor *cast; /* strong */
    uint64_t version;
} cache_entry;

static _Thread_local cache_entry *entries;
static _Thread_local int n_entries, cap_entries;
static _Thread_local int64_t hits, misses;

static bool cacheable(const mt_tensor *t) {
    return t->dtype == MT_F32 && t->requires_grad && !t->grad_fn && mt_grad_mode();
}

mt_tensor *mt_autocast_cast(mt_tensor *t, mt_dtype dt) {
    if (!mt_autocast_active() || !cacheable(t) || (dt != MT_F16 && dt != MT_BF16))
        return mt_cast(t, dt);
    for (int i = 0; i < n_entries; i++) {
        cache_entry *e = &entries[i];
        if (e->src == t && e->cast->dtype == dt) {
            if (e->version == mt_tensor_version(t)) {
                hits++;
                return mt_tensor_ref(e->cast);
            }
            mt_tensor *fresh = mt_cast(t, dt); /* parameter changed in place: recast */
            if (!fresh) return NULL;
            mt_tensor_unref(e->cast);
            e->cast = mt_tensor_ref(fresh);
            e->version = mt_tensor_version(t);
            misses++;
            return fresh;
        }
    }
    /* room first: a cast left out of the cache would be a second cast node for the same
       parameter, whose gradients then sum in F32 instead of F16 (other bits than a run
       that had the room); without room the call fails, having changed nothing */
    if (n_entries == cap_entries) {
        int cap = cap_entries ? cap_entries * 2 : 16;
        cache_entry *ne = mt_heap_realloc(entries, (size_t)cap * sizeof *ne);
        if (!ne) {
            mt_error_set(MT_ERR_OOM, "autocast: out of memory for the cast cache");
            return NULL;
        }
        entries = ne;
        cap_entries = cap;
    }
    mt_tensor *c = mt_cast(t, dt);
    if (!c) return NULL;
    misses++;
    entries[n_entries++] = (cache_entry){mt_tensor_ref(t), mt_tensor_ref(c), mt_tensor_version(t)};
    return c;
}

void mt_cast_cache_clear(void) {
    for (int i = 0; i < n_entries; i++) {
        mt_tensor_unref(entries[i].cast);
        mt_tensor_unref(entries[i].src);
    }
    free(entries);
    entries = NULL;
    n_entries = cap_entries = 0;
}

int mt_amp_cast_cache_size(void) {
    return n_entries;
}
int64_t mt_amp_cast_cache_hits(void) {
    return hits;
}

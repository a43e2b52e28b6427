/* The per-device cuDNN state: the handle, made on the first convolution of the device and
   bound to the device's one stream (so cuDNN's kernels queue in program order with ours),
   and the cache of chosen convolution algorithms. One lock for every device: it is held only
   for handle creation and cache look-ups, host work far shorter than a convolution. */
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "cudnn_impl.h"

typedef struct {
    mt_cudnn_conv_key key;
    mt_cudnn_conv_algo algo;
} algo_entry;

struct mt_cudnn_state {
    cudnnHandle_t handle;
    algo_entry *entries; /* a network has tens of distinct convolutions: a linear scan */
    int n, cap;
};

static mtx_t state_lock;
static once_flag state_once = ONCE_FLAG_INIT;

static void state_lock_init(void) {
    mtx_init(&state_lock, mtx_plain);
}

void mt_cudnn_state_free(mt_cudnn_state *s) {
    if (!s) return;
    if (s->handle) mt_cudnn_load("teardown", 0)->destroy(s->handle);
    free(s->entries);
    free(s);
}

static mt_cudnn_state *state_create(const char *op, mt_cuda_device_ctx *c) {
    const mt_cudnn_api *api = mt_cudnn_load(op, c->device);
    if (!api) return NULL;
    mt_cudnn_state *s = mt_heap_calloc(1, sizeof *s);
    if (!s) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory for the cuDNN state of cuda:%d", op, c->device);
        return NULL;
    }
    int rc = mt_cudnn_check(op, "cudnnCreate", api->create(&s->handle));
    if (rc) s->handle = NULL;
    if (!rc) rc = mt_cudnn_check(op, "cudnnSetStream", api->set_stream(s->handle, c->stream));
    if (rc) {
        mt_cudnn_state_free(s);
        return NULL;
    }
    return s;
}

cudnnHandle_t mt_cudnn_handle(const char *op, mt_cuda_device_ctx *c) {
    call_once(&state_once, state_lock_init);
    mtx_lock(&state_lock);
    if (!c->dnn) c->dnn = state_create(op, c);
    cudnnHandle_t h = c->dnn ? c->dnn->handle : NULL;
    mtx_unlock(&state_lock);
    return h;
}

bool mt_cudnn_algo_lookup(mt_cuda_device_ctx *c, const mt_cudnn_conv_key *key,
                          mt_cudnn_conv_algo *out) {
    call_once(&state_once, state_lock_init);
    bool found = false;
    mtx_lock(&state_lock);
    mt_cudnn_state *s = c->dnn;
    for (int i = 0; s && i < s->n && !found; i++)
        if (memcmp(&s->entries[i].key, key, sizeof *key) == 0) {
            *out = s->entries[i].algo;
            found = true;
        }
    mtx_unlock(&state_lock);
    return found;
}

void mt_cudnn_algo_store(mt_cuda_device_ctx *c, const mt_cudnn_conv_key *key,
                         const mt_cudnn_conv_algo *a) {
    call_once(&state_once, state_lock_init);
    mtx_lock(&state_lock);
    mt_cudnn_state *s = c->dnn;
    if (s && s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        algo_entry *e = mt_heap_realloc(s->entries, (size_t)cap * sizeof *e);
        if (e) {
            s->entries = e;
            s->cap = cap;
        }
    }
    if (s && s->n < s->cap) s->entries[s->n++] = (algo_entry){*key, *a};
    mtx_unlock(&state_lock);
}

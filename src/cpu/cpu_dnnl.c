/* oneDNN engine, stream, primitive cache and argument binding (see cpu_dnnl.h).
   The cache is per thread: a primitive is never destroyed while another thread runs it, and
   lookups take no lock. Creating a primitive descriptor (choosing an implementation) costs
   tens of microseconds to milliseconds, more than a small convolution. */
#include "cpu_dnnl.h"
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#define CACHE_SLOTS 64

/* A slot holds a primitive, or (prim NULL, none true) the answer that oneDNN has no
   implementation for the key, so that a caller with a fallback asks oneDNN once. */
typedef struct {
    size_t nbytes;
    unsigned char *key; /* malloc'd */
    dnnl_primitive_t prim;
    bool none;
} cache_slot;

/* Two caches, so that the reorders an op runs never evict the op's own primitive while the
   op holds it. */
typedef struct {
    cache_slot slot[CACHE_SLOTS];
    int next;
} prim_cache;
static _Thread_local prim_cache op_cache, reorder_cache;
static _Thread_local dnnl_stream_t stream;

/* A thread's caches and stream are destroyed when the thread exits (a thread-specific key
   whose destructor runs then), so worker threads that ran ops leak nothing. */
static tss_t thread_key;
static bool thread_key_ok;
static once_flag thread_key_once = ONCE_FLAG_INIT;
static _Thread_local bool thread_registered;

static void cache_clear(prim_cache *c) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (c->slot[i].prim) dnnl_primitive_destroy(c->slot[i].prim);
        free(c->slot[i].key);
        c->slot[i] = (cache_slot){0};
    }
    c->next = 0;
}

static void thread_exit(void *unused) {
    (void)unused;
    cache_clear(&op_cache);
    cache_clear(&reorder_cache);
    if (stream) dnnl_stream_destroy(stream);
    stream = NULL;
}

static void thread_key_init(void) {
    thread_key_ok = tss_create(&thread_key, thread_exit) == thrd_success;
}

static void thread_register(void) {
    if (thread_registered) return;
    call_once(&thread_key_once, thread_key_init);
    thread_registered = thread_key_ok && tss_set(thread_key, &thread_key) == thrd_success;
}
static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_success;
static once_flag engine_once = ONCE_FLAG_INIT;

int mt_dnnl_check(const char *op, dnnl_status_t st, const char *what) {
    if (st == dnnl_success) return 0;
    if (st == dnnl_out_of_memory)
        return mt_error_set(MT_ERR_OOM, "%s: oneDNN ran out of memory (%s)", op, what);
    if (st == dnnl_unimplemented)
        return mt_error_set(MT_ERR_UNSUPPORTED, "%s: oneDNN has no implementation for %s", op,
                            what);
    return mt_error_set(MT_ERR_INTERNAL, "%s: oneDNN failed in %s (status %d)", op, what, (int)st);
}

static void engine_init(void) {
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

dnnl_engine_t mt_dnnl_engine(const char *op) {
    call_once(&engine_once, engine_init);
    if (mt_dnnl_check(op, engine_status, "creating the CPU engine")) return NULL;
    return engine;
}

static dnnl_stream_t thread_stream(const char *op) {
    dnnl_engine_t e = mt_dnnl_engine(op);
    if (!e) return NULL;
    if (!stream && mt_dnnl_check(op, dnnl_stream_create(&stream, e, dnnl_stream_default_flags),
                                 "creating a stream"))
        return NULL;
    thread_register();
    return stream;
}

static dnnl_primitive_t cache_get(prim_cache *c, const void *key, size_t nbytes) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cache_slot *s = &c->slot[i];
        if (s->prim && s->nbytes == nbytes && memcmp(s->key, key, nbytes) == 0) return s->prim;
    }
    return NULL;
}

/* Stores prim (or, when NULL, the answer "no implementation") under the key copy. */
static void cache_store(prim_cache *c, unsigned char *copy, size_t nbytes, dnnl_primitive_t prim) {
    thread_register();
    cache_slot *s = &c->slot[c->next]; /* round robin: the oldest entry goes */
    c->next = (c->next + 1) % CACHE_SLOTS;
    if (s->prim) dnnl_primitive_destroy(s->prim);
    free(s->key);
    *s = (cache_slot){nbytes, copy, prim, prim == NULL};
}

static dnnl_primitive_t cache_put(prim_cache *c, const char *op, const void *key, size_t nbytes,
                                  dnnl_primitive_desc_t pd) {
    dnnl_primitive_t prim = NULL;
    int rc = mt_dnnl_check(op, dnnl_primitive_create(&prim, pd), "creating a primitive");
    dnnl_primitive_desc_destroy(pd);
    if (rc) return NULL;
    unsigned char *copy = mt_heap_alloc(nbytes);
    if (!copy) {
        dnnl_primitive_destroy(prim);
        mt_error_set(MT_ERR_OOM, "%s: out of memory for the primitive cache", op);
        return NULL;
    }
    memcpy(copy, key, nbytes);
    cache_store(c, copy, nbytes, prim);
    return prim;
}

dnnl_primitive_t mt_dnnl_cache_get(const void *key, size_t nbytes) {
    return cache_get(&op_cache, key, nbytes);
}

dnnl_primitive_t mt_dnnl_cache_put(const char *op, const void *key, size_t nbytes,
                                   dnnl_primitive_desc_t pd) {
    return cache_put(&op_cache, op, key, nbytes, pd);
}

bool mt_dnnl_cache_none(const void *key, size_t nbytes) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
        cache_slot *s = &op_cache.slot[i];
        if (s->none && s->nbytes == nbytes && memcmp(s->key, key, nbytes) == 0) return true;
    }
    return false;
}

void mt_dnnl_cache_put_none(const void *key, size_t nbytes) {
    unsigned char *copy = mt_heap_alloc(nbytes);
    if (!copy) return; /* only a memo: the next call asks oneDNN again */
    memcpy(copy, key, nbytes);
    cache_store(&op_cache, copy, nbytes, NULL);
}

const dnnl_memory_desc_t *mt_dnnl_query_md(dnnl_primitive_t prim, dnnl_query_t what) {
    const_dnnl_primitive_desc_t pd = NULL;
    if (dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success) return NULL;
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

dnnl_data_type_t mt_dnnl_dtype(mt_dtype dt) {
    return dt == MT_BF16 ? dnnl_bf16 : dt == MT_F16 ? dnnl_f16 : dnnl_f32;
}

int mt_dnnl_md_of(const char *op, dnnl_memory_desc_t *md, const mt_tensor *t, int64_t groups) {
    dnnl_dims_t dims, strides;
    int nd = t->ndim;
    if (groups > 1) {
        dims[0] = groups;
        strides[0] = t->strides[0] * (t->shape[0] / groups);
        dims[1] = t->shape[0] / groups;
        strides[1] = t->strides[0];
        for (int i = 1; i < nd; i++) {
            dims[i + 1] = t->shape[i];
            strides[i + 1] = t->strides[i];
        }
        nd++;
    } else {
        for (int i = 0; i < nd; i++) {
            dims[i] = t->shape[i];
            strides[i] = t->strides[i];
        }
    }
    return mt_dnnl_check(
        op, dnnl_memory_desc_init_by_strides(md, nd, dims, mt_dnnl_dtype(t->dtype), strides),
        "describing a tensor");
}

int mt_dnnl_md_plain(const char *op, dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                     dnnl_data_type_t dt, bool channels_last) {
    dnnl_dims_t d;
    for (int i = 0; i < ndim; i++) d[i] = dims[i];
    dnnl_format_tag_t tag = ndim == 1 ? dnnl_a : channels_last ? dnnl_acdb : dnnl_abcd;
    return mt_dnnl_check(op, dnnl_memory_desc_init_by_tag(md, ndim, d, dt, tag),
                         "describing a tensor");
}

static int reorder(const char *op, dnnl_memory_t from, dnnl_memory_t to) {
    const dnnl_memory_desc_t *src = NULL, *dst = NULL;
    dnnl_memory_get_memory_desc(from, &src);
    dnnl_memory_get_memory_desc(to, &dst);
    dnnl_engine_t e = mt_dnnl_engine(op);
    dnnl_stream_t s = thread_stream(op);
    if (!e || !s) return mt_last_status();
    unsigned char key[2 * sizeof(dnnl_memory_desc_t) + 1] = {'r'};
    memcpy(key + 1, src, sizeof *src);
    memcpy(key + 1 + sizeof *src, dst, sizeof *dst);
    dnnl_primitive_t prim = cache_get(&reorder_cache, key, sizeof key);
    if (!prim) {
        dnnl_primitive_desc_t pd = NULL;
        if (mt_dnnl_check(op, dnnl_reorder_primitive_desc_create(&pd, src, e, dst, e, NULL),
                          "a layout reorder"))
            return mt_last_status();
        prim = cache_put(&reorder_cache, op, key, sizeof key, pd);
        if (!prim) return mt_last_status();
    }
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    int rc = mt_dnnl_check(op, dnnl_primitive_execute(prim, s, 2, args), "a layout reorder");
    if (rc == 0) rc = mt_dnnl_check(op, dnnl_stream_wait(s), "a layout reorder");
    return rc;
}

int mt_dnnl_bind(const char *op, mt_dnnl_arg *a, const mt_tensor *t, const dnnl_memory_desc_t *user,
                 const dnnl_memory_desc_t *want, bool output) {
    *a = (mt_dnnl_arg){.output = output};
    dnnl_engine_t e = mt_dnnl_engine(op);
    if (!e) return mt_last_status();
    if (mt_dnnl_check(op, dnnl_memory_create(&a->user, user, e, mt_tensor_data(t)),
                      "wrapping a tensor"))
        return mt_last_status();
    if (dnnl_memory_desc_equal(user, want)) {
        a->mem = a->user;
        a->user = NULL;
        return 0;
    }
    a->nbytes = dnnl_memory_desc_get_size(want);
    a->scratch = mt_host_alloc(a->nbytes ? a->nbytes : 1);
    if (!a->scratch)
        return mt_error_set(MT_ERR_OOM, "%s: out of memory for a %zu-byte layout buffer", op,
                            a->nbytes);
    if (mt_dnnl_check(op, dnnl_memory_create(&a->mem, want, e, a->scratch), "a layout buffer"))
        return mt_last_status();
    return output ? 0 : reorder(op, a->user, a->mem);
}

int mt_dnnl_execute(const char *op, dnnl_primitive_t prim, int n, const int *kinds,
                    mt_dnnl_arg *args) {
    dnnl_stream_t s = thread_stream(op);
    if (!s) return mt_last_status();
    dnnl_exec_arg_t ea[8];
    for (int i = 0; i < n; i++) ea[i] = (dnnl_exec_arg_t){kinds[i], args[i].mem};
    int rc = mt_dnnl_check(op, dnnl_primitive_execute(prim, s, n, ea), "running a primitive");
    if (rc == 0) rc = mt_dnnl_check(op, dnnl_stream_wait(s), "running a primitive");
    for (int i = 0; rc == 0 && i < n; i++)
        if (args[i].output && args[i].user) rc = reorder(op, args[i].mem, args[i].user);
    return rc;
}

void mt_dnnl_release(mt_dnnl_arg *args, int n) {
    for (int i = 0; i < n; i++) {
        if (args[i].mem) dnnl_memory_destroy(args[i].mem);
        if (args[i].user) dnnl_memory_destroy(args[i].user);
        if (args[i].scratch) mt_host_free(args[i].scratch, args[i].nbytes ? args[i].nbytes : 1);
        args[i] = (mt_dnnl_arg){0};
    }
}

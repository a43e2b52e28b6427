/* Tensor headers, storage, reference counts and layout helpers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "../autograd/node.h"
#include "backend.h"
#include "tensor_impl.h"

static const size_t dtype_sizes[MT_DTYPE_COUNT] = {
    [MT_F32] = 4, [MT_F16] = 2, [MT_BF16] = 2, [MT_F64] = 8,
    [MT_I64] = 8, [MT_I32] = 4, [MT_BOOL] = 1,
};
static const char *const dtype_names[MT_DTYPE_COUNT] = {
    [MT_F32] = "f32", [MT_F16] = "f16", [MT_BF16] = "bf16", [MT_F64] = "f64",
    [MT_I64] = "i64", [MT_I32] = "i32", [MT_BOOL] = "bool",
};

size_t mt_dtype_size(mt_dtype dt) {
    return (unsigned)dt < MT_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}
const char *mt_dtype_name(mt_dtype dt) {
    return (unsigned)dt < MT_DTYPE_COUNT ? dtype_names[dt] : "invalid-dtype";
}
bool mt_dtype_is_floating(mt_dtype dt) {
    return dt == MT_F32 || dt == MT_F16 || dt == MT_BF16 || dt == MT_F64;
}

void mt_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        if (i > 0) s *= shape[i] > 0 ? shape[i] : 1; /* the outermost size makes no stride */
    }
}

int mt_shape_check_strides(const char *op, int ndim, const int64_t *shape) {
    int64_t span = 1;
    for (int i = ndim - 1; i > 0; i--)
        if (shape[i] > 0 && __builtin_mul_overflow(span, shape[i], &span)) {
            char buf[MT_SHAPE_BUF];
            return mt_error_set(MT_ERR_SHAPE, "%s: shape %s: its strides overflow int64", op,
                                mt_dims_str(ndim, shape, buf, sizeof buf));
        }
    return 0;
}

int64_t mt_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int mt_shape_numel_checked(const char *op, int ndim, const int64_t *shape, int64_t *numel) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(n, shape[i], &n)) {
            char buf[MT_SHAPE_BUF];
            return mt_error_set(MT_ERR_SHAPE, "%s: shape %s has more than 2^63 elements", op,
                                mt_dims_str(ndim, shape, buf, sizeof buf));
        }
    }
    *numel = n;
    return 0;
}

bool mt_same_shape(const mt_tensor *a, const mt_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* Per-thread pools of tensor and storage headers: every op allocates and frees one of each,
   and popping a free list costs less than malloc/free. Bounded, drained at thread exit, and
   off under AddressSanitizer so that a use after free stays visible. */
#if defined(__SANITIZE_ADDRESS__)
#define POOL_MAX 0
#else
#define POOL_MAX 256
#endif
enum { POOL_TENSOR, POOL_STORAGE, POOL_KINDS };
typedef struct pool_obj {
    struct pool_obj *next;
} pool_obj;
typedef struct {
    pool_obj *head[POOL_KINDS];
    int n[POOL_KINDS];
    bool registered; /* the thread-exit destructor knows this thread's pools */
} header_pools;
static _Thread_local header_pools pools;
static tss_t pools_key;
static bool pools_key_ok;
static once_flag pools_once = ONCE_FLAG_INIT;

static void pools_drain(void *arg) {
    header_pools *hp = arg;
    for (int k = 0; k < POOL_KINDS; k++) {
        while (hp->head[k]) {
            pool_obj *o = hp->head[k];
            hp->head[k] = o->next;
            free(o);
        }
        hp->n[k] = 0;
    }
}
static void pools_init(void) {
    pools_key_ok = tss_create(&pools_key, pools_drain) == thrd_success;
}

static void *pool_get(int k, size_t size) {
    if (mt_alloc_injected_failure()) return NULL;
    pool_obj *o = pools.head[k];
    if (!o) return malloc(size);
    pools.head[k] = o->next;
    pools.n[k]--;
    return o;
}

static void pool_put(int k, void *p) {
    if (pools.n[k] < POOL_MAX) {
        if (!pools.registered) {
            call_once(&pools_once, pools_init);
            pools.registered = pools_key_ok && tss_set(pools_key, &pools) == thrd_success;
        }
        if (pools.registered) {
            pool_obj *o = p;
            o->next = pools.head[k];
            pools.head[k] = o;
            pools.n[k]++;
            return;
        }
    }
    free(p);
}

static mt_storage *storage_new(const char *op, size_t nbytes, mt_device dev) {
    const mt_backend *be = mt_backend_for(op, dev);
    if (!be) return NULL;
    mt_storage *s = pool_get(POOL_STORAGE, sizeof *s);
    if (!s) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory allocating a storage header", op);
        return NULL;
    }
    s->data = be->alloc(dev.index, nbytes);
    if (!s->data) {
        pool_put(POOL_STORAGE, s);
        mt_error_set(MT_ERR_OOM, "%s: out of memory allocating %zu bytes on %s", op, nbytes,
                     dev.type == MT_DEVICE_CUDA ? "cuda" : "cpu");
        return NULL;
    }
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->device = dev;
    s->nbytes = nbytes;
    return s;
}

static void storage_release(mt_storage *s) {
    if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    const mt_backend *be = mt_backend_get(s->device);
    be->free(s->device.index, s->data, s->nbytes);
    pool_put(POOL_STORAGE, s);
}

/* A zeroed header from the pool. (Not calloc: glibc's calloc bypasses malloc's per-thread
   cache, and GCC turns malloc + memset into calloc unless it cannot see where p came from.) */
static inline void *header_alloc(size_t n) {
    void *p = pool_get(POOL_TENSOR, n);
    if (p) {
#if defined(__GNUC__)
        __asm__("" : "+r"(p));
#endif
        memset(p, 0, n);
    }
    return p;
}

/* A few dims, copied element by element: GCC expands a memcpy of ndim * 8 bytes inline as
   `rep movsq`, whose start-up cost was 40% of creating a tensor (perf, a tiny add). */
static inline void copy_dims(int64_t *dst, const int64_t *src, int ndim) {
    for (int i = 0; i < ndim; i++) {
#if defined(__GNUC__)
        __asm__("" ::: "memory"); /* keeps the loop a loop, not a memcpy again */
#endif
        dst[i] = src[i];
    }
}

static mt_tensor *header_new(const char *op) {
    mt_tensor *t = header_alloc(sizeof *t);
    if (!t) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory allocating a tensor header", op);
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    t->made_by = op;
    mt_tensor_count(1);
    return t;
}

int mt_tensor_overwrite(mt_tensor *dst, const mt_tensor *src) {
    int rc = mt_backend_get(dst->device)->copy(dst, src);
    if (rc == 0) mt_tensor_bump_version(dst);
    return rc;
}

mt_tensor *mt_tensor_new(const char *op, int ndim, const int64_t *shape, mt_dtype dt,
                         mt_device dev) {
    if (ndim < 0 || ndim > MT_MAX_DIMS) {
        mt_error_set(MT_ERR_INVALID, "%s: %d dims requested, at most %d are supported", op, ndim,
                     MT_MAX_DIMS);
        return NULL;
    }
    if ((unsigned)dt >= MT_DTYPE_COUNT) {
        mt_error_set(MT_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
        return NULL;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char buf[MT_SHAPE_BUF];
            mt_error_set(MT_ERR_SHAPE, "%s: negative size in shape %s", op,
                         mt_dims_str(ndim, shape, buf, sizeof buf));
            return NULL;
        }
        if (__builtin_mul_overflow(numel, shape[i], &numel) || numel > INT64_MAX / 16) {
            char buf[MT_SHAPE_BUF];
            mt_error_set(MT_ERR_OOM, "%s: shape %s is too large to allocate", op,
                         mt_dims_str(ndim, shape, buf, sizeof buf));
            return NULL;
        }
    }
    if (numel == 0 && mt_shape_check_strides(op, ndim, shape) < 0) return NULL;
    mt_tensor *t = header_new(op);
    if (!t) return NULL;
    t->storage = storage_new(op, (size_t)numel * mt_dtype_size(dt), dev);
    if (!t->storage) {
        pool_put(POOL_TENSOR, t);
        mt_tensor_count(-1);
        return NULL;
    }
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    copy_dims(t->shape, shape, ndim);
    mt_contiguous_strides(ndim, shape, t->strides);
    t->numel = numel;
    return t;
}

/* The layout and storage fields of a zeroed header; the storage is not retained. */
static void header_set(mt_tensor *h, mt_storage *st, mt_dtype dt, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t offset) {
    h->dtype = dt;
    h->device = st->device;
    h->ndim = ndim;
    copy_dims(h->shape, shape, ndim);
    if (!strides)
        mt_contiguous_strides(ndim, shape, h->strides);
    else
        copy_dims(h->strides, strides, ndim);
    h->offset = offset;
    h->numel = mt_shape_numel(ndim, shape);
    h->storage = st;
}

void mt_tensor_header_init(mt_tensor *h, mt_storage *st, mt_dtype dt, int ndim,
                           const int64_t *shape, const int64_t *strides, int64_t offset) {
    memset(h, 0, sizeof *h);
    header_set(h, st, dt, ndim, shape, strides, offset);
}

mt_tensor *mt_tensor_view_of(const mt_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset) {
    mt_tensor *v = header_new("view");
    if (!v) return NULL;
    const char *entry = mt_api_entry(); /* a view is named by the public call that made it */
    if (entry) v->made_by = entry;
    header_set(v, t->storage, t->dtype, ndim, shape, strides, offset);
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    return v;
}

mt_tensor *mt_tensor_alias(const mt_tensor *t) {
    return mt_tensor_view_of(t, t->ndim, t->shape, t->strides, t->offset);
}

/* ---- references: the library's own, then the user's (checked) */

/* Checked mode keeps dead headers (never reused, marked with this count) so a second release
   is recognised instead of corrupting the pool. */
#define DEAD_REFCOUNT (-(1 << 29))

static mtx_t dead_lock;
static mt_tensor *dead_headers;

mt_tensor *mt_tensor_ref(mt_tensor *t) {
    if (t) atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

void mt_tensor_unref(mt_tensor *t) {
    if (!t) return;
    if (atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1) return;
    if (t->grad_fn) mt_node_release(t->grad_fn);
    if (t->grad) mt_tensor_unref(t->grad);
    if (t->hooks) mt_grad_hooks_free(t->hooks);
    mt_tensor_unref(t->view_base);
    storage_release(t->storage);
    mt_tensor_count(-1);
    if (mt_ownership_checked()) {
        t->grad_fn = NULL;
        t->storage = NULL;
        atomic_store(&t->refcount, DEAD_REFCOUNT);
        mtx_lock(&dead_lock); /* kept reachable (through .grad), so leak checkers stay quiet */
        t->grad = dead_headers;
        dead_headers = t;
        mtx_unlock(&dead_lock);
        return;
    }
    pool_put(POOL_TENSOR, t);
}

static once_flag checked_once = ONCE_FLAG_INIT;
static bool checked_mode;
static void checked_init(void) {
    const char *v = getenv("MT_CHECK_OWNERSHIP");
    checked_mode =
        v && *v && strcmp(v, "0") != 0 && mtx_init(&dead_lock, mtx_plain) == thrd_success;
}
bool mt_ownership_checked(void) {
    call_once(&checked_once, checked_init);
    return checked_mode;
}

static atomic_llong ownership_reports;
int64_t mt_debug_ownership_reports(void) {
    return atomic_load(&ownership_reports);
}

/* Checked mode only: the report goes to stderr (the user asked for it) and is counted; a
   misuse that would corrupt memory is also an MT_ERR_STATE error of the thread. */
void mt_ownership_report(bool is_error, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&ownership_reports, 1);
    fprintf(stderr, "mixtape: ownership: %s\n", msg);
    if (is_error) mt_error_set(MT_ERR_STATE, "%s", msg);
}

static bool checked_alive(const char *fn, const mt_tensor *t) {
    if (atomic_load_explicit(&t->refcount, memory_order_relaxed) > 0) return true;
    mt_ownership_report(true, "%s: the tensor (made by %s) was already released", fn,
                        t->made_by ? t->made_by : "?");
    return false;
}

mt_tensor *mt_retain(mt_tensor *t) {
    if (!t) return NULL;
    if (mt_api_entry()) return mt_tensor_ref(t); /* the library's own, inside a public call */
    if (mt_ownership_checked()) {
        if (!checked_alive("mt_retain", t)) return t;
        atomic_fetch_add_explicit(&t->user_refs, 1, memory_order_relaxed);
    }
    return mt_tensor_ref(t);
}

/* A release of a tensor that an open scope holds (the documented misuse that used to free
   it twice) takes the scope's reference: the scope will not release it again. */
void mt_release(mt_tensor *t) {
    if (!t) return;
    if (mt_api_entry()) { /* the library's own, inside a public call */
        mt_tensor_unref(t);
        return;
    }
    if (mt_ownership_checked()) {
        if (!checked_alive("mt_release", t)) return;
        int u = atomic_load_explicit(&t->user_refs, memory_order_relaxed);
        if (u > 0) {
            atomic_fetch_sub_explicit(&t->user_refs, 1, memory_order_relaxed);
            mt_tensor_unref(t);
            return;
        }
    }
    if (atomic_load_explicit(&t->scope_refs, memory_order_relaxed) > 0) mt_scope_untrack(t);
    mt_tensor_unref(t);
}

/* ---- accessors */
mt_dtype mt_dtype_of(const mt_tensor *t) {
    return t ? t->dtype : MT_F32;
}
mt_device mt_device_of(const mt_tensor *t) {
    return t ? t->device : MT_CPU;
}
int mt_ndim(const mt_tensor *t) {
    return t ? t->ndim : -1;
}
int64_t mt_numel(const mt_tensor *t) {
    return t ? t->numel : -1;
}
const int64_t *mt_shape(const mt_tensor *t) {
    return t ? t->shape : NULL;
}
const int64_t *mt_strides(const mt_tensor *t) {
    return t ? t->strides : NULL;
}

int64_t mt_dim(const mt_tensor *t, int i) {
    if (!t) return -1;
    int d = 0; /* set by mt_dim_normalize on success */
    if (mt_dim_normalize("mt_dim", 2, i, t->ndim, &d) < 0) return -1;
    return t->shape[d];
}

bool mt_is_contiguous(const mt_tensor *t) {
    if (!t) return false;
    if (t->numel == 0) return true; /* no element is out of place (torch agrees) */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

void *mt_data_ptr(const mt_tensor *t) {
    if (!t) return NULL;
    if (t->device.type != MT_DEVICE_CPU) {
        mt_error_set(MT_ERR_DEVICE, "mt_data_ptr: tensor is on cuda:%d, not the host",
                     t->device.index);
        return NULL;
    }
    return mt_tensor_data(t);
}

int mt_dim_normalize(const char *op, int arg, int dim, int ndim, int *out) {
    int lo = ndim ? -ndim : -1, hi = ndim ? ndim - 1 : 0;
    if (dim < lo || dim > hi)
        return mt_error_set(
            MT_ERR_INVALID,
            "%s: arg %d: dim %d is out of range for a %d-d tensor (expected %d..%d)", op, arg, dim,
            ndim, lo, hi);
    *out = dim < 0 ? dim + (ndim ? ndim : 1) : dim;
    return 0;
}

int mt_dim_normalize_insert(const char *op, int arg, int dim, int ndim, int *out) {
    if (dim < -(ndim + 1) || dim > ndim)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: dim %d is out of range for a new dim of a %d-d tensor "
                            "(expected %d..%d)",
                            op, arg, dim, ndim, -(ndim + 1), ndim);
    *out = dim < 0 ? dim + ndim + 1 : dim;
    return 0;
}

int mt_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                        int *nout, int64_t *out) {
    if (na == nb) { /* the common case: equal shapes */
        int i = 0;
        while (i < na && sa[i] == sb[i]) i++;
        if (i == na) {
            for (i = 0; i < na; i++) out[i] = sa[i];
            *nout = na;
            return 0;
        }
    }
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t da = i < n - na ? 1 : sa[i - (n - na)];
        int64_t db = i < n - nb ? 1 : sb[i - (n - nb)];
        if (da != db && da != 1 && db != 1) {
            char ba[MT_SHAPE_BUF], bb[MT_SHAPE_BUF];
            return mt_error_set(
                MT_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                mt_dims_str(na, sa, ba, sizeof ba), mt_dims_str(nb, sb, bb, sizeof bb), i,
                (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return 0;
}

mt_tensor *mt_tensor_expand_to(const mt_tensor *t, int ndim, const int64_t *shape) {
    int64_t strides[MT_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        if (i < lead) {
            strides[i] = 0;
        } else {
            int j = i - lead;
            strides[i] = (t->shape[j] == 1 && shape[i] != 1) ? 0 : t->strides[j];
        }
    }
    return mt_tensor_view_of(t, ndim, shape, strides, t->offset);
}

/* The tensor and storage structs and the internal tensor API shared by every room. */
#ifndef MT_TENSOR_IMPL_H
#define MT_TENSOR_IMPL_H
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "mixtape.h"
#include "op_table.h"

struct mt_node;
struct mt_grad_hooks;

/* Refcounted memory block; views share one. The version counter lives here because every
   view of the same memory sees an in-place change (as torch's shared version counter). */
typedef struct mt_storage {
    atomic_int refcount;
    mt_device device;
    size_t nbytes;
    void *data;
    atomic_uint_fast64_t version;
} mt_storage;

struct mt_tensor {
    atomic_int refcount;
    mt_dtype dtype;
    mt_device device;
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    int64_t strides[MT_MAX_DIMS]; /* in elements */
    int64_t offset;               /* in elements */
    int64_t numel;
    mt_storage *storage;
    /* autograd */
    bool requires_grad;      /* leaf flag set by the user, or "has grad_fn" for results */
    struct mt_node *grad_fn; /* strong; NULL for leaves */
    mt_tensor *grad;         /* accumulated gradient of a leaf */
    /* a view made with grad mode off of a tensor that requires grad (or of such a view): it
       shares that tensor's memory without its history, so in place writes to it are refused
       while grad mode is on, as torch refuses them */
    bool nograd_view_of_grad;
    /* the tensor a view without history, made with grad mode on, aliases (strong; the start
       of a chain of such views), as torch's view base: once it requires grad, whenever it
       started to, writes to the view are refused while grad mode is on */
    mt_tensor *view_base;
    /* ownership */
    atomic_int scope_refs;       /* how many of the references are held by open scopes */
    atomic_int user_refs;        /* mt_retain calls by the user not yet released (checked mode) */
    const char *made_by;         /* the op or public call that made the tensor, for reports */
    bool amp_keep_fp32;          /* a norm parameter: mt_amp_decorate leaves it FP32 */
    struct mt_grad_hooks *hooks; /* grad-ready hooks of a leaf (src/autograd/hooks.c) */
};

/* Frees a leaf's hook list (src/autograd/hooks.c); NULL is fine. */
void mt_grad_hooks_free(struct mt_grad_hooks *h);

/* ---- errors (src/tensor/error.c) */
/* Records the first error of the thread (later ones are dropped) and returns status. */
int mt_error_set(mt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes "[2, 3]" into buf; returns buf. */
char *mt_shape_str(const mt_tensor *t, char *buf, size_t cap);
char *mt_dims_str(int ndim, const int64_t *shape, char *buf, size_t cap);
#define MT_SHAPE_BUF 96

/* ---- the API boundary (src/tensor/scope.c)
   Every public function that returns a tensor runs between mt_api_enter() and
   mt_api_exit(): calls from inside the library (depth > 1) return plain owned references,
   and only the outermost call hands its result to the innermost open scope. The outermost
   call's name (the public function the user called, from __func__) prefixes the messages
   of errors raised inside it, so an OOM deep in a cast made by mt_linear reads
   "mt_linear: mt_cast: out of memory". */
#define mt_api_enter() mt_api_enter_at(__func__)
void mt_api_enter_at(const char *entry);
/* The public function the user called (NULL outside the API) and, during a backward, the op
   whose backward formula is running (NULL otherwise). */
const char *mt_api_entry(void);
const char *mt_api_backward_op(void);
/* Set by the autograd engine around each node's backward (NULL to clear). */
void mt_api_set_backward_op(const char *op_name);
mt_tensor *mt_api_exit(mt_tensor *result);
/* User code called back from inside the library (a grad-ready hook) is a caller again: its
   calls are outermost, so their results go to its scopes (or the scope around the backward)
   and their errors name its calls. mt_api_callback_end brings the library's depth and names
   back. */
typedef struct {
    int depth;
    const char *entry, *backward_op;
} mt_api_outer;
mt_api_outer mt_api_callback_begin(void);
void mt_api_callback_end(mt_api_outer outer);
/* Leaves the API without a tensor result (int-returning functions). */
int mt_api_exit_status(int status);
/* Makes room in the open scope for the result of the outermost call now running, so that
   mt_api_exit cannot fail to track it. Ops that change something they cannot take back
   (batch norm's running statistics, the generator's counter) call it before that change:
   otherwise a scope that cannot grow would fail the call after the change. 0, or
   MT_ERR_OOM with the error set. */
int mt_scope_reserve(void);
/* The library's own references: mt_retain/mt_release are the user's, and check what the user
   may get wrong (releasing a reference an open scope holds, double releases in checked
   mode); code inside the library takes and drops references with these. */
mt_tensor *mt_tensor_ref(mt_tensor *t);
void mt_tensor_unref(mt_tensor *t);
/* Takes one reference to t out of the calling thread's open scopes (innermost first); false
   when none holds it. */
bool mt_scope_untrack(mt_tensor *t);
/* MT_CHECK_OWNERSHIP=1 in the environment: ownership misuse is reported (see mixtape.h). */
bool mt_ownership_checked(void);
void mt_ownership_report(bool is_error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- allocation and layout (src/tensor/tensor.c) */
/* A new contiguous tensor; storage uninitialised. NULL with MT_ERR_OOM on failure. */
mt_tensor *mt_tensor_new(const char *op, int ndim, const int64_t *shape, mt_dtype dt,
                         mt_device dev);
/* A new tensor header over t's storage with the given layout (no autograd history). */
mt_tensor *mt_tensor_view_of(const mt_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset);
/* Fills *h as a temporary tensor header for a kernel call, typically on the stack: dtype
   dt, st's device, the given layout (strides NULL: contiguous), no autograd history. It
   holds no reference and is never released, so it must not outlive st (a tensor's storage,
   or a stack mt_storage over a host buffer). */
void mt_tensor_header_init(mt_tensor *h, mt_storage *st, mt_dtype dt, int ndim,
                           const int64_t *shape, const int64_t *strides, int64_t offset);
/* dst = src through dst's backend (one shape, one device, any strides, converting dtype;
   allocates nothing), then dst's version moves on: a write into a tensor someone may have
   saved for backward. 0 or the backend's error. */
int mt_tensor_overwrite(mt_tensor *dst, const mt_tensor *src);
/* Same storage and layout as t, no history: used to save outputs without cycles. */
mt_tensor *mt_tensor_alias(const mt_tensor *t);
void mt_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* 0, or an MT_ERR_SHAPE naming op and the shape when its contiguous strides overflow int64:
   a shape with a 0 size has no elements, but its other sizes still multiply into strides
   (torch: "Stride calculation overflowed"). For shapes of non-negative sizes. */
int mt_shape_check_strides(const char *op, int ndim, const int64_t *shape);
int64_t mt_shape_numel(int ndim, const int64_t *shape);
/* The element count of a shape of non-negative sizes, or an MT_ERR_SHAPE naming op and the
   shape when it does not fit in int64 (every view's numel is computed from its shape). */
int mt_shape_numel_checked(const char *op, int ndim, const int64_t *shape, int64_t *numel);
bool mt_same_shape(const mt_tensor *a, const mt_tensor *b);
static inline void *mt_tensor_data(const mt_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)mt_dtype_size(t->dtype);
}
static inline void mt_tensor_bump_version(mt_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}
static inline uint64_t mt_tensor_version(const mt_tensor *t) {
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}
/* t seen as [outer, n, inner] around dim (the indexing kernels of both backends) */
static inline void mt_split_at_dim(const mt_tensor *t, int dim, int64_t *outer, int64_t *n,
                                   int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < dim; d++) *outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) *inner *= t->shape[d];
    *n = t->ndim ? t->shape[dim] : 1;
}
/* Normalises a possibly negative dim; error naming op and arg when out of range. */
int mt_dim_normalize(const char *op, int arg, int dim, int ndim, int *out);
/* dim as a position for a new dim (mt_unsqueeze, mt_stack): -(ndim + 1)..ndim. */
int mt_dim_normalize_insert(const char *op, int arg, int dim, int ndim, int *out);
/* Broadcast shape of two shapes; error naming op when they do not broadcast. */
int mt_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                        int *nout, int64_t *out);
/* A view of t expanded (stride 0) to the given shape; t must broadcast to it. */
mt_tensor *mt_tensor_expand_to(const mt_tensor *t, int ndim, const int64_t *shape);

/* ---- memory formats of 4-d tensors (src/tensor/memory_format.c) */
/* NHWC strides of the NCHW shape[4]. */
void mt_channels_last_strides(const int64_t *shape, int64_t *strides);
/* Channels-last and not also contiguous: the format an op's output keeps. */
bool mt_prefers_channels_last(const mt_tensor *t);
/* A new 4-d tensor of NCHW shape, NHWC strides when channels_last (else contiguous). */
mt_tensor *mt_tensor_new_format(const char *op, const int64_t *shape, mt_dtype dt, mt_device dev,
                                bool channels_last);

/* torch's non-overlapping-and-dense: the elements fill numel consecutive slots from element
   0, in some dim order (row-major, channels-last, a dense permutation). */
bool mt_is_dense(const mt_tensor *t);
/* Same shape and the same strides on every dim of size > 1: element i of one and of the other
   sit at the same memory position. */
bool mt_same_strides(const mt_tensor *a, const mt_tensor *b);
/* A new tensor of like's shape in dtype dt on dev, with like's strides when like is dense
   (torch's empty_like with preserve_format), else contiguous: parameter-shaped state
   (gradients, masters, moments, casts in place) keeps a channels-last parameter's layout. */
mt_tensor *mt_tensor_new_layout_of(const char *op, const mt_tensor *like, mt_dtype dt,
                                   mt_device dev);

/* A new tensor of the shape: channels-last when it is 4-d and the first of like[0..n) with
   that shape prefers channels-last (elementwise results keep their inputs' format, as
   torch's), else contiguous. */
mt_tensor *mt_tensor_new_like(const char *op, int ndim, const int64_t *shape, mt_dtype dt,
                              mt_device dev, const mt_tensor *const *like, int n);

/* ---- checks used by op entry points (src/tensor/check.c); each sets a message and returns
   a negative status, or 0 */
int mt_check_floating(const char *op, int arg, const mt_tensor *t);
/* A value to fill a tensor of dtype dt with: for i32 and i64, within the dtype's range
   (NaN is not; torch: "value cannot be converted to type int32_t without overflow"); it is
   then truncated toward zero. */
int mt_check_fill_value(const char *op, int arg, mt_dtype dt, double v);
int mt_check_same_device(const char *op, const mt_tensor *a, const mt_tensor *b);
/* A written-to tensor whose elements alias each other (an expanded view) would be updated
   more than once per memory location. */
int mt_check_no_self_overlap(const char *op, int arg, const mt_tensor *t);
/* The wider of two floating dtypes (F64 > F32 > BF16/F16; F16 with BF16 gives F32). */
mt_dtype mt_promote_floating(mt_dtype a, mt_dtype b);

/* ---- host allocation with live/peak accounting (src/tensor/memory.c) */
/* 64-byte aligned; NULL on failure, no error set. Counted in mt_live_bytes/mt_peak_bytes
   (kernel temporaries too); free with the same nbytes. */
void *mt_host_alloc(size_t nbytes);
void mt_host_free(void *p, size_t nbytes);
void mt_mem_account(int64_t delta_bytes);
/* Device allocators count their blocks in the all-device totals (mt_live_bytes/peak). */
void mt_mem_account_device(int64_t delta_bytes);
size_t mt_alloc_limit(void); /* mt_debug_set_alloc_limit's value; 0: none */
/* Whether this allocation request is the one mt_debug_fail_nth_alloc asked to fail. Every
   allocator asks once per request, before any cache is looked at, so the count is the same
   in every build (the caches are off under AddressSanitizer). */
bool mt_alloc_injected_failure(void);
/* Bookkeeping memory (tensor headers' lists, tape nodes, optimizer and scaler records, file
   buffers): malloc, calloc, realloc and strdup that mt_debug_fail_nth_alloc can fail. Freed
   with free(); not counted in mt_live_bytes. */
void *mt_heap_alloc(size_t nbytes);
void *mt_heap_calloc(size_t n, size_t size);
void *mt_heap_realloc(void *p, size_t nbytes);
char *mt_heap_strdup(const char *s);
void mt_host_memory_stats(mt_memory_stats *out);
void mt_host_peak_reset(void);
void mt_tensor_count(int delta);

/* ---- threads (src/cpu) */
int mt_cpu_num_threads(void);

/* ---- RNG state (src/tensor/random.c): reserves `n` counters of the global generator */
void mt_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset);
#endif

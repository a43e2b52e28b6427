/* The line between the host side of the CUDA backend (C11: cuda_*.c) and the kernel
   launchers (CUDA C++ in *.cu, compiled by nvcc, or as host C++ against the emulated device
   with -Dcuda_emu=true). Only plain data crosses it: no mt_tensor, so the .cu files never see
   the C11 atomics of tensor_impl.h. The host side validates, plans (dims coalesced, strides in
   elements) and hands each launcher device pointers; a launcher only enqueues work on
   ctx->stream and returns the cudaError_t of the launch (cudaSuccess = 0). Nothing here
   synchronises or reads device memory on the host. */
#ifndef MT_CUDA_KERNELS_H
#define MT_CUDA_KERNELS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "mixtape.h"
#include "../math/optim_math.h"
#include "../tensor/op_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A deferred device error: the first kernel that finds bad data (a label out of range) fills
   it; the host reads it at the next synchronisation and reports it naming the op. It lives
   in mapped pinned host memory, so reading it after a sync costs no copy. */
typedef struct {
    int code;          /* 0: none; MT_CUDA_FAULT_* */
    int op;            /* mt_op_id of the op whose kernel found it */
    long long a, b, c; /* what the message needs (row or position, value, bound) */
    int dim;           /* the indexed dim (MT_CUDA_FAULT_INDEX_RANGE) */
} mt_cuda_fault;
enum { MT_CUDA_FAULT_NONE = 0, MT_CUDA_FAULT_LABEL_RANGE = 1, MT_CUDA_FAULT_INDEX_RANGE = 2 };

/* Scratch device memory from the caching allocator. Blocks are reused in stream order, so a
   launcher may free its scratch right after enqueuing the kernels that use it. */
typedef struct {
    int device;
    cudaStream_t stream;
    mt_cuda_fault *fault; /* device-visible pointer */
    int sm_count;
    void *(*scratch_alloc)(int device, size_t nbytes); /* NULL when out of memory */
    void (*scratch_free)(int device, void *p, size_t nbytes);
} mt_cuda_ctx;

/* One strided operand. */
typedef struct {
    char *data; /* element 0, offset applied; NULL for an absent operand */
    mt_dtype dtype;
    int ndim;
    int64_t numel;
    int64_t shape[MT_MAX_DIMS];
    int64_t strides[MT_MAX_DIMS]; /* elements */
} mt_cuda_array;

/* Same-shape operands (broadcast inputs expanded with stride 0); operand 0 is the output.
   The host coalesces dims as the CPU iterator does; `contiguous` means every operand is dense
   in row-major order, so element i of each is data + i * element size. */
#define MT_CUDA_ITER_MAX 4
typedef struct {
    int nops, ndim;
    int64_t numel;
    bool contiguous;
    int64_t shape[MT_MAX_DIMS];
    int64_t strides[MT_CUDA_ITER_MAX][MT_MAX_DIMS]; /* elements */
    char *data[MT_CUDA_ITER_MAX];
    mt_dtype dtype[MT_CUDA_ITER_MAX];
} mt_cuda_iter;

/* ---- elementwise (unary, binary: elementwise.cu; copy, fill, where, random, has_nonfinite:
   copy_fill.cu). F16/BF16 load to FP32 registers and store rounded to nearest even with
   src/math/half.h; F64 computes in double; formulas from src/math. */
/* it: {dst, src}; any dtype pair */
int mt_cuda_copy(const mt_cuda_ctx *c, const mt_cuda_iter *it);
/* it: {dst}; value converted to dst's dtype as the CPU fill does */
int mt_cuda_fill(const mt_cuda_ctx *c, const mt_cuda_iter *it, double value);
/* it: {out, a}; unary and tensor-scalar ops (p is the scalar) */
int mt_cuda_unary(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_iter *it, double p);
/* it: {out, a, b}; arithmetic, fused backward ops, and comparisons (out BOOL, a/b any same
   dtype: integers compared exactly) */
int mt_cuda_binary(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_iter *it);
/* it: {out, cond (BOOL), a, b} */
int mt_cuda_where(const mt_cuda_ctx *c, const mt_cuda_iter *it);
/* out contiguous, n elements of a floating dtype; element i = philox draw i */
int mt_cuda_random(const mt_cuda_ctx *c, char *out, mt_dtype dt, int64_t n, bool normal,
                   uint64_t seed, uint64_t offset);
/* it: {t}; stores 1 to *flag (device int, zeroed by the caller) if any element is inf/nan */
int mt_cuda_has_nonfinite(const mt_cuda_ctx *c, const mt_cuda_iter *it, int *flag);

/* ---- reductions, softmax, cross entropy (reduce.cu). FP32 accumulation (F64 for F64),
   deterministic (no float atomics), MAX propagates NaN. */
/* SUM/MEAN/MAX over the dims whose bit is set in mask; out has a's ndim, size 1 in reduced
   dims (keepdim), contiguous. */
int mt_cuda_reduce(const mt_cuda_ctx *c, mt_op_id op, const mt_cuda_array *out,
                   const mt_cuda_array *a, uint32_t mask);
/* out contiguous, same shape as a (any layout) */
int mt_cuda_softmax(const mt_cuda_ctx *c, const mt_cuda_array *out, const mt_cuda_array *a, int dim,
                    bool log);
int mt_cuda_softmax_backward(const mt_cuda_ctx *c, const mt_cuda_array *grad_in,
                             const mt_cuda_array *grad_out, const mt_cuda_array *y, int dim,
                             bool log);
/* loss[N], lse[N] (FP32, or F64 for F64 logits), valid: 0-d, same dtype as loss, receives the
   count of rows whose label != ignore_index. A label outside [0, C) that is not ignore_index
   sets c->fault (MT_CUDA_FAULT_LABEL_RANGE, op MT_OP_CROSS_ENTROPY, a = row, b = label,
   c = C) and that row's loss is NaN. */
int mt_cuda_cross_entropy(const mt_cuda_ctx *c, const mt_cuda_array *loss, const mt_cuda_array *lse,
                          const mt_cuda_array *valid, const mt_cuda_array *logits,
                          const mt_cuda_array *labels, int64_t ignore_index);
/* grad = (softmax(logits) - onehot(label)) * scale[0]; ignored rows 0; scale 0-d FP32 or F64 */
int mt_cuda_cross_entropy_backward(const mt_cuda_ctx *c, const mt_cuda_array *grad,
                                   const mt_cuda_array *logits, const mt_cuda_array *labels,
                                   const mt_cuda_array *lse, const mt_cuda_array *scale,
                                   int64_t ignore_index);
/* out (F32 0-d) = sum over the n tensors of sum(x^2) */
int mt_cuda_sq_norm(const mt_cuda_ctx *c, const mt_cuda_array *ts, int n, const mt_cuda_array *out);

/* ---- mixed precision and optimizers (multi_tensor.cu), multi_tensor_apply style */
/* g *= *inv_scale in place for every tensor (skipped when *inv_scale == 1); *found_inf := 1
   when any element is inf/nan, never cleared. inv_scale, found_inf: device F32 scalars. */
int mt_cuda_unscale(const mt_cuda_ctx *c, const mt_cuda_array *grads, int n, const float *inv_scale,
                    float *found_inf);
typedef struct {
    float *scale, *good_steps, *bad_steps, *skipped_steps; /* device F32 scalars */
    const float *found_inf;
    double growth_factor, backoff_factor, min_scale, max_scale;
    int growth_interval, backoff_after;
} mt_cuda_scale_update_args;
/* one thread: mt_loss_scale_update (src/math/optim_math.h) on the device scalars */
int mt_cuda_scale_update(const mt_cuda_ctx *c, const mt_cuda_scale_update_args *a);
/* The plain-data form of mt_optim_step_args (src/tensor/backend.h): entries whose data is
   NULL are absent. The kernel reads *found_inf on the device and does nothing when set;
   Adam's step_count[i] (one per parameter) is read and advanced on the device for every i
   with stepped[i] (the parameters that had a gradient, empty ones included). */
typedef struct {
    mt_optim_kind kind;
    int n;
    const mt_cuda_array *params, *grads, *masters, *moment1, *moment2; /* arrays of n */
    const float *found_inf;                                            /* NULL: never skip */
    const float *inv_scale;                                            /* NULL: 1 */
    float *step_count;   /* Adam/AdamW: n F32 counts on the device */
    const bool *stepped; /* host array of n: whose count advances */
    double lr, momentum, beta1, beta2, eps, weight_decay;
    bool nesterov;
} mt_cuda_optim_args;
int mt_cuda_optim_step(const mt_cuda_ctx *c, const mt_cuda_optim_args *a);

/* ---- normalisation and dropout (norm.cu); every tensor contiguous, statistics and
   parameters in the accumulation dtype (F32, or F64 when wide) */
typedef struct {
    int64_t rows, D;
    bool wide;
    const char *x, *gy; /* gy: backward only */
    char *y, *gx;       /* y: forward; gx: backward, NULL when not wanted */
    mt_dtype xdt, ydt, gydt, gxdt;
    const void *weight, *bias; /* [D] or NULL */
    void *mean, *rstd;         /* [rows]: written by the forward, read by the backward */
    void *gw, *gb;             /* [D] or NULL */
    double eps;
} mt_cuda_layer_norm_args;
int mt_cuda_layer_norm(const mt_cuda_ctx *c, const mt_cuda_layer_norm_args *a);
int mt_cuda_layer_norm_backward(const mt_cuda_ctx *c, const mt_cuda_layer_norm_args *a);
/* x, y, residual [N, C, S] in xdt (or, nhwc, dense [N, S, C]); weight, bias, running
   buffers, save_* [C] */
typedef struct {
    int64_t N, C, S;
    bool wide, training, relu, nhwc;
    const char *x, *residual; /* residual NULL: none */
    char *y;
    mt_dtype xdt;
    const void *weight, *bias;
    void *running_mean, *running_var, *save_mean, *save_rstd;
    double momentum, eps;
} mt_cuda_batch_norm_args;
int mt_cuda_batch_norm(const mt_cuda_ctx *c, const mt_cuda_batch_norm_args *a);
typedef struct {
    int64_t N, C, S;
    bool wide, training, nhwc; /* nhwc: every activation dense [N, S, C] */
    const char *gy, *x, *y;    /* y: the saved output under relu, else NULL */
    char *gx, *gres;           /* NULL when not wanted */
    mt_dtype gydt, xdt, gxdt, gresdt;
    const void *weight, *save_mean, *save_rstd;
    void *gw, *gb; /* NULL when not wanted */
} mt_cuda_batch_norm_backward_args;
int mt_cuda_batch_norm_backward(const mt_cuda_ctx *c, const mt_cuda_batch_norm_backward_args *a);
/* save_mean = running mean, save_rstd = 1/sqrt(running var + eps), [C] each (eval mode
   where cuDNN normalises: it does not write them) */
int mt_cuda_bn_eval_stats(const mt_cuda_ctx *c, bool wide, int64_t C, const void *rm,
                          const void *rv, double eps, void *save_mean, void *save_rstd);
/* out = x * keep / (1 - p), keep = Philox draw i (of seed, offset) >= p; n contiguous
   elements of dtype dt */
int mt_cuda_dropout(const mt_cuda_ctx *c, char *out, const char *x, mt_dtype dt, int64_t n,
                    double p, uint64_t seed, uint64_t offset);

/* ---- indexing (index.cu); every tensor contiguous. The forward kernels (index_select,
   gather) check every index they read: one outside [0, bound) gives a zero element and sets
   c->fault (MT_CUDA_FAULT_INDEX_RANGE, op, a = position in the index, b = value, c = bound,
   dim), first writer wins. The adjoints skip such an index (it matches no destination). */
/* src and dst seen as [outer, n or k, inner] around the indexed dim; index [k] (I64, device) */
typedef struct {
    const char *src;
    char *dst;
    const int64_t *index;
    int64_t outer, n, k, inner;
    int es; /* element size of src and dst (index_select) */
    mt_dtype sdt, ddt;
    int op, dim; /* named by a fault: MT_OP_INDEX_SELECT or MT_OP_EMBEDDING, the caller's dim */
} mt_cuda_index_args;
int mt_cuda_index_select(const mt_cuda_ctx *c, const mt_cuda_index_args *a); /* dst [o, k, i] */
int mt_cuda_index_add(const mt_cuda_ctx *c, const mt_cuda_index_args *a);    /* dst [o, n, i] */
int mt_cuda_argmax(const mt_cuda_ctx *c, const mt_cuda_index_args *a);       /* dst I64 [o, i] */
/* gather: out (index's shape) from x; scatter_add: out (x_shape, F32/F64) += x (index's
   shape, dtype sdt). numel: of out. */
typedef struct {
    const char *x;
    char *out;
    const int64_t *index;
    int nd, dim, es;
    int user_dim; /* the caller's dim, for a fault (dim is remapped for a 0-d index) */
    int64_t numel;
    int64_t index_shape[MT_MAX_DIMS], index_strides[MT_MAX_DIMS];
    int64_t x_shape[MT_MAX_DIMS], x_strides[MT_MAX_DIMS];
    mt_dtype sdt, ddt;
} mt_cuda_gather_args;
int mt_cuda_gather(const mt_cuda_ctx *c, const mt_cuda_gather_args *a);
int mt_cuda_scatter_add(const mt_cuda_ctx *c, const mt_cuda_gather_args *a);

#ifdef __cplusplus
}
#endif
#endif

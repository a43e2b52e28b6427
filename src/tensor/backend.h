/* The per-device kernel table. Op entry points (src/ops) validate, cast and allocate, then
   call these on already-checked tensors; a backend never calls back up into autograd or amp.
   Kernels return 0 or a negative mt_status (after mt_error_set) for device failures only.
   Elementwise families switch on the op id (from ops.def) once, outside their loops.

   Asynchrony: a device backend may only queue the work (in program order, on the device's
   one stream) and return; every family except download, has_nonfinite and synchronize must
   not wait for the device or read device memory on the host. The device context (stream,
   library handles, fault word) is found from the tensors' device, which every call carries.
   Data errors that only a kernel can see are reported at the next synchronize. A family a
   backend does not have may be left NULL: mt_backend_get fills it with one that answers
   MT_ERR_UNSUPPORTED naming the family and the device. */
#ifndef MT_TENSOR_BACKEND_H
#define MT_TENSOR_BACKEND_H
#include "../math/optim_math.h" /* mt_optim_kind */
#include "tensor_impl.h"

/* One fused multi-tensor optimizer pass. For each i: g = grads[i] (* inv_scale when given);
   the update is computed in FP32 (F64 for F64 params) from masters[i] when non-NULL (FP32
   master of a low-precision param, which then receives the rounded result), else from
   params[i]. Does nothing at all when *found_inf != 0. */
typedef struct {
    mt_optim_kind kind;
    int n;
    mt_tensor *const *params;
    mt_tensor *const *grads;    /* entries may be NULL: that param is skipped */
    mt_tensor *const *masters;  /* NULL, or entries NULL for params without a master */
    mt_tensor *const *moment1;  /* momentum buffer / Adam m (FP32, or F64 for F64 params) */
    mt_tensor *const *moment2;  /* Adam v */
    const mt_tensor *found_inf; /* F32 scalar on the device, or NULL */
    const mt_tensor *inv_scale; /* F32 scalar, or NULL */
    mt_tensor *step_count;      /* F32 [n]: Adam's step per parameter (torch's
                                   state[p]["step"]); entry i advances when grads[i] is
                                   present and the step is not skipped */
    double lr, momentum, beta1, beta2, eps, weight_decay;
    bool nesterov;
} mt_optim_step_args;

/* Dynamic loss scale update, all on the device: reads found_inf, updates scale and the two
   counters (F32 scalars), and counts skipped steps. */
typedef struct {
    mt_tensor *scale, *good_steps, *bad_steps, *skipped_steps;
    const mt_tensor *found_inf;
    double growth_factor, backoff_factor, min_scale, max_scale;
    int growth_interval, backoff_after;
} mt_scale_update_args;

/* What a backend keeps from a batch-norm forward for its backward (cuDNN's reserve space and
   the path chosen): left NULL by most, set only on success. The op hands it to the tape node
   (mt_bn_backward_args.state), or frees it with free_fn when none is recorded. */
typedef struct {
    void *state;
    void (*free_fn)(void *state);
} mt_bn_state;

/* One batch-norm pass (forward of mt_batch_norm and mt_batch_norm_act). x is [N, C, inner...]
   contiguous (or dense channels-last where the backend says batch_norm_nhwc); statistics per
   channel over N and the inner dims, in the accumulation dtype (F32, or F64 for F64 x), as are
   weight, bias and the running buffers. Training: save_mean and save_rstd receive the batch mean
   and 1/sqrt(biased var + eps), and the running buffers (when non-NULL) become (1 - momentum) *
   running + momentum * batch statistic, with the unbiased variance. Eval: the running buffers are
   the statistics and save_* receive them (mean, 1/sqrt(var + eps)). y = act(xhat * weight + bias +
   residual), y and residual in x's dtype and layout; weight, bias and residual may be NULL. */
typedef struct {
    mt_tensor *y, *save_mean, *save_rstd;
    mt_tensor *running_mean, *running_var; /* NULL in training when not tracked */
    const mt_tensor *x, *weight, *bias, *residual;
    bool training, relu;
    double momentum, eps;
    mt_bn_state *state; /* out, see mt_bn_state */
} mt_bn_args;

/* Its backward. y is the saved output (for the relu mask, or NULL without relu); the
   gradients wanted are non-NULL: gx in x's dtype, gres in y's, gw and gb in the accumulation
   dtype. Training: gx = w rstd (gz - mean(gz) - xhat mean(gz xhat)); eval: gx = w rstd gz,
   where gz = gy masked by y > 0 under relu. */
typedef struct {
    mt_tensor *gx, *gw, *gb, *gres;
    const mt_tensor *gy, *x, *y, *weight, *bias, *save_mean, *save_rstd;
    bool training;
    void *state; /* the forward's state (mt_bn_args.state), or NULL */
} mt_bn_backward_args;
/* Geometry of a 2-d convolution in NCHW logical shapes: x [N, C, H, W], w [OC, C / groups,
   KH, KW], y [N, OC, OH, OW] with OH = (H + 2 padding - dilation (KH - 1) - 1) / stride + 1
   (floor), as torch. Every value >= 1 but padding (>= 0). */
typedef struct {
    int64_t stride[2], padding[2], dilation[2], groups;
} mt_conv2d_params;

typedef enum { MT_POOL_MAX, MT_POOL_AVG, MT_POOL_ADAPTIVE_AVG } mt_pool_kind;
/* A 2-d pooling window, torch's semantics: the window of output (oh, ow) starts at
   oh * stride - padding; the output size (ceil_mode included) is decided by the op and is
   y's shape. Average: the divisor counts the window clipped to the padded input
   (count_include_pad) or to the input. Adaptive: windows [floor(o H / OH), ceil((o+1) H / OH)),
   kernel, stride and padding unused. */
typedef struct {
    mt_pool_kind kind;
    int64_t kernel[2], stride[2], padding[2];
    bool count_include_pad;
} mt_pool2d_params;

/* c[M, N] = act(a[M, K] @ b[K, N] + bias[N]): a GEMM whose epilogue adds the bias and applies
   the activation before the one rounding of c. a and b are 2-D with any strides (transposes,
   as for gemm); c contiguous; bias NULL or [N] contiguous; all of one floating dtype. pre,
   when non-NULL (c's shape, contiguous), also receives the pre-activation a @ b + bias (the
   backward of GELU reads it). */
typedef struct {
    mt_tensor *c, *pre;
    const mt_tensor *a, *b, *bias;
    mt_activation act;
} mt_gemm_epilogue_args;

typedef struct mt_backend {
    const char *name;
    void *(*alloc)(int index, size_t nbytes); /* NULL on failure, no error set */
    void (*free)(int index, void *p, size_t nbytes);
    /* Waits for the device's queued work; reports a deferred kernel error (counted in
       mt_host_sync_count when it waits). */
    int (*synchronize)(int index);
    int (*memory_stats)(int index, mt_memory_stats *out);
    void (*memory_peak_reset)(int index);
    int (*empty_cache)(int index);
    /* dst = src, same shape, any strides, converting dtype (F16/BF16 round to nearest even) */
    int (*copy)(mt_tensor *dst, const mt_tensor *src);
    int (*fill)(mt_tensor *dst, double value);
    /* Reads a contiguous host buffer into / out of a tensor of the same dtype. */
    int (*upload)(mt_tensor *dst, const void *src);
    int (*download)(const mt_tensor *src, void *dst); /* dst contiguous */
    /* dst = src between two devices of this backend (dst contiguous, src any layout, one
       dtype), ordered after the work queued on src's device and before later work on both,
       with no host wait. */
    int (*copy_peer)(mt_tensor *dst, const mt_tensor *src);
    /* out = op(a, p): unary and tensor-scalar ops; a has out's shape and dtype */
    int (*unary)(mt_op_id op, mt_tensor *out, const mt_tensor *a, double p);
    /* out = op(a, b): a and b expanded to out's shape, same dtype; out BOOL for comparisons */
    int (*binary)(mt_op_id op, mt_tensor *out, const mt_tensor *a, const mt_tensor *b);
    /* out = cond ? a : b, all expanded to out's shape */
    int (*where)(mt_tensor *out, const mt_tensor *cond, const mt_tensor *a, const mt_tensor *b);
    /* SUM, MEAN or MAX over the dims whose bit is set in mask; out has the keepdim shape
       (size 1 in reduced dims). Accumulates in FP32 (F64 for F64). */
    int (*reduce)(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask);
    /* softmax or log_softmax along dim; out contiguous, a any layout */
    int (*softmax)(mt_tensor *out, const mt_tensor *a, int dim, bool log);
    /* grad_in from grad_out and the forward output y */
    int (*softmax_backward)(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y,
                            int dim, bool log);
    /* c[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * c. a and b may be
       transposed in their last two dims (strides) and broadcast in the batch dims (stride 0);
       c is contiguous. Low precision: FP32 accumulation, output rounded once. */
    int (*gemm)(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta);
    /* Per-row loss of cross entropy: loss[N] (FP32) and the row log-sum-exp as two columns
       lse[N, 2] = (max, log(sum(exp(x - max)))) (FP32; both F64 when the logits are F64, so
       F64 gradchecks hold): kept apart, because their sum rounded at the scale of a large max
       loses the log-sum's digits (loss and gradient then drift), labels I64; rows whose
       label == ignore_index get loss 0. valid (0-d, loss's dtype) receives the count of
       counted rows, on the device. A label outside [0, C) that is not ignore_index is an
       error (MT_ERR_INVALID naming mt_cross_entropy, the row and the label): at once on the
       CPU, at the next synchronize on a device. */
    int (*cross_entropy)(mt_tensor *loss, mt_tensor *lse, mt_tensor *valid, const mt_tensor *logits,
                         const mt_tensor *labels, int64_t ignore_index);
    /* grad_logits = (softmax(logits) - onehot(label)) * scale, from the saved lse; ignored rows
       get zeros. scale is a 0-d FP32 tensor (grad_out / valid; F64 for F64 logits). */
    int (*cross_entropy_backward)(mt_tensor *grad_logits, const mt_tensor *logits,
                                  const mt_tensor *labels, const mt_tensor *lse,
                                  const mt_tensor *scale, int64_t ignore_index);
    /* --- convolution and pooling (NCHW logical shapes). Every 4-d tensor argument is dense
       NCHW (contiguous) or dense NHWC (channels-last) strides, weights included; the output's
       format is the one the kernel computes in, and inputs of the other format are converted.
       One dtype for all (bias included); F16/BF16 accumulate in FP32. */
    /* y = conv2d(x, w) + b (b NULL or [OC]) */
    int (*conv2d)(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                  const mt_conv2d_params *p);
    /* gx = the gradient of conv2d's input, from gy and w */
    int (*conv2d_backward_data)(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                const mt_conv2d_params *p);
    /* gw = the gradient of conv2d's weight, from gy and x (computed in x's format) */
    int (*conv2d_backward_weight)(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                  const mt_conv2d_params *p);
    /* y = pool(x). idx is NULL, or (max pooling on a backend with max_pool_indices, when the
       op will record a tape node) an I32 tensor of y's shape and format that receives each
       window's argmax as the flat offset h * W + w within its input plane: the first maximum
       in row-major window order, a NaN winning (the last NaN), as torch's CPU kernel. */
    int (*pool2d)(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p);
    /* gx (every element written) from gy. Max pooling scatters gy through idx (the forward's,
       x NULL) on a backend with max_pool_indices; elsewhere idx is NULL and the backend finds
       each window's argmax again from x. */
    int (*pool2d_backward)(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                           const mt_tensor *idx, const mt_pool2d_params *p);
    /* Philox draws: element i uses counter offset + i / 4 (src/math/philox.h) */
    int (*random)(mt_tensor *out, bool normal, uint64_t seed, uint64_t offset);
    /* true when any element is inf or nan (waits for the device: debug checks only) */
    int (*has_nonfinite)(const mt_tensor *t, bool *out);
    /* --- multi-tensor kernels for amp and optim */
    /* g *= inv_scale for every tensor, in place; found_inf := 1 if any element of any g is
       inf/nan (it is never cleared here). One pass.
       Allocates nothing: the GradScaler's step runs it after the optimizer has changed the
       parameters, where a failure could not be undone. */
    int (*unscale)(mt_tensor *const *grads, int n, const mt_tensor *inv_scale,
                   mt_tensor *found_inf);
    int (*scale_update)(const mt_scale_update_args *a);
    /* Whatever can fail for want of memory happens before the first parameter changes, so
       an out-of-memory error means nothing was updated (the optimizer then takes back the
       moments it made for this step); only a failed launch, on a broken device, can stop
       it half way. */
    int (*optim_step)(const mt_optim_step_args *a);
    /* out (0-d, F32 or F64) = sum over tensors of sum(x^2), accumulated in double */
    int (*sq_norm)(mt_tensor *const *ts, int n, mt_tensor *out);
    /* --- normalisation, dropout and indexing (issue 9); every tensor contiguous */
    /* Layer norm of each row of the last D = weight's numel elements of x: y = xhat * weight +
       bias; mean and rstd ([rows], accumulation dtype) are saved for the backward. weight and
       bias ([D], accumulation dtype) may be NULL. */
    int (*layer_norm)(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                      const mt_tensor *weight, const mt_tensor *bias, double eps);
    /* The wanted (non-NULL) gradients from gy and the saved x, mean, rstd, weight (or NULL). */
    int (*layer_norm_backward)(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                               const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                               const mt_tensor *weight);
    int (*batch_norm)(const mt_bn_args *a);
    int (*batch_norm_backward)(const mt_bn_backward_args *a);
    /* out = x * keep / (1 - p) with keep = (uniform draw i >= p), draw i = Philox element
       i of (seed, offset) for the flat index i; p == 1 gives zeros. The same call on the
       gradient is the backward (the mask is regenerated, never stored). */
    int (*dropout)(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed, uint64_t offset);
    /* x seen as [outer, n, inner] around dim; index I64 [k]: out[o, j, i] = x[o, index[j], i].
       On the CPU the op range-checks the indices before the call. A device reads them only
       in its kernel: an index outside [0, n) there yields zeros and a deferred fault that
       names op (MT_OP_INDEX_SELECT or MT_OP_EMBEDDING), reported at the next sync. */
    int (*index_select)(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                        mt_op_id op);
    /* dst[o, index[j], i] += src[o, j, i], dst F32 or F64, deterministic (fixed order) */
    int (*index_add)(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
    /* out[p] = x[p with coordinate dim replaced by index[p]] for every position p of index
       (index I64, out's shape; range-checked as index_select's) */
    int (*gather)(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index);
    /* dst[p with dim replaced by index[p]] += src[p], dst F32 or F64, deterministic */
    int (*scatter_add)(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
    /* out (I64, x's shape with dim of size 1) = the first index of the largest value along
       dim; NaN counts as the largest */
    int (*argmax)(mt_tensor *out, const mt_tensor *x, int dim);
    /* the GEMM with a bias and activation epilogue (mt_linear, mt_linear_act) */
    int (*gemm_epilogue)(const mt_gemm_epilogue_args *a);
    /* batch_norm and batch_norm_backward also take dense channels-last (NHWC) 4-d tensors:
       x, residual, y, gy, gx and gres all in that layout (else all contiguous) */
    bool batch_norm_nhwc;
    /* max pooling's forward writes its argmax indices (pool2d's idx) for the backward, which
       then reads idx instead of x */
    bool max_pool_indices;
} mt_backend;

/* The table for a device, complete (missing families answer MT_ERR_UNSUPPORTED); NULL when
   the backend is not built or the device is not available. */
const mt_backend *mt_backend_get(mt_device dev);
/* The same, with an error naming op when the device is not available. */
const mt_backend *mt_backend_for(const char *op, mt_device dev);

extern const mt_backend mt_cpu_backend;

/* The host-sync counter behind mt_host_sync_count: a backend calls this each time it waits
   for its device. */
void mt_host_sync_counted(void);
/* "cpu", "cuda:0": for messages. */
const char *mt_device_str(mt_device dev, char *buf, size_t cap);
#endif

/* mixtape: an eager tensor runtime with autograd and mixed precision, in C11.
 *
 * Ownership: arguments are borrowed; every function returning mt_tensor * returns a new
 * reference (or NULL on error). While a scope is open the result belongs to the innermost
 * scope and is released by mt_scope_end(); mt_retain() keeps it past the scope.
 * Errors: NULL in, NULL out (error untouched); the first error of a thread sticks until
 * mt_clear_error(). int functions return 0 or a negative mt_status; given a NULL tensor they
 * return MT_ERR_NULL and record it naming the argument (an earlier error's message is kept,
 * since the first error sticks). Accessors given NULL return a neutral value (-1 for counts,
 * NULL pointers, false, MT_F32, MT_CPU) with no error. An error raised inside a call names
 * that call first ("mt_linear: mt_cast: out of memory ...", "mt_backward: in the backward of
 * mt_sum: ..."). */
#ifndef MIXTAPE_H
#define MIXTAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header (meson.build checks that it matches the project's version);
   mt_version() gives the loaded library's, which can differ when an old library is found
   at run time. The soname's number is MT_VERSION_MAJOR. */
#define MT_VERSION_MAJOR  0
#define MT_VERSION_MINOR  1
#define MT_VERSION_PATCH  0
#define MT_VERSION_STRING "0.1.0"
const char *mt_version(void);

/* ---------------------------------------------------------------- dtypes, devices */

typedef enum { MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL, MT_DTYPE_COUNT } mt_dtype;

enum { MT_DEVICE_CPU = 0, MT_DEVICE_CUDA = 1, MT_DEVICE_TYPE_COUNT };
typedef struct {
    int type;  /* MT_DEVICE_CPU or MT_DEVICE_CUDA */
    int index; /* CUDA ordinal; 0 for the CPU */
} mt_device;
#define MT_CPU     ((mt_device){MT_DEVICE_CPU, 0})
#define MT_CUDA(i) ((mt_device){MT_DEVICE_CUDA, (i)})

#define MT_MAX_DIMS 8
/* MT_SHAPE(2, 3) expands to `2, (const int64_t[]){2, 3}`: the (ndim, shape) argument pair. */
#define MT_SHAPE(...)                                                                              \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) {           \
        __VA_ARGS__                                                                                \
    }
/* MT_DIMS(0, 1) expands to `2, (const int[]){0, 1}` for reductions and permute. */
#define MT_DIMS(...)                                                                               \
    (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)), (const int[]) {                       \
        __VA_ARGS__                                                                                \
    }

const char *mt_dtype_name(mt_dtype dt);
size_t mt_dtype_size(mt_dtype dt);
bool mt_dtype_is_floating(mt_dtype dt);
bool mt_cuda_available(void);
int mt_cuda_device_count(void);

/* ---------------------------------------------------------------- errors */

typedef enum {
    MT_OK = 0,
    MT_ERR_INVALID = -1,     /* bad argument value (dims out of range, bad option) */
    MT_ERR_SHAPE = -2,       /* shapes do not fit */
    MT_ERR_DTYPE = -3,       /* dtype not supported or mismatched */
    MT_ERR_DEVICE = -4,      /* tensors on different devices, or device unavailable */
    MT_ERR_OOM = -5,         /* host or device allocation failed */
    MT_ERR_STATE = -6,       /* call not valid in the current state (autograd, scaler) */
    MT_ERR_UNSUPPORTED = -7, /* valid request this build cannot serve */
    MT_ERR_NULL = -8,        /* a required argument was NULL */
    MT_ERR_INTERNAL = -9,
    MT_ERR_TIMEOUT = -10 /* a collective did not complete in time (mt_dist_set_timeout) */
} mt_status;

mt_status mt_last_status(void);
const char *mt_last_error(void); /* "" when no error */
void mt_clear_error(void);
const char *mt_status_name(mt_status s);

/* ---------------------------------------------------------------- tensors */

typedef struct mt_tensor mt_tensor;

mt_tensor *mt_empty(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev);
mt_tensor *mt_zeros(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev);
mt_tensor *mt_ones(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev);
mt_tensor *mt_full(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev, double value);
mt_tensor *mt_scalar(double value, mt_dtype dt, mt_device dev); /* 0-d tensor */
mt_tensor *mt_arange(double start, double end, double step, mt_dtype dt, mt_device dev);
/* Philox draws, the same bits on every device. mt_rand: U[0, 1) with the dtype's digits (F16
   11, BF16 8: never 1.0) and 24 random bits in F32 and F64 (an F64 draw is an F32 draw,
   widened; torch's F64 draws have 53). mt_randn: N(0, 1) by Box-Muller in F32. */
mt_tensor *mt_rand(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev);
mt_tensor *mt_randn(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev);
void mt_manual_seed(uint64_t seed);
mt_tensor *mt_from_data(const void *src, mt_dtype dt, int ndim, const int64_t *shape,
                        mt_device dev); /* copies src (contiguous, dtype dt) */
mt_tensor *mt_zeros_like(const mt_tensor *t);
mt_tensor *mt_ones_like(const mt_tensor *t);
mt_tensor *mt_empty_like(const mt_tensor *t);

int mt_copy_to_host(const mt_tensor *t, void *dst, size_t nbytes); /* any layout -> contiguous */
double mt_item(const mt_tensor *t); /* one-element tensor; NAN and an error otherwise
                                        (NAN and no error for NULL) */

mt_dtype mt_dtype_of(const mt_tensor *t);
mt_device mt_device_of(const mt_tensor *t);
int mt_ndim(const mt_tensor *t);
int64_t mt_dim(const mt_tensor *t, int i); /* negative i counts from the end */
const int64_t *mt_shape(const mt_tensor *t);
const int64_t *mt_strides(const mt_tensor *t); /* in elements */
int64_t mt_numel(const mt_tensor *t);
bool mt_is_contiguous(const mt_tensor *t);
/* Pointer to the first element on the host; NULL (with an error) for device tensors. */
void *mt_data_ptr(const mt_tensor *t);

/* Prints the values laid out like torch (rows on their own lines, summarised past the
   threshold), then dtype and shape; returns 0 or a negative status. */
int mt_print(const mt_tensor *t, FILE *f);
/* Writes the same text into buf (truncated to cap); returns the length it wanted, or a
   negative status. */
int mt_format(const mt_tensor *t, char *buf, size_t cap);
/* torch.set_printoptions, process-wide: get the current options, change fields, set them
   (every field means exactly what it holds; NULL restores the defaults). */
typedef struct {
    int precision;     /* digits after the point; default 4 */
    int64_t threshold; /* more elements than this are summarised; default 1000 */
    int edgeitems;     /* entries shown at each end of a summarised dim; default 3 */
    int linewidth;     /* characters per line before a row wraps; default 80 */
    int sci_mode;      /* -1: torch's automatic choice (default), 0: never, 1: always */
} mt_print_options;
void mt_print_options_get(mt_print_options *out);
int mt_print_options_set(const mt_print_options *o); /* MT_ERR_INVALID for bad values */

/* ---------------------------------------------------------------- ownership */

mt_tensor *mt_retain(mt_tensor *t); /* returns t */
/* NULL is fine. Releasing a result that an open scope of this thread holds takes the scope's
   reference (the scope will not release it again), so it is safe, not a double free. Scopes
   are per thread: a tensor one thread's scope holds must not be released by another thread.
   MT_CHECK_OWNERSHIP=1 in the environment (read once, at the first release) turns on checked
   mode: a release or retain of a tensor already freed is an MT_ERR_STATE error naming the op
   that made it (freed headers are kept, never reused), and a tensor retained inside a scope
   and still held when the scope ends is reported on stderr (hand results out with
   mt_scope_end_keep instead). mt_debug_ownership_reports() counts the reports. */
void mt_release(mt_tensor *t);
/* A scope that cannot open (out of memory) sets the error and still needs its mt_scope_end.
   Results made inside it go to the enclosing scope; with none, nothing would release them,
   so those calls fail (NULL) while the error is pending. */
void mt_scope_begin(void);
void mt_scope_end(void);
/* Ends the innermost scope like mt_scope_end but keeps `keep` (any tensor, NULL allowed):
   it then belongs to the enclosing scope, or to the caller when none is open. Lets an
   evaluation loop free each batch's intermediates and keep only its result. */
mt_tensor *mt_scope_end_keep(mt_tensor *keep);
int mt_scope_depth(void);

/* Live counters, for leak checks: tensors alive, and bytes of storage held on every device
   together (mt_memory_stats gives one device's figures). */
int64_t mt_live_tensors(void);
int64_t mt_live_bytes(void);
int64_t mt_peak_bytes(void);
void mt_peak_bytes_reset(void); /* peak := live */
/* Makes every block larger than `bytes` from the tensor allocators, host and device (tensor
   storage and kernel scratch; not small bookkeeping), fail, to test out-of-memory paths
   (0 = no limit). */
void mt_debug_set_alloc_limit(size_t bytes);
/* Makes the n-th allocation request from now on (n >= 1; 0 cancels) fail once, as if memory
   had run out: tensor storage and kernel scratch on every device, tensor headers, and the
   library's own bookkeeping (tape nodes, lists, optimizer and scaler records). Walking n = 1,
   2, ... over one call reaches each of its out-of-memory paths in turn (test_oom.c does).
   Returns whether the previous request was still pending, i.e. had not been reached. */
bool mt_debug_fail_nth_alloc(int64_t n);
int64_t mt_debug_ownership_reports(void); /* checked mode's reports so far (mt_release) */
/* The host allocator keeps freed large blocks (up to 512 MiB) for reuse, so a training loop
   pays no page faults per step; they are not counted in mt_live_bytes. mt_empty_cache gives
   them (and the calling thread's small-block lists) back to the system, like
   torch.cuda.empty_cache; an allocation that fails also empties the cache and retries. */
void mt_empty_cache(void);
int64_t mt_cached_bytes(void);

/* One device's memory: bytes held by live tensors and kernel scratch, their high-water mark,
   and freed blocks the device's caching allocator keeps for reuse (CUDA: never cudaMalloc /
   cudaFree per op). For MT_CPU these are the host figures above. */
typedef struct {
    int64_t live_bytes, peak_bytes, cached_bytes;
} mt_memory_stats;
int mt_memory_stats_get(mt_device dev, mt_memory_stats *out);
void mt_memory_peak_reset(mt_device dev); /* peak := live, for that device */
/* Gives dev's cached blocks back (cudaFree); waits for the device first. */
int mt_device_empty_cache(mt_device dev);

/* ---------------------------------------------------------------- devices and waiting
   Work on a CUDA device is queued on the device's one stream and runs asynchronously: ops
   return at once. The host waits only at visible points: mt_synchronize, mt_item,
   mt_copy_to_host, mt_to(..., MT_CPU), mt_print/mt_format, mt_grad_scaler_get_scale and the
   other scaler/optimizer queries documented as "may sync", and mt_clip_grad_norm's return
   value. Errors that a kernel finds in the data (a cross-entropy label out of range) cannot
   be returned by the op that queued it: they are reported, naming that op, by the next of
   these waiting calls, which then fails (on the CPU they are reported by the op itself).
   With several bad rows, a device names one of them (the CPU names the first). */
int mt_synchronize(mt_device dev);
/* How many times the library has waited for a device (stream syncs and device-to-host
   copies) since the program started: a training step that stays on the device adds 0. */
int64_t mt_host_sync_count(void);
/* F32 GEMMs on CUDA may use TF32 tensor cores (faster, 10-bit mantissa inputs). Off by
   default, so that F32 results match the CPU backend (torch's allow_tf32 switch). */
void mt_cuda_set_allow_tf32(bool on);

/* Threads used by our kernels and by BLAS. Default: OMP_NUM_THREADS where it is set, else
   all cores; n <= 0: all cores; either way at most 1024 (or OpenMP's thread limit). */
void mt_set_num_threads(int n);
int mt_get_num_threads(void);

/* ---------------------------------------------------------------- ops */
/* Floating ops accept F32, F64, F16, BF16; binary ops broadcast like NumPy and promote to
   the wider floating dtype, as torch: a 0-d tensor counts only when no operand with dims is
   floating (f16 x times an f32 0-d scale is f16, the scale rounded to f16 first, where torch
   reads a CPU scalar at FP32). Operands share a device, except that a 0-d
   CPU tensor may meet a
   CUDA tensor in the binary elementwise ops and comparisons (it is uploaded without a host
   wait, as torch allows). Negative dims count from the end. */

mt_tensor *mt_add(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_sub(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_mul(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_div(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_pow(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_maximum(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_minimum(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_add_scalar(mt_tensor *a, double s);
mt_tensor *mt_mul_scalar(mt_tensor *a, double s);
mt_tensor *mt_pow_scalar(mt_tensor *a, double s);
mt_tensor *mt_rsub_scalar(mt_tensor *a, double s); /* s - a */
mt_tensor *mt_rdiv_scalar(mt_tensor *a, double s); /* s / a */

mt_tensor *mt_neg(mt_tensor *a);
mt_tensor *mt_exp(mt_tensor *a);
mt_tensor *mt_log(mt_tensor *a);
mt_tensor *mt_sqrt(mt_tensor *a);
mt_tensor *mt_rsqrt(mt_tensor *a);
mt_tensor *mt_abs(mt_tensor *a);
mt_tensor *mt_relu(mt_tensor *a);
mt_tensor *mt_gelu(mt_tensor *a);      /* erf form, as torch's default */
mt_tensor *mt_gelu_tanh(mt_tensor *a); /* tanh approximation (approximate='tanh') */
mt_tensor *mt_sigmoid(mt_tensor *a);
mt_tensor *mt_tanh(mt_tensor *a);

/* Comparisons return MT_BOOL and are not differentiable. */
mt_tensor *mt_eq(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_ne(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_lt(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_le(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_gt(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_ge(mt_tensor *a, mt_tensor *b);
mt_tensor *mt_where(mt_tensor *cond, mt_tensor *a, mt_tensor *b); /* cond MT_BOOL */

mt_tensor *mt_sum(mt_tensor *t, int ndims, const int *dims, bool keepdim);
mt_tensor *mt_mean(mt_tensor *t, int ndims, const int *dims, bool keepdim);
/* mt_max is torch.amax (values only, no indices): tied maxima share the gradient evenly.
   A NaN maximum sends the gradient to the NaN elements, as torch.max(dim) does (torch.amax
   gives NaN to the whole slice). */
mt_tensor *mt_max(mt_tensor *t, int ndims, const int *dims, bool keepdim);
mt_tensor *mt_sum_all(mt_tensor *t);
mt_tensor *mt_mean_all(mt_tensor *t);
mt_tensor *mt_max_all(mt_tensor *t);
mt_tensor *mt_softmax(mt_tensor *t, int dim);
mt_tensor *mt_log_softmax(mt_tensor *t, int dim);

mt_tensor *mt_matmul(mt_tensor *a, mt_tensor *b);               /* like torch.matmul */
mt_tensor *mt_linear(mt_tensor *x, mt_tensor *w, mt_tensor *b); /* w [out, in]; b may be NULL */

/* ---- convolution and pooling: NCHW logical shapes like torch; channels-last inputs give
   channels-last outputs. F32, BF16 and F16 (CPU: through oneDNN; F16 computed in F32) and
   F64 (a plain reference path, for gradchecks). conv2d runs in the low dtype under autocast
   (rule LOWER); pooling runs in its input's dtype. On CUDA, convolution runs through cuDNN
   (loaded on first use: without libcudnn.so.9 it answers MT_ERR_UNSUPPORTED; MT_CUDNN_FIND=1 in
   the environment picks algorithms by an exhaustive timed search, once per shape) and pooling
   through the backend's own kernels. */

/* Zero in stride, dilation or groups means 1 (torch rejects 0 there); padding 0 is 0. */
typedef struct {
    int64_t stride[2];   /* [h, w] */
    int64_t padding[2];  /* zeros on both sides of each spatial dim */
    int64_t dilation[2]; /* spacing of the kernel taps */
    int64_t groups;      /* in_channels and out_channels divisible by it; groups == in_channels
                            is a depthwise convolution */
} mt_conv2d_opts;
/* y [N, OC, OH, OW] = conv2d(x [N, C, H, W], w [OC, C / groups, kH, kW]) + b [OC] (b may be
   NULL; opts NULL: stride 1, no padding); OH = (H + 2 padding - dilation (kH - 1) - 1) /
   stride + 1, as torch.nn.functional.conv2d. */
mt_tensor *mt_conv2d(mt_tensor *x, mt_tensor *w, mt_tensor *b, const mt_conv2d_opts *opts);

typedef struct {
    int64_t kernel[2];  /* required, >= 1 */
    int64_t stride[2];  /* 0: the kernel size (torch's stride=None) */
    int64_t padding[2]; /* at most half the kernel; max pooling pads with -inf, average with 0 */
    bool ceil_mode;     /* ceil instead of floor in the output size, as torch */
    bool exclude_pad;   /* average only: torch's count_include_pad=False */
} mt_pool2d_opts;
/* x [N, C, H, W]. Max pooling's gradient goes to the first maximum of each window (a NaN
   wins), like torch's CPU kernel. */
mt_tensor *mt_max_pool2d(mt_tensor *x, const mt_pool2d_opts *opts);
mt_tensor *mt_avg_pool2d(mt_tensor *x, const mt_pool2d_opts *opts);
/* torch's adaptive_avg_pool2d: output window i covers [floor(i H / OH), ceil((i+1) H / OH)). */
mt_tensor *mt_adaptive_avg_pool2d(mt_tensor *x, int64_t out_h, int64_t out_w);

mt_tensor *mt_mse_loss(mt_tensor *pred, mt_tensor *target); /* mean */
#define MT_IGNORE_INDEX_NONE INT64_MIN
/* logits [N, C], labels MT_I64 [N]; mean over labels != ignore_index. mt_cross_entropy
   ignores -100 like torch; MT_IGNORE_INDEX_NONE ignores nothing. An ignored row's gradient is
   exactly 0 whatever its logits hold (torch's is NaN for a row with an inf or NaN logit), so
   an overflow in ignored (padding) rows cannot make a GradScaler step skip. */
mt_tensor *mt_cross_entropy(mt_tensor *logits, mt_tensor *labels);
mt_tensor *mt_cross_entropy_ex(mt_tensor *logits, mt_tensor *labels, int64_t ignore_index);

/* ---- normalisation (torch.nn.functional semantics). Under autocast (O1 and O2) the
   activation keeps its dtype (no up-cast) while weight, bias and statistics are FP32 (the
   MIXED rule of ops.def); the result has the activation's dtype. Statistics accumulate in
   FP32 (F64 for F64 inputs). On the CPU and on CUDA (own kernels; cuDNN's fused NHWC
   batch norm is still to come). */
/* Normalises over the last normalized_ndim dims of x; weight and bias (each may be NULL)
   have the shape of those dims. */
mt_tensor *mt_layer_norm(mt_tensor *x, int normalized_ndim, mt_tensor *weight, mt_tensor *bias,
                         double eps);
/* x is [N, C, ...]; statistics per channel over N and the other dims. training: normalises
   with the batch mean and biased variance and, when the running buffers are given (both or
   neither), updates them in place without history: running = (1 - momentum) * running +
   momentum * batch statistic, with the unbiased variance for running_var. Eval (training
   false): normalises with running_mean and running_var, which are then required. The
   running buffers must be [C], contiguous, FP32 (F64 for F64 x), not requiring grad; weight
   and bias ([C]) may be NULL. */
mt_tensor *mt_batch_norm(mt_tensor *x, mt_tensor *running_mean, mt_tensor *running_var,
                         mt_tensor *weight, mt_tensor *bias, bool training, double momentum,
                         double eps);
/* Activations of the fused ops. mt_batch_norm_act takes NONE and RELU; mt_linear_act all:
   GELU is torch's exact (erf) form as mt_gelu, GELU_TANH its tanh approximation as
   mt_gelu_tanh. */
typedef enum { MT_ACT_NONE, MT_ACT_RELU, MT_ACT_GELU, MT_ACT_GELU_TANH } mt_activation;
/* act(mt_linear(x, w, b)) with the bias and the activation applied in the GEMM's epilogue
   (one pass over the output on the CPU; a cuBLASLt epilogue on CUDA), rounded once in
   FP16/BF16. Differentiable; the backward reads the saved output (RELU) or the pre-activation
   saved by the same pass (GELU). LOWER under autocast, as mt_linear. */
mt_tensor *mt_linear_act(mt_tensor *x, mt_tensor *w, mt_tensor *b, mt_activation act);
/* act(batch_norm(x) + residual) in one pass forward and one backward (the residual, NULL or
   a tensor of x's shape and dtype, gets its gradient too): the fused BN+add+ReLU of ResNet
   blocks. The
   same values as the unfused ops, NaN included: an inf in a channel makes it NaN, and the
   ReLU's backward zeroes only where the output is <= 0 (a NaN passes), as mt_relu's. */
mt_tensor *mt_batch_norm_act(mt_tensor *x, mt_tensor *running_mean, mt_tensor *running_var,
                             mt_tensor *weight, mt_tensor *bias, mt_tensor *residual, bool training,
                             double momentum, double eps, mt_activation act);

/* Inverted dropout: training zeroes each element with probability p (in [0, 1]) and scales
   the others by 1 / (1 - p) (multiplying by 0 or 1 / (1 - p), as torch: a dropped inf or NaN
   gives NaN); the mask comes from the global Philox generator (mt_manual_seed)
   and is regenerated in backward from the seed and offset kept on the tape (no mask tensor).
   Runs in x's dtype, F16/BF16 included. Not training, or p == 0: returns x itself. */
mt_tensor *mt_dropout(mt_tensor *x, double p, bool training);

/* ---- indexing. Indices are MT_I64; one out of range is an error naming the op, its
   position and its value. The gradients are added back at the indexed places in FP32 (F64
   for F64) in a fixed order (deterministic), then rounded once to the input's dtype. */
/* weight [num_embeddings, dim], indices of any shape: result indices.shape + [dim]. */
mt_tensor *mt_embedding(mt_tensor *weight, mt_tensor *indices);
/* The entries of x along dim named by index (0-d or 1-d), as torch.index_select. */
mt_tensor *mt_index_select(mt_tensor *x, int dim, mt_tensor *index);
/* out[p] = x[p with coordinate dim replaced by index[p]]; index has x's ndim and sizes no
   larger than x's outside dim; the result has index's shape (torch.gather). */
mt_tensor *mt_gather(mt_tensor *x, int dim, mt_tensor *index);
/* MT_I64 index of the largest value along dim (the first one on ties; NaN counts as the
   largest); not differentiable. */
mt_tensor *mt_argmax(mt_tensor *x, int dim, bool keepdim);
/* A random permutation of 0 .. n-1 (MT_I64) from the global generator (mt_manual_seed). */
mt_tensor *mt_randperm(int64_t n, mt_device dev);

mt_tensor *mt_cat(mt_tensor *const *ts, int n, int dim);
mt_tensor *mt_stack(mt_tensor *const *ts, int n, int dim);

mt_tensor *mt_cast(mt_tensor *t, mt_dtype dt); /* new reference to t itself when dt matches */
/* A copy on dev (t itself when already there). Between two CUDA devices it is a peer copy,
   ordered on both devices' streams, with no host wait; to the CPU it waits. */
mt_tensor *mt_to(mt_tensor *t, mt_device dev);
mt_tensor *mt_clone(mt_tensor *t);
mt_tensor *mt_contiguous(mt_tensor *t); /* t itself when already contiguous */
mt_tensor *mt_detach(mt_tensor *t);     /* shares storage, no autograd history */
/* Channels-last (torch.channels_last): a 4-d tensor keeps its NCHW logical shape and may
   carry NHWC strides. Every op takes such tensors; conv2d and pooling keep the input's
   format in their output and run their NHWC path on it. mt_to_channels_last is a recorded
   copy (the gradient flows through), or t itself when already channels-last; mt_contiguous
   turns it back into NCHW. */
mt_tensor *mt_to_channels_last(mt_tensor *t);
bool mt_is_channels_last(const mt_tensor *t); /* 4-d with dense NHWC strides */

/* Views: share storage with their input. */
mt_tensor *mt_reshape(mt_tensor *t, int ndim, const int64_t *shape); /* one -1 allowed; copies
                                                                        when no view fits */
mt_tensor *mt_view(mt_tensor *t, int ndim, const int64_t *shape);    /* error when no view fits */
mt_tensor *mt_flatten(mt_tensor *t);
mt_tensor *mt_transpose(mt_tensor *t, int d0, int d1);
mt_tensor *mt_permute(mt_tensor *t, int ndim, const int *order);
mt_tensor *mt_narrow(mt_tensor *t, int dim, int64_t start, int64_t length);
mt_tensor *mt_slice(mt_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
mt_tensor *mt_expand(mt_tensor *t, int ndim, const int64_t *shape); /* -1 keeps a size */
mt_tensor *mt_squeeze(mt_tensor *t, int dim);
mt_tensor *mt_unsqueeze(mt_tensor *t, int dim);

/* In-place ops: bump the version counter; refused on tensors that take part in autograd
   while grad mode is on (like torch's leaf check), and on views made with grad mode off of
   such tensors (torch refuses those too). They write values and record nothing: a source
   that requires grad is only read (mt_copy(buffer, param) copies a parameter's values;
   dst does not require grad afterwards, where torch would record the copy: mt_clone and
   mt_add are the recorded forms). */
int mt_fill(mt_tensor *t, double value);
int mt_zero(mt_tensor *t);
int mt_copy(mt_tensor *dst, mt_tensor *src); /* broadcasts src, converts dtype */
int mt_add_inplace(mt_tensor *a, mt_tensor *b);
int mt_mul_scalar_inplace(mt_tensor *a, double s);

/* ---------------------------------------------------------------- autograd */

/* Leaves only. Switched off after ops used the leaf, a later backward through them gives it
   no gradient and fires none of its hooks (torch: a frozen parameter). */
void mt_set_requires_grad(mt_tensor *t, bool on);
bool mt_requires_grad(const mt_tensor *t);
bool mt_is_leaf(const mt_tensor *t);
/* grad NULL: root must hold one element and the seed is 1. Frees the tape. All or nothing:
   leaf gradients are added to .grad only after every node's backward succeeded, so a failed
   backward (out of memory, a modified saved tensor) leaves every .grad as it was. Without
   retain_graph the saved tensors are freed node by node as the backward goes (as torch
   does, to keep its peak memory down), so a backward that failed part way may have spent
   the graph: running it again then fails with MT_ERR_STATE. Keep the graph
   (mt_backward_ex(..., true)) to be able to retry, e.g. after mt_empty_cache. Threads may
   run backwards at once into shared leaves (their gradients add up exactly); a backward
   that reaches a non-leaf node another thread's backward is running through fails with
   MT_ERR_STATE and changes nothing (torch runs both). Called inside an autocast region,
   backward runs with autocast off (hooks included): each formula computes in the dtypes
   its forward chose, and the region is there again afterwards. */
int mt_backward(mt_tensor *root, mt_tensor *grad);
int mt_backward_ex(mt_tensor *root, mt_tensor *grad, bool retain_graph);
mt_tensor *mt_grad(mt_tensor *t);               /* new reference, or NULL (no error) when none */
int mt_set_grad(mt_tensor *t, mt_tensor *grad); /* NULL clears */
void mt_zero_grad(mt_tensor *t);                /* drops .grad */
bool mt_set_grad_enabled(bool on);              /* returns the previous mode */
bool mt_is_grad_enabled(void);
/* Name of the op that made t ("" for leaves), for debugging. */
const char *mt_grad_fn_name(const mt_tensor *t);

/* Finite-difference gradient check in FP64. fn maps inputs to one tensor; every input that
   requires grad is checked by central differences against mt_backward with a random cotangent. */
/* Gradient-ready hooks: fn(leaf, user) runs once per backward that reaches the leaf (a
   tensor that requires grad and has no grad_fn), right after the leaf's gradient for that
   backward is final: every path from the root to the leaf has delivered its part, and
   mt_grad(leaf) holds the accumulated value (or NULL when no gradient reached it). Hooks run
   in registration order, on the thread running backward, with grad mode off; a negative
   return stops the backward with that status. Not called for leaves the backward does not
   reach. Hooks assume one backward at a time through a given leaf, and must not add or
   remove hooks of that leaf while running. Returns a handle > 0, or a negative status. */
typedef int (*mt_grad_ready_hook)(mt_tensor *leaf, void *user);
int mt_tensor_register_grad_ready_hook(mt_tensor *leaf, mt_grad_ready_hook fn, void *user);
/* Removes the hook with that handle; MT_ERR_INVALID when the leaf has none such. */
int mt_tensor_remove_grad_ready_hook(mt_tensor *leaf, int handle);

typedef mt_tensor *(*mt_gradcheck_fn)(mt_tensor *const *inputs, void *ctx);
typedef struct {
    double eps;  /* 0: 1e-6 */
    double atol; /* 0: 1e-5 */
    double rtol; /* 0: 1e-3 */
} mt_gradcheck_opts;
/* Returns 0 when the gradients match; MT_ERR_STATE with a message naming the input, the
   element and both values when they do not. */
int mt_gradcheck(mt_gradcheck_fn fn, mt_tensor *const *inputs, int n, void *ctx,
                 const mt_gradcheck_opts *opts);

/* ---------------------------------------------------------------- amp */

typedef enum { MT_AMP_O1, MT_AMP_O2 } mt_amp_level;
/* low: MT_F16 or MT_BF16, or MT_F32 to open a region with autocast disabled. A bad dtype or
   level sets an error and opens a disabled region: every begin, failed or not, needs its
   mt_autocast_end. */
void mt_autocast_begin(mt_dtype low, mt_amp_level level);
void mt_autocast_end(void);
bool mt_autocast_enabled(void);
mt_dtype mt_autocast_dtype(void);
/* Per-thread custom lists of op names (NULL-terminated, either may be NULL); replace the
   previous custom lists. An unknown op, or one in both lists, is an error. */
int mt_autocast_set_lists(const char *const *white, const char *const *black);
/* The dtype op `name` would compute in for inputs of dtype `in`, under the current state. */
mt_dtype mt_autocast_compute_dtype(const char *op_name, mt_dtype in);

/* The calling thread's cast cache: entries held, and hits since the thread started. */
int mt_amp_cast_cache_size(void);
int64_t mt_amp_cast_cache_hits(void);

/* Operator statistics (Paddle's collect_operator_stats). */
void mt_amp_stats_enable(bool on);
void mt_amp_stats_reset(void);
int64_t mt_amp_stats_count(const char *op_name, mt_dtype compute);
int mt_amp_stats_print(FILE *f);

/* Numeric checker (Paddle's TensorChecker): records the first op whose output has inf/nan. */
void mt_amp_check_numerics(bool on);
bool mt_amp_numerics_failed(void);
const char *mt_amp_numerics_report(void); /* "" when none */
void mt_amp_numerics_reset(void);

typedef struct mt_optimizer mt_optimizer;
typedef struct mt_grad_scaler mt_grad_scaler;
/* 0 is no valid value for any of these fields: left out (0), a field takes its default. */
typedef struct {
    double init_scale;     /* 0: 65536 */
    double growth_factor;  /* 0: 2 */
    double backoff_factor; /* 0: 0.5 */
    int growth_interval;   /* 0: 2000 */
    int backoff_after;     /* 0: 1 consecutive bad step */
    double min_scale;      /* 0: 1 */
    double max_scale;      /* 0: 2^24 */
    bool disabled;         /* scale() returns loss, step() is a plain step */
} mt_grad_scaler_opts;

typedef struct {
    double scale;
    int64_t good_steps, bad_steps, skipped_steps;
} mt_grad_scaler_state;

mt_grad_scaler *mt_grad_scaler_new(const mt_grad_scaler_opts *opts);
mt_tensor *mt_grad_scaler_scale(mt_grad_scaler *s, mt_tensor *loss);
int mt_grad_scaler_unscale(mt_grad_scaler *s, mt_optimizer *o);
/* MT_ERR_STATE, changing nothing, when none of o's parameters has a gradient (torch's "No
   inf checks were recorded"): such a step would count as clean toward the scale's growth. */
int mt_grad_scaler_step(mt_grad_scaler *s, mt_optimizer *o);
/* After step, or after an unscale whose step the loop skipped itself (it saw
   mt_grad_scaler_last_step_skipped): any inf check counts, as in torch. */
int mt_grad_scaler_update(mt_grad_scaler *s);
int mt_grad_scaler_minimize(mt_grad_scaler *s, mt_optimizer *o); /* step + update */
float mt_grad_scaler_get_scale(mt_grad_scaler *s);               /* may sync */
bool mt_grad_scaler_last_step_skipped(mt_grad_scaler *s);        /* may sync */
int64_t mt_grad_scaler_skipped_steps(mt_grad_scaler *s);         /* may sync */
int mt_grad_scaler_state_get(mt_grad_scaler *s, mt_grad_scaler_state *out);
int mt_grad_scaler_state_set(mt_grad_scaler *s, const mt_grad_scaler_state *in);
void mt_grad_scaler_free(mt_grad_scaler *s);

/* ---------------------------------------------------------------- optim */

/* Options: a field for which 0 is a valid value other than its default has the type
   mt_opt_real. Left out of a designated initialiser it takes the default in its comment;
   MT_SET(x) passes x exactly, 0 included (a plain number there does not compile, so
   `.weight_decay = 0` can never silently mean 0.01):
       mt_adamw_new(params, n, &(mt_adam_opts){.lr = MT_SET(3e-4), .weight_decay = MT_SET(0)});
   To assign one later: `o.lr = (mt_opt_real)MT_SET(1e-4);`. Every other field either has
   default 0/false or is one for which 0 is not a valid value (a GradScaler's init_scale),
   and there 0 (left out) means the default. A NULL options pointer means all defaults. */
typedef struct {
    double value;
    bool set;
} mt_opt_real;
#define MT_SET(x)                                                                                  \
    { .value = (x), .set = true }

typedef struct {
    mt_opt_real lr;      /* default 1e-3 */
    double weight_decay; /* L2, added to the gradient */
    bool multi_precision;
} mt_sgd_opts;
typedef struct {
    mt_opt_real lr;       /* default 1e-3 */
    mt_opt_real momentum; /* default 0.9 */
    double weight_decay;
    bool nesterov;
    bool multi_precision;
} mt_momentum_opts;
typedef struct {
    mt_opt_real lr;           /* default 1e-3 */
    mt_opt_real beta1, beta2; /* defaults 0.9, 0.999 */
    mt_opt_real eps;          /* default 1e-8 */
    mt_opt_real weight_decay; /* Adam: L2 into the gradient, default 0; AdamW: decoupled,
                                 default 0.01 (torch's) */
    bool multi_precision;
} mt_adam_opts;
/* Every optimizer skips a parameter that has no gradient at a step (its state stays as it
   is), as torch does; Adam and AdamW count steps per parameter (torch's state[p]["step"]), so
   a parameter's bias correction counts only the steps that updated it. */
mt_optimizer *mt_sgd_new(mt_tensor *const *params, int n, const mt_sgd_opts *o);
mt_optimizer *mt_momentum_new(mt_tensor *const *params, int n, const mt_momentum_opts *o);
mt_optimizer *mt_adam_new(mt_tensor *const *params, int n, const mt_adam_opts *o);
mt_optimizer *mt_adamw_new(mt_tensor *const *params, int n, const mt_adam_opts *o);
int mt_optimizer_step(mt_optimizer *o);
void mt_optimizer_zero_grad(mt_optimizer *o); /* NULL: no-op */
void mt_optimizer_free(mt_optimizer *o);      /* NULL is fine */
int mt_optimizer_set_lr(mt_optimizer *o, double lr);
double mt_optimizer_get_lr(const mt_optimizer *o);
/* The FP32 master copy of parameter i (new reference), or NULL when it has none (no error;
   also NULL with no error for a NULL optimizer). */
mt_tensor *mt_optimizer_master(mt_optimizer *o, int i);
/* Scales gradients so their global L2 norm is at most max_norm (by max_norm / (norm + 1e-6),
   as torch.nn.utils.clip_grad_norm_); returns the norm before clipping. A non-finite norm is
   returned and applied like torch: an inf norm scales by 0, a NaN norm makes the gradients
   NaN (the GradScaler skips such a step). NAN with an error set means the call failed; NAN
   with no error is a NaN norm. Waits for the device (the norm is a host number). Call after
   mt_grad_scaler_unscale. */
double mt_clip_grad_norm(mt_optimizer *o, double max_norm);
/* error_if_nonfinite: a non-finite norm is an MT_ERR_INVALID error instead, and the
   gradients are left as they are. */
double mt_clip_grad_norm_ex(mt_optimizer *o, double max_norm, bool error_if_nonfinite);
/* The same clipping without a host wait, as torch's: the coefficient
   min(max_norm / (norm + 1e-6), 1) is computed and applied on the device (so a norm within
   1e-6 of max_norm scales by just under 1 here, and not in mt_clip_grad_norm), and the norm
   is returned as a 0-d tensor on the optimizer's device, F32 (F64 when a gradient is F64;
   read it with mt_item only when needed: that waits). NULL with an error when the call
   failed. */
mt_tensor *mt_clip_grad_norm_async(mt_optimizer *o, double max_norm);
/* O2 (Paddle's decorate): casts the parameters to `low` in place, except those marked as
   norm parameters (keep_fp32[i] true, or marked by mt_set_amp_keep_fp32); an optimizer made
   afterwards with multi_precision creates their FP32 masters from the low values (O2 master
   weights). */
int mt_amp_decorate(mt_tensor *const *params, int n, mt_dtype low, const bool *keep_fp32);
/* Marks t as a norm parameter that mt_amp_decorate keeps FP32 whatever keep_fp32 says (the
   batch-norm and layer-norm layers mark their weight and bias; a user's own norm layer can
   mark its parameters the same way). */
void mt_set_amp_keep_fp32(mt_tensor *t, bool on);
bool mt_amp_keep_fp32(const mt_tensor *t);
/* torch's model.to(memory_format=torch.channels_last), in place: every 4-d parameter among
   params[0..n) (and its .grad) gets channels-last storage holding the same values, keeping
   its identity; other parameters are left as they are. Convolutions under channels-last
   activations then read their weights and write the weight gradients without layout copies,
   and a parameter's gradient, masters and moments take its layout. Call it before making the
   optimizer (state made earlier keeps working, on a slower strided path). Leaf tensors only;
   on error nothing changes. */
int mt_params_to_channels_last(mt_tensor *const *params, int n);

/* ---------------------------------------------------------------- nn */

/* y = act(x W^T + b), W [out, in] initialised like torch.nn.Linear (Kaiming uniform). act is
   MT_ACT_NONE after init; set it to fuse an activation into the layer (mt_linear_act). */
typedef struct {
    mt_tensor *weight, *bias;
    mt_activation act;
} mt_linear_layer;
int mt_linear_layer_init(mt_linear_layer *l, int64_t in, int64_t out, bool bias, mt_dtype dt,
                         mt_device dev);
mt_tensor *mt_linear_layer_forward(mt_linear_layer *l, mt_tensor *x);
void mt_linear_layer_free(mt_linear_layer *l);

/* torch.nn.BatchNorm2d: weight 1 and bias 0 (in dt, marked to stay FP32 under O2 decorate),
   running_mean 0 and running_var 1 (FP32; F64 for F64 layers), momentum 0.1, eps 1e-5, all
   fields the caller may change. training (true after init) selects batch statistics and
   the running update; false: eval with the running statistics. */
typedef struct {
    mt_tensor *weight, *bias, *running_mean, *running_var;
    double momentum, eps;
    bool training;
} mt_batch_norm2d_layer;
int mt_batch_norm2d_layer_init(mt_batch_norm2d_layer *l, int64_t channels, mt_dtype dt,
                               mt_device dev);
mt_tensor *mt_batch_norm2d_layer_forward(mt_batch_norm2d_layer *l, mt_tensor *x); /* 4-d x */
void mt_batch_norm2d_layer_free(mt_batch_norm2d_layer *l);

/* torch.nn.LayerNorm(normalized_shape, elementwise_affine): weight 1 and bias 0 of that
   shape when affine (marked to stay FP32 under O2 decorate), eps 1e-5. */
typedef struct {
    mt_tensor *weight, *bias; /* NULL without affine */
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    double eps;
} mt_layer_norm_layer;
int mt_layer_norm_layer_init(mt_layer_norm_layer *l, int ndim, const int64_t *shape, bool affine,
                             mt_dtype dt, mt_device dev);
mt_tensor *mt_layer_norm_layer_forward(mt_layer_norm_layer *l, mt_tensor *x);
void mt_layer_norm_layer_free(mt_layer_norm_layer *l);

/* torch.nn.Embedding: weight [num, dim] drawn from N(0, 1). */
typedef struct {
    mt_tensor *weight;
} mt_embedding_layer;
int mt_embedding_layer_init(mt_embedding_layer *l, int64_t num, int64_t dim, mt_dtype dt,
                            mt_device dev);
mt_tensor *mt_embedding_layer_forward(mt_embedding_layer *l, mt_tensor *indices);
void mt_embedding_layer_free(mt_embedding_layer *l);

/* torch.nn.Dropout: training is true after init; false makes the forward the identity. */
typedef struct {
    double p;
    bool training;
} mt_dropout_layer;
int mt_dropout_layer_init(mt_dropout_layer *l, double p);
mt_tensor *mt_dropout_layer_forward(mt_dropout_layer *l, mt_tensor *x);
/* ---------------------------------------------------------------- checkpoints
   A state dict is an ordered map from names to tensors (insertion order, or the file's
   order after a load) with string metadata, saved as a safetensors file: an 8-byte
   little-endian header length, a JSON header ({"name": {"dtype": "F32", "shape": [2, 3],
   "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}) and the raw
   little-endian data. The file loads in Python's safetensors and in PyTorch
   (safetensors.torch.load_file); dtypes map as F32 F16 BF16 F64 I64 I32 BOOL. The files
   need a little-endian host (the build refuses others). */
typedef struct mt_state mt_state;

mt_state *mt_state_new(void);    /* NULL with MT_ERR_OOM */
void mt_state_free(mt_state *s); /* releases its tensors; NULL is fine */
/* Puts t under name, retaining it (the state holds the tensor itself, not a copy: save it
   before changing the tensor). An existing entry of that name is replaced in place (keeps
   its position). Names are non-empty UTF-8 and not "__metadata__". Looking a name up is a
   linear search (state dicts of thousands of entries, not millions). */
int mt_state_put(mt_state *s, const char *name, mt_tensor *t);
/* The tensor under name (new reference), or NULL with MT_ERR_INVALID naming it when absent. */
mt_tensor *mt_state_get(mt_state *s, const char *name);
bool mt_state_contains(const mt_state *s, const char *name); /* false for NULL */
int mt_state_count(const mt_state *s);                       /* -1 for NULL */
const char *mt_state_name(const mt_state *s, int i);         /* NULL when out of range (no error) */
/* String metadata (safetensors' "__metadata__"); set copies both strings and replaces an
   existing key. get returns NULL when absent (no error); the pointer lives until the key is
   set again or the state is freed. */
int mt_state_set_meta(mt_state *s, const char *key, const char *value);
const char *mt_state_get_meta(const mt_state *s, const char *key);
int mt_state_meta_count(const mt_state *s);
const char *mt_state_meta_key(const mt_state *s, int i);

/* Writes s to path atomically: a temporary file in the same directory, fsync, rename over
   path, fsync of the directory, so a crash leaves the old file or the new one, never a
   truncated one. Waits for the devices that hold the tensors. */
int mt_state_save(const mt_state *s, const char *path);
/* Reads a safetensors file (mapped, every header field validated before anything is
   allocated) and copies each tensor straight to dev. NULL with an error naming the file and
   the fault for a missing, truncated or malformed file. */
mt_state *mt_state_load(const char *path, mt_device dev);
/* Copies the entries prefix + names[i] of s into params[i] (in place, any device: the
   values move to the parameter's device), with torch's load_state_dict semantics: a shape or
   dtype mismatch is always an error; with strict, so is a name that s lacks (missing) and an
   entry of s under prefix that no name claims (unexpected); without strict those are
   skipped. All or nothing: on any error no parameter changes. prefix may be NULL ("").
   Parameters are written outside autograd (their version counter is bumped). */
int mt_state_load_into(mt_state *s, const char *prefix, mt_tensor *const *params,
                       const char *const *names, int n, bool strict);

/* Optimizer state under prefix: the kind and options (metadata "<prefix>kind" ... and F64
   scalars "<prefix>lr" ...), the parameter count, and per parameter i the moments
   ("<prefix>state.<i>.momentum_buffer", ".exp_avg", ".exp_avg_sq"), Adam's step count
   (".step", an F32 scalar, as torch's) and the FP32 master weight (".master"); a parameter no
   step has updated yet has no moments and no count. Saves copies (a later step does not
   change them); a save that fails leaves s as it was. A state saved before the counts were
   per parameter (one "<prefix>step") still loads. Loading
   needs an optimizer of the same kind, parameter count, shapes and multi_precision; it
   restores every option (lr included) and the state exactly, so training resumes bit for
   bit. All or nothing. */
int mt_optimizer_state_save(mt_optimizer *o, mt_state *s, const char *prefix);
int mt_optimizer_state_load(mt_optimizer *o, mt_state *s, const char *prefix);
/* GradScaler state under prefix: "scale", "growth_tracker" (clean steps in a row),
   "bad_steps", "skipped_steps", "found_inf" (F32 scalars) and the options (growth_factor,
   backoff_factor, growth_interval, backoff_after, min_scale, max_scale as F64 scalars,
   "disabled" BOOL). Not between unscale/step and update (MT_ERR_STATE). A failed save
   leaves s as it was; a load is all or nothing. */
int mt_grad_scaler_state_save(mt_grad_scaler *gs, mt_state *s, const char *prefix);
int mt_grad_scaler_state_load(mt_grad_scaler *gs, mt_state *s, const char *prefix);
/* Puts the layer's parameters under prefix + "weight" / "bias" (torch's names: prefix
   "fc1." gives "fc1.weight"), and loads them back (mt_state_load_into). */
int mt_linear_layer_state_put(mt_linear_layer *l, mt_state *s, const char *prefix);
int mt_linear_layer_state_load(mt_linear_layer *l, mt_state *s, const char *prefix, bool strict);

/* ---------------------------------------------------------------- data parallel */

/* Processes (ranks) of one job, launched by `mpirun -np N prog` (as root Open MPI also needs
   --allow-run-as-root, and --oversubscribe for more ranks than cores). CPU tensors go
   through MPI. CUDA tensors go through NCCL (libnccl.so.2, loaded on first use; the variable
   MT_NCCL_LIBRARY names another file; without it a collective on a CUDA tensor fails with
   MT_ERR_UNSUPPORTED), queued on the device's stream with no host wait: mt_dist_wait
   returns at once and later ops on the tensor are ordered after the collective. The NCCL
   communicator is made by the first collective on a CUDA tensor (rank 0's id travels over
   MPI), on that tensor's device: one device per rank. NCCL reduces FP16/BF16 in their own
   type and averages natively.
   Collectives are called by every rank in the same order, with the same dtype and shape;
   each first checks that the ranks agree (op, dtype, element count, root) and fails with
   MT_ERR_SHAPE on every rank when they do not, instead of exchanging mismatched buffers.
   A call that fails its own checks on one rank (a NULL or non-contiguous tensor, a bad
   root or op) still takes part in that agreement: it fails there with its own error and
   on the other ranks with MT_ERR_SHAPE, and the ranks stay in step.
   Every wait is bounded (mt_dist_set_timeout, default 300 s, or the environment variable
   MT_DIST_TIMEOUT in seconds): a peer that never joins gives MT_ERR_TIMEOUT, after which
   the world refuses further collectives (MPI cannot cancel a started collective). Process
   failures are returned as errors (MPI_ERRORS_RETURN), though mpirun usually ends the whole
   job when a rank dies (`mpirun --enable-recovery` keeps the survivors running: their next
   collective gives MT_ERR_TIMEOUT). FP16/BF16 CPU tensors are reduced in FP32 on a staging
   buffer and rounded once; sum and average of integers are exact (average is refused for
   integers); MT_BOOL: sum and max are logical or. */
typedef enum { MT_REDUCE_SUM, MT_REDUCE_MAX, MT_REDUCE_AVG } mt_reduce_op;
typedef struct mt_dist_work mt_dist_work;

/* Joins the job described by the launcher's environment (Open MPI's OMPI_COMM_WORLD_*, or a
   PMI/PMIx launcher). Without a launcher the process is a world of one, with no MPI at all.
   Idempotent. */
int mt_dist_init(void);
/* Waits (bounded) for collectives orphaned by a timeout and leaves MPI; a later mt_dist_init
   fails (MPI cannot be initialised twice in a process). Fails with MT_ERR_STATE, changing
   nothing, while a work from mt_*_async has not been through mt_dist_wait. */
int mt_dist_finalize(void);
bool mt_dist_is_initialized(void);
int mt_dist_rank(void);       /* 0 before init */
int mt_dist_world_size(void); /* 1 before init */
int mt_dist_barrier(void);
/* 0 < seconds <= 1e9 (about 31 years: a wait always has a deadline); applies to every later
   wait of this process */
int mt_dist_set_timeout(double seconds);
double mt_dist_timeout(void);

/* Ranks as threads of one process, for CUDA tensors (a device per thread, or the emulated
   device): one thread makes an id, then each of `world` threads calls mt_dist_init_thread
   with its rank and the same id, and is that rank (mt_dist_rank, the collectives, the
   scaler's found-inf reduction) until it calls mt_dist_finalize. Such a world has no MPI:
   collectives on CPU tensors, mt_dist_barrier and mt_ddp fail there with
   MT_ERR_UNSUPPORTED. The first CUDA collective waits until all ranks have made it. */
typedef struct {
    unsigned char bytes[128]; /* an NCCL unique id */
} mt_dist_id;
int mt_dist_id_new(mt_dist_id *id);
int mt_dist_init_thread(int rank, int world, const mt_dist_id *id);

/* In place on every rank: t := op over the ranks' t. t: contiguous, CPU or CUDA. */
int mt_all_reduce(mt_tensor *t, mt_reduce_op op);
/* In place: every rank's t := root's t. */
int mt_broadcast(mt_tensor *t, int root);
/* A new tensor [world_size, ...t's shape]: row r is rank r's t. */
mt_tensor *mt_all_gather(const mt_tensor *t);
/* Started, not finished: t (or out) must not be read or written until mt_dist_wait. The
   work holds references to its tensors. NULL with an error set on failure. */
mt_dist_work *mt_all_reduce_async(mt_tensor *t, mt_reduce_op op);
mt_dist_work *mt_broadcast_async(mt_tensor *t, int root);
/* out: contiguous [world_size, ...t's shape], same dtype and device as t. */
mt_dist_work *mt_all_gather_async(mt_tensor *out, const mt_tensor *t);
/* Waits (bounded), finishes the result (FP16/BF16 rounding, averaging) and frees w. */
int mt_dist_wait(mt_dist_work *w);
/* True once w has finished on this rank (mt_dist_wait still needed); false on error too. */
bool mt_dist_work_done(mt_dist_work *w);

/* Data-parallel training over a parameter list (torch's DistributedDataParallel): at
   creation every rank checks that all ranks have the same parameters (count, dtypes,
   shapes; a mismatch is an error on every rank) and takes rank 0's values. The gradients
   are packed into buckets of about bucket_mb, in reverse order of the list (the order
   backward finishes them) and one dtype per bucket; a grad-ready hook on each parameter
   copies its gradient into its bucket, and a bucket's non-blocking all-reduce starts as soon
   as its last gradient is ready, while backward goes on (buckets start in index order, the
   same on every rank). mt_ddp_wait, after backward and before the optimizer step (or the
   scaler's unscale), starts what is left (a parameter no gradient reached this step takes
   part with the gradient it holds, as one accumulated under no_sync, or zeros: unused
   parameters never hang the job), waits (bounded), and writes the
   average over the ranks into each parameter's gradient (the division by the world size is
   folded into that copy), in the parameter's layout (parameters are dense: contiguous or
   channels-last). FP16/BF16 buckets are reduced in FP32. Every rank must run the same
   number of backward + mt_ddp_wait steps. The parameters are all on the CPU (MPI) or all on
   one CUDA device (NCCL): then the buckets live on that device, the initial broadcast and
   the averaging all-reduce (NCCL's average) are queued on its stream, and mt_ddp_wait never
   waits for the device. In a world of threads (mt_dist_init_thread) CUDA parameters only,
   and the parameter lists are not compared across ranks (there is no MPI to do it).
   A failed mt_ddp_wait changes no gradient (a device error while it writes them aside).
   When it failed on this rank alone (out of memory making the gradients it writes) the
   step stays open: calling mt_ddp_wait again finishes it. The gradient-ready hooks
   allocate nothing. When a collective failed (a timeout, a dead rank) the step
   is over. A backward that failed after some gradients reached their buckets cannot be run
   again (those gradients are final, as a hooked leaf's are): call mt_ddp_wait all the same,
   so that the ranks stay in step, then drop the gradients and skip the optimizer step. */
typedef struct mt_ddp mt_ddp;
/* How a CPU bucket's all-reduce advances while backward runs (MPI only moves a non-blocking
   collective inside MPI calls). HOOKS: every gradient-ready hook tests all buckets in flight
   (MPI_Testsome), no thread. THREAD: a communication thread per mt_ddp starts the buckets'
   all-reduces and tests them between naps (10-200 us) while backward computes; needs MPI at
   MPI_THREAD_MULTIPLE (mt_dist_init asks for it; mt_ddp_new fails with MT_ERR_UNSUPPORTED
   when MPI gave less). CUDA parameters ignore it (NCCL runs on its own stream), and so does
   a world of one without a launcher (no MPI: nothing is in flight). */
typedef enum { MT_DDP_PROGRESS_HOOKS = 0, MT_DDP_PROGRESS_THREAD } mt_ddp_progress;
typedef struct {
    double bucket_mb;         /* 0: 25 (MiB) */
    bool per_parameter;       /* one bucket, one all-reduce per parameter (for comparison) */
    bool no_overlap;          /* start every all-reduce in mt_ddp_wait instead of during backward */
    mt_ddp_progress progress; /* CPU buckets: default MT_DDP_PROGRESS_HOOKS */
} mt_ddp_opts;
/* The times of the last step are seconds on CLOCK_MONOTONIC (comparable with the caller's own
   clock_gettime(CLOCK_MONOTONIC) readings, e.g. around mt_backward), 0 when it did not happen.
   A completion time is when mixtape saw the request complete (MPI_Test*, MPI_Wait), an upper
   bound on when MPI finished it; CUDA buckets are queued, not waited for: no done times. */
typedef struct {
    int buckets;                 /* fixed at creation */
    int64_t allreduce_calls;     /* in the last step mt_ddp_wait finished */
    int64_t started_in_backward; /* of those, started (or handed to the communication
                                    thread) from a hook, before mt_ddp_wait */
    double wait_seconds;         /* spent in the last mt_ddp_wait */
    int64_t steps;               /* mt_ddp_wait calls that reduced */
    int64_t done_in_backward;    /* all-reduces seen complete before the last hook returned */
    double first_grad_time;      /* the first gradient-ready hook of the step began */
    double last_grad_time;       /* the last one returned: backward's end as mt_ddp sees it */
    double first_start_time;     /* bucket 0's all-reduce was started */
    double first_done_time;      /* bucket 0's all-reduce was seen complete */
    double last_done_time;       /* the last bucket's all-reduce was seen complete */
    double wait_begin_time;      /* mt_ddp_wait was called */
} mt_ddp_stats;
mt_ddp *mt_ddp_new(mt_tensor *const *params, int n, const mt_ddp_opts *opts);
int mt_ddp_wait(mt_ddp *d);
/* on: gradients accumulate locally (torch's no_sync) and mt_ddp_wait does nothing; the
   first backward after switching it off reduces the accumulated gradients. */
int mt_ddp_set_no_sync(mt_ddp *d, bool on);
int mt_ddp_stats_get(const mt_ddp *d, mt_ddp_stats *out);
/* Removes the hooks; NULL is fine, and so is a call after mt_dist_finalize. */
void mt_ddp_free(mt_ddp *d);
/* The found-inf flag of every step is all-reduced (max) over the ranks before the skip
   decision, so all ranks skip the same steps and keep the same scale. Needs mt_dist_init. */
int mt_grad_scaler_set_dist(mt_grad_scaler *s, bool on);

/* y = conv2d(x, W, b, opts), W [out, in / groups, kH, kW] and b [out] initialised like
   torch.nn.Conv2d (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kH * kW). */
typedef struct {
    mt_tensor *weight, *bias; /* bias NULL when made without */
    mt_conv2d_opts opts;      /* stride, padding, dilation, groups (opts NULL at init: defaults) */
} mt_conv2d_layer;
int mt_conv2d_layer_init(mt_conv2d_layer *l, int64_t in, int64_t out, int64_t kh, int64_t kw,
                         const mt_conv2d_opts *opts, bool bias, mt_dtype dt, mt_device dev);
mt_tensor *mt_conv2d_layer_forward(mt_conv2d_layer *l, mt_tensor *x);
void mt_conv2d_layer_free(mt_conv2d_layer *l);

#ifdef __cplusplus
}
#endif
#endif /* MIXTAPE_H */

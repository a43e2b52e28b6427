/* Convolution on the CUDA backend through cuDNN: forward, backward-data and backward-filter,
   F32/F64/F16/BF16 (low precision with FP32 compute and tensor-op math; F32 with FMA math
   unless TF32 is allowed, so F32 results match the CPU's), groups (depthwise included),
   stride, padding and dilation. Each call runs in one memory format (compute_format:
   channels-last when its input image, output image or filter is; NCHW for F64): every tensor is
   described with the canonical NCHW or NHWC strides of that format, and an operand of the other
   format is copied (stream-ordered temporaries of the caching allocator). The algorithm comes from
   cuDNN's heuristics (cudnnGet*Algorithm_v7), or, with MT_CUDNN_FIND=1 in the environment, from an
   exhaustive timed search (cudnnFind*AlgorithmEx, which waits for the device: counted as a host
   sync, once per problem); the choice is cached per problem in the device's cuDNN state. Workspaces
   come from the caching allocator and are given back right after the call is queued (stream order).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "cudnn_impl.h"

#define FIND_WORKSPACE_CAP ((size_t)64 << 20)

typedef struct {
    cudnnTensorDescriptor_t x, y; /* the image operands: x (or gx), y (or gy) */
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} descs;

/* The operands of one call: x-side, w, y-side device pointers (one of them the output). */
typedef struct {
    mt_cudnn_conv_kind kind;
    void *x, *w, *y;
    size_t out_bytes; /* of the output operand */
    bool accumulate;  /* the output is added to: a search must not write it */
} operands;

static cudnnDataType_t dnn_dtype(mt_dtype dt) {
    switch (dt) {
    case MT_F64:
        return CUDNN_DATA_DOUBLE;
    case MT_F16:
        return CUDNN_DATA_HALF;
    case MT_BF16:
        return CUDNN_DATA_BFLOAT16;
    default:
        return CUDNN_DATA_FLOAT;
    }
}

static cudnnMathType_t math_of(mt_dtype dt) {
    if (dt == MT_F16 || dt == MT_BF16) return CUDNN_TENSOR_OP_MATH;
    if (dt == MT_F32 && !mt_cuda_allow_tf32()) return CUDNN_FMA_MATH; /* no TF32 */
    return CUDNN_DEFAULT_MATH;
}

/* The canonical strides of the format; true when t's memory is laid out that way (strides of
   size-1 dims do not matter). */
static bool dense_as(const mt_tensor *t, bool cl, int64_t *strides) {
    if (cl)
        mt_channels_last_strides(t->shape, strides);
    else
        mt_contiguous_strides(4, t->shape, strides);
    for (int i = 0; i < 4; i++)
        if (t->shape[i] > 1 && t->strides[i] != strides[i]) return false;
    return true;
}

/* t itself when it is dense in the format, else a copy in it (*tmp holds it). */
static const mt_tensor *in_format(const char *op, const mt_tensor *t, bool cl, mt_tensor **tmp) {
    int64_t s[4];
    *tmp = NULL;
    if (dense_as(t, cl, s)) return t;
    *tmp = mt_tensor_new_format(op, t->shape, t->dtype, t->device, cl);
    if (!*tmp) return NULL;
    if (mt_cuda_backend.copy(*tmp, t)) {
        mt_tensor_unref(*tmp);
        *tmp = NULL;
        return NULL;
    }
    return *tmp;
}

static int int_dims(const char *op, const mt_tensor *t, bool cl, int *dims, int *strides) {
    int64_t s[4];
    dense_as(t, cl, s);
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] > INT_MAX || s[i] > INT_MAX)
            return mt_error_set(MT_ERR_UNSUPPORTED,
                                "%s: a tensor of %lld elements exceeds cuDNN's 32-bit sizes", op,
                                (long long)t->numel);
        dims[i] = (int)t->shape[i];
        strides[i] = (int)s[i];
    }
    return 0;
}

static void descs_free(const mt_cudnn_api *api, descs *d) {
    if (d->x) api->destroy_tensor(d->x);
    if (d->y) api->destroy_tensor(d->y);
    if (d->w) api->destroy_filter(d->w);
    if (d->conv) api->destroy_conv(d->conv);
}

/* Descriptors of x-side, w and y-side, all in format cl. */
static int descs_make(const char *op, const mt_cudnn_api *api, descs *d, const mt_tensor *x,
                      const mt_tensor *w, const mt_tensor *y, const mt_conv2d_params *p, bool cl,
                      cudnnMathType_t math) {
    memset(d, 0, sizeof *d);
    cudnnDataType_t dt = dnn_dtype(x->dtype);
    int xd[4], xs[4], yd[4], ys[4], wd[4], ws[4];
    int rc = int_dims(op, x, cl, xd, xs);
    if (!rc) rc = int_dims(op, y, cl, yd, ys);
    if (!rc) rc = int_dims(op, w, cl, wd, ws);
    for (int i = 0; i < 2 && !rc; i++)
        if (p->padding[i] > INT_MAX || p->stride[i] > INT_MAX || p->dilation[i] > INT_MAX ||
            p->groups > INT_MAX)
            rc = mt_error_set(MT_ERR_UNSUPPORTED, "%s: geometry exceeds cuDNN's 32-bit sizes", op);
    if (rc) return rc;
#define DNN(call, what)                                                                            \
    if (!rc) rc = mt_cudnn_check(op, what, call)
    DNN(api->create_tensor(&d->x), "cudnnCreateTensorDescriptor");
    DNN(api->create_tensor(&d->y), "cudnnCreateTensorDescriptor");
    DNN(api->create_filter(&d->w), "cudnnCreateFilterDescriptor");
    DNN(api->create_conv(&d->conv), "cudnnCreateConvolutionDescriptor");
    DNN(api->set_tensor_nd(d->x, dt, 4, xd, xs), "cudnnSetTensorNdDescriptor");
    DNN(api->set_tensor_nd(d->y, dt, 4, yd, ys), "cudnnSetTensorNdDescriptor");
    DNN(api->set_filter_4d(d->w, dt, cl ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, wd[0], wd[1],
                           wd[2], wd[3]),
        "cudnnSetFilter4dDescriptor");
    DNN(api->set_conv_2d(d->conv, (int)p->padding[0], (int)p->padding[1], (int)p->stride[0],
                         (int)p->stride[1], (int)p->dilation[0], (int)p->dilation[1],
                         CUDNN_CROSS_CORRELATION,
                         x->dtype == MT_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
    DNN(api->set_conv_groups(d->conv, (int)p->groups), "cudnnSetConvolutionGroupCount");
    DNN(api->set_conv_math(d->conv, math), "cudnnSetConvolutionMathType");
#undef DNN
    return rc;
}

/* ---- algorithm choice */

typedef struct {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnMathType_t math;
} perf;

#define MAX_ALGOS 8 /* >= each of CUDNN_CONVOLUTION_{FWD,BWD_DATA,BWD_FILTER}_ALGO_COUNT */

/* Copies cuDNN's perf results (three struct types of the same leading fields) into out. */
#define COPY_PERF(out, in, n)                                                                      \
    for (int i_ = 0; i_ < (n); i_++) (out)[i_] = (perf) {                                          \
            (int)(in)[i_].algo, (in)[i_].status, (in)[i_].memory, (in)[i_].mathType                \
        }

static int heuristics(const char *op, const mt_cudnn_api *api, cudnnHandle_t h, const descs *d,
                      mt_cudnn_conv_kind kind, perf *out, int *n) {
    cudnnStatus_t s;
    if (kind == MT_CUDNN_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        s = api->fwd_algo_v7(h, d->x, d->w, d->conv, d->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, r);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    } else if (kind == MT_CUDNN_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        s = api->bwd_data_algo_v7(h, d->w, d->y, d->conv, d->x,
                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, r);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        s = api->bwd_filter_algo_v7(h, d->x, d->y, d->conv, d->w,
                                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, r);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    }
    return mt_cudnn_check(op, "cudnnGetConvolution*Algorithm_v7", s);
}

/* cudnnFind*AlgorithmEx runs every algorithm on the real operands (it writes the output,
   which the call that follows overwrites) and waits for the device. */
static int find(const char *op, const mt_cudnn_api *api, cudnnHandle_t h, mt_cuda_device_ctx *c,
                const descs *d, const operands *o, perf *out, int *n) {
    size_t wsb = FIND_WORKSPACE_CAP;
    void *ws = NULL;
    while (wsb >= ((size_t)1 << 20) && !(ws = mt_cuda_alloc(c->device, wsb))) wsb /= 2;
    if (!ws) wsb = 0;
    /* the forward with a bias accumulates into y, which holds the bias: search on a scratch */
    void *scratch = o->accumulate ? mt_cuda_alloc(c->device, o->out_bytes) : NULL;
    if (o->accumulate && !scratch) {
        if (ws) mt_cuda_free(c->device, ws, wsb);
        return mt_error_set(MT_ERR_OOM, "%s: out of device memory for a cuDNN search", op);
    }
    mt_host_sync_counted();
    cudnnStatus_t s;
    if (o->kind == MT_CUDNN_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        s = api->fwd_find(h, d->x, o->x, d->w, o->w, d->conv, d->y, scratch ? scratch : o->y,
                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, r, ws, wsb);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    } else if (o->kind == MT_CUDNN_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        s = api->bwd_data_find(h, d->w, o->w, d->y, o->y, d->conv, d->x, o->x,
                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, r, ws, wsb);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        s = api->bwd_filter_find(h, d->x, o->x, d->y, o->y, d->conv, d->w, o->w,
                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, r, ws, wsb);
        if (s == CUDNN_STATUS_SUCCESS) COPY_PERF(out, r, *n);
    }
    if (ws) mt_cuda_free(c->device, ws, wsb);
    if (scratch) mt_cuda_free(c->device, scratch, o->out_bytes);
    return mt_cudnn_check(op, "cudnnFindConvolution*AlgorithmEx", s);
}

static bool find_mode(void) {
    const char *e = getenv("MT_CUDNN_FIND");
    return e && *e && strcmp(e, "0") != 0;
}

static int workspace_size(const char *op, const mt_cudnn_api *api, cudnnHandle_t h, const descs *d,
                          mt_cudnn_conv_kind kind, int algo, size_t *out) {
    cudnnStatus_t s =
        kind == MT_CUDNN_FWD
            ? api->fwd_workspace(h, d->x, d->w, d->conv, d->y, (cudnnConvolutionFwdAlgo_t)algo, out)
        : kind == MT_CUDNN_BWD_DATA
            ? api->bwd_data_workspace(h, d->w, d->y, d->conv, d->x,
                                      (cudnnConvolutionBwdDataAlgo_t)algo, out)
            : api->bwd_filter_workspace(h, d->x, d->y, d->conv, d->w,
                                        (cudnnConvolutionBwdFilterAlgo_t)algo, out);
    return mt_cudnn_check(op, "cudnnGetConvolution*WorkspaceSize", s);
}

/* The algorithm for the problem: cached, or chosen now (and cached). The descriptor's math
   type becomes the chosen one's, except that F32 keeps FMA math when TF32 is not allowed. */
static int choose(const char *op, const mt_cudnn_api *api, cudnnHandle_t h, mt_cuda_device_ctx *c,
                  const descs *d, const operands *o, const mt_cudnn_conv_key *key,
                  mt_cudnn_conv_algo *a) {
    if (mt_cudnn_algo_lookup(c, key, a))
        return mt_cudnn_check(op, "cudnnSetConvolutionMathType",
                              api->set_conv_math(d->conv, a->math));
    perf r[MAX_ALGOS];
    int n = 0;
    int rc =
        find_mode() ? find(op, api, h, c, d, o, r, &n) : heuristics(op, api, h, d, o->kind, r, &n);
    if (rc) return rc;
    int best = -1;
    for (int i = 0; i < n && best < 0; i++)
        if (r[i].status == CUDNN_STATUS_SUCCESS) best = i;
    if (best < 0)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "%s: cuDNN has no algorithm for this convolution on cuda:%d (%d "
                            "candidates, none usable)",
                            op, c->device, n);
    a->algo = r[best].algo;
    a->math = key->math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : r[best].math;
    rc = mt_cudnn_check(op, "cudnnSetConvolutionMathType", api->set_conv_math(d->conv, a->math));
    if (!rc) rc = workspace_size(op, api, h, d, o->kind, a->algo, &a->workspace);
    if (!rc) mt_cudnn_algo_store(c, key, a);
    return rc;
}

/* ---- one call */

typedef union {
    float f;
    double d;
} scalar;

static void scalars(mt_dtype dt, scalar *one, scalar *zero) {
    /* the compute type's scalars: double for DOUBLE data, float for every other */
    if (dt == MT_F64) {
        one->d = 1.0;
        zero->d = 0.0;
    } else {
        one->f = 1.0f;
        zero->f = 0.0f;
    }
}

static void key_init(mt_cudnn_conv_key *k, mt_cudnn_conv_kind kind, const mt_tensor *x,
                     const mt_tensor *w, const mt_tensor *y, bool cl, cudnnMathType_t math,
                     const mt_conv2d_params *p) {
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->dtype = x->dtype;
    k->channels_last = cl;
    k->math = math;
    memcpy(k->x, x->shape, sizeof k->x);
    memcpy(k->w, w->shape, sizeof k->w);
    memcpy(k->y, y->shape, sizeof k->y);
    k->p = *p;
}

static int queue(const mt_cudnn_api *api, cudnnHandle_t h, const descs *d, const operands *o,
                 const mt_cudnn_conv_algo *a, void *ws, const scalar *one, const scalar *zero) {
    switch (o->kind) {
    case MT_CUDNN_FWD:
        return api->conv_fwd(h, one, d->x, o->x, d->w, o->w, d->conv,
                             (cudnnConvolutionFwdAlgo_t)a->algo, ws, a->workspace, zero, d->y,
                             o->y);
    case MT_CUDNN_BWD_DATA:
        return api->conv_bwd_data(h, one, d->w, o->w, d->y, o->y, d->conv,
                                  (cudnnConvolutionBwdDataAlgo_t)a->algo, ws, a->workspace, zero,
                                  d->x, o->x);
    default:
        return api->conv_bwd_filter(h, one, d->x, o->x, d->y, o->y, d->conv,
                                    (cudnnConvolutionBwdFilterAlgo_t)a->algo, ws, a->workspace,
                                    zero, d->w, o->w);
    }
}

static const char *const call_names[] = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                         "cudnnConvolutionBackwardFilter"};

/* Queues one convolution in format cl; x, w and y (one of them the output) are dense in it.
   accumulate: the output is added to (beta 1), else overwritten (beta 0, never read). */
static int conv_call(const char *op, mt_cudnn_conv_kind kind, const mt_tensor *x,
                     const mt_tensor *w, const mt_tensor *y, bool cl, const mt_conv2d_params *p,
                     bool accumulate) {
    mt_cuda_device_ctx *c = mt_cuda_ctx_get(op, x->device.index);
    cudnnHandle_t h = c ? mt_cudnn_handle(op, c) : NULL;
    if (!h) return mt_last_status();
    const mt_cudnn_api *api = mt_cudnn_load(op, c->device);
    cudnnMathType_t math = math_of(x->dtype);
    descs d;
    int rc = descs_make(op, api, &d, x, w, y, p, cl, math);
    const mt_tensor *out = kind == MT_CUDNN_FWD ? y : kind == MT_CUDNN_BWD_DATA ? x : w;
    operands o = {kind,
                  mt_tensor_data(x),
                  mt_tensor_data(w),
                  mt_tensor_data(y),
                  (size_t)out->numel * mt_dtype_size(out->dtype),
                  accumulate};
    mt_cudnn_conv_key key;
    key_init(&key, kind, x, w, y, cl, math, p);
    mt_cudnn_conv_algo a = {0};
    if (!rc) rc = choose(op, api, h, c, &d, &o, &key, &a);
    void *ws = NULL;
    if (!rc && a.workspace > 0 && !(ws = mt_cuda_alloc(c->device, a.workspace)))
        rc = mt_error_set(MT_ERR_OOM, "%s: out of device memory for a cuDNN workspace of %zu bytes",
                          op, a.workspace);
    if (!rc) {
        scalar one, zero;
        scalars(x->dtype, &one, &zero);
        rc = mt_cudnn_check(op, call_names[kind],
                            queue(api, h, &d, &o, &a, ws, &one, accumulate ? &one : &zero));
    }
    if (ws) mt_cuda_free(c->device, ws, a.workspace); /* stream order keeps it for the call */
    descs_free(api, &d);
    return rc;
}

/* y = b broadcast over N, H and W (a stride-0 view copied by the elementwise kernel): the
   forward then adds the convolution with beta = 1, so a low-precision output is rounded once
   from FP32 (conv + bias), as torch's fused bias, not twice. */
static int fill_bias(mt_tensor *y, const mt_tensor *b) {
    int64_t strides[4] = {0, b->strides[0], 0, 0};
    mt_tensor h;
    mt_tensor_header_init(&h, b->storage, b->dtype, 4, y->shape, strides, b->offset);
    return mt_cuda_backend.copy(y, &h);
}

/* ---- the three families */

/* The format a call computes in: channels-last when the input image (x, or gx), the output
   image (y; NULL for the backward calls) or the filter (w, or gw) prefers it, as torch's
   cudnn_conv_suggest_memory_format looks at input and weight, so nothing is copied where a
   tensor is both formats at once (1x1 filters, 1x1 spatial maps). The output gradient is not
   asked: mt_conv2d makes it in the forward's format. F64 always runs NCHW (cuDNN's double
   convolutions are its NCHW kernels; channels-last is a tensor-core layout). */
static bool compute_format(const mt_tensor *x, const mt_tensor *y, const mt_tensor *w) {
    return x->dtype != MT_F64 && (mt_prefers_channels_last(x) || mt_prefers_channels_last(y) ||
                                  mt_prefers_channels_last(w));
}

/* t itself when it is dense in the format, else a new tensor in it (*tmp holds it: the caller
   copies it to t after the call). */
static mt_tensor *out_format(const char *op, mt_tensor *t, bool cl, mt_tensor **tmp) {
    int64_t s[4];
    *tmp = NULL;
    if (dense_as(t, cl, s)) return t;
    *tmp = mt_tensor_new_format(op, t->shape, t->dtype, t->device, cl);
    return *tmp;
}

/* Copies a temporary output back to the caller's tensor, and drops the temporaries. */
static int finish(int rc, mt_tensor *out, mt_tensor *tout, mt_tensor *t1, mt_tensor *t2) {
    if (rc == 0 && tout) rc = mt_cuda_backend.copy(out, tout);
    mt_tensor_unref(tout);
    mt_tensor_unref(t1);
    mt_tensor_unref(t2);
    return rc;
}

int mt_cuda_conv2d(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                   const mt_conv2d_params *p) {
    const char *op = "mt_conv2d";
    if (y->numel == 0) return 0;
    bool cl = compute_format(x, y, w);
    mt_tensor *ty, *tx = NULL, *tw = NULL;
    mt_tensor *yo = out_format(op, y, cl, &ty);
    int rc = !yo ? mt_last_status() : b ? fill_bias(yo, b) : 0;
    if (rc == 0 && (x->numel == 0 || w->numel == 0)) { /* no input channel: an empty sum */
        if (!b) rc = mt_cuda_backend.fill(yo, 0.0);
    } else if (rc == 0) {
        const mt_tensor *xi = in_format(op, x, cl, &tx);
        const mt_tensor *wi = xi ? in_format(op, w, cl, &tw) : NULL;
        rc = wi ? conv_call(op, MT_CUDNN_FWD, xi, wi, yo, cl, p, b != NULL) : mt_last_status();
    }
    return finish(rc, y, ty, tx, tw);
}

int mt_cuda_conv2d_backward_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                 const mt_conv2d_params *p) {
    const char *op = "mt_conv2d";
    if (gx->numel == 0) return 0;
    bool cl = compute_format(gx, NULL, w);
    mt_tensor *tx, *tg = NULL, *tw = NULL;
    mt_tensor *xo = out_format(op, gx, cl, &tx);
    const mt_tensor *gi = xo ? in_format(op, gy, cl, &tg) : NULL;
    const mt_tensor *wi = gi ? in_format(op, w, cl, &tw) : NULL;
    int rc = wi ? conv_call(op, MT_CUDNN_BWD_DATA, xo, wi, gi, cl, p, false) : mt_last_status();
    return finish(rc, gx, tx, tg, tw);
}

/* The weight gradient is computed in compute_format, then copied to gw's format when they
   differ. */
int mt_cuda_conv2d_backward_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                   const mt_conv2d_params *p) {
    const char *op = "mt_conv2d";
    if (gw->numel == 0) return 0;
    bool cl = compute_format(x, NULL, gw);
    mt_tensor *tw, *tg = NULL, *tx = NULL;
    mt_tensor *wo = out_format(op, gw, cl, &tw);
    const mt_tensor *gi = wo ? in_format(op, gy, cl, &tg) : NULL;
    const mt_tensor *xi = gi ? in_format(op, x, cl, &tx) : NULL;
    int rc = xi ? conv_call(op, MT_CUDNN_BWD_FILTER, xi, wo, gi, cl, p, false) : mt_last_status();
    return finish(rc, gw, tw, tg, tx);
}

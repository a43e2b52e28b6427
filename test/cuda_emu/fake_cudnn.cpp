// The cuDNN functions mixtape calls, for the emulated device. This file: handles, tensor,
// filter and convolution descriptors and the shared helpers; fake_cudnn_conv.cpp: the
// convolutions; fake_cudnn_pool.cpp: pooling forward; fake_cudnn_bn.cpp: batch norm, plain
// and fused (Ex), in training and inference. Compiled
// against the toolkit's cudnn.h, so the compiler checks every signature against the real
// library's.
//
// The computations are queued on the handle's stream (mtemu::enqueue) and run on the host
// when the stream runs, as direct loops: a reference, not fast. Convolutions accumulate in the
// compute type (float, or double for DOUBLE), batch norm in double;
// F16/BF16 through src/math/half.h, each output rounded once. FLOAT data with a math type
// other than CUDNN_FMA_MATH has its inputs rounded to TF32 first, as tensor cores would, so a
// TF32 path taken by accident shows as FP32 error in the tests.
//
// Every descriptor and argument is checked; a violation is a CUDNN_STATUS_BAD_PARAM (or
// NOT_SUPPORTED for what this fake does not model) after one stderr line:
// - descriptors: made by cudnnCreate*, set before use, positive sizes and strides, dtypes
//   FLOAT, DOUBLE, HALF or BFLOAT16; 4-d only for convolutions and batch norm (whose x and y
//   must be 4-d or 5-d, as cuDNN documents, and the same, dims and strides);
// - a convolution's x, filter and y share one data type; compute type FLOAT for FLOAT, HALF
//   and BFLOAT16 data (HALF also with HALF), DOUBLE for DOUBLE; x's channels = filter's
//   channels * groups, filter count divisible by groups, y's dims = cuDNN's output formula;
// - x and y are fully packed NCHW, or both fully packed NHWC, and the filter's format is the
//   same (stricter than cuDNN, which takes some mixed layouts: mixtape never mixes them);
//   DOUBLE in NCHW only; batch norm of HALF, FLOAT or DOUBLE data;
// - every data pointer non-NULL and its whole extent inside one device allocation; the
//   workspace at least what cudnnGetConvolution*WorkspaceSize says for the algorithm, and in
//   device memory. The workspace is overwritten with garbage by the call, so a caller that
//   aliases it with an operand gets a wrong answer.
// - alpha and beta are host pointers read as the compute type's scalar; beta == 0 never reads
//   the output (fresh device memory is NaN, so a read would show).
// Fault injection for tests of the library's error mapping: MTEMU_CUDNN_FAIL="name=status"
// makes the entry point `name` return `status` (a number) without doing anything.
// Not modelled: cuDNN's algorithms and numerics (every algorithm computes the same loops; the
// workspace sizes are made up, and non-zero for the heuristics' first choices so that the
// workspace path is exercised), pooling backward, batch norm other than spatial (training
// forward and backward, inference), NCHW_VECT_C, INT8.
#include "fake_cudnn_internal.h"

#include <algorithm>
#include <mutex>
#include <set>

namespace {

std::mutex lock;
std::set<const void *> live; // handles and descriptors made and not destroyed

} // namespace

namespace fakednn {

const char *status_name(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
        return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR:
        return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
        return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED:
        return "CUDNN_STATUS_EXECUTION_FAILED";
    default:
        return "CUDNN_STATUS_UNKNOWN (a code this fake does not name)";
    }
}

cudnnStatus_t fail(cudnnStatus_t s, const char *fmt, ...) {
    MTEMU_FORMAT(what, fmt);
    std::fprintf(stderr, "mtemu: %s: %s\n", what, status_name(s));
    return s;
}

cudnnStatus_t injected(const char *name) {
    const char *v = std::getenv("MTEMU_CUDNN_FAIL");
    size_t n = std::strlen(name);
    if (!v || std::strncmp(v, name, n) != 0 || v[n] != '=') return CUDNN_STATUS_SUCCESS;
    int s = std::atoi(v + n + 1);
    if (s == 0) return CUDNN_STATUS_SUCCESS;
    return fail(static_cast<cudnnStatus_t>(s), "%s: failure injected by MTEMU_CUDNN_FAIL", name);
}

bool is_live(const void *p) {
    std::lock_guard<std::mutex> g(lock);
    return p && live.count(p);
}

void track(const void *p) {
    std::lock_guard<std::mutex> g(lock);
    live.insert(p);
}

bool untrack(const void *p) {
    std::lock_guard<std::mutex> g(lock);
    return live.erase(p) != 0;
}

size_t dtype_size(cudnnDataType_t dt) {
    switch (dt) {
    case CUDNN_DATA_FLOAT:
        return 4;
    case CUDNN_DATA_DOUBLE:
        return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
        return 2;
    default:
        return 0;
    }
}

float tf32(float x) { // 10 mantissa bits, to nearest even; inf and nan kept
    uint32_t u = mt_f32_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += 0xfffu + ((u >> 13) & 1u);
    return mt_bits_f32(u & ~0x1fffu);
}

double load(const char *p, cudnnDataType_t dt, int64_t i) {
    switch (dt) {
    case CUDNN_DATA_DOUBLE:
        return reinterpret_cast<const double *>(p)[i];
    case CUDNN_DATA_HALF:
        return mt_f16_to_f32(reinterpret_cast<const uint16_t *>(p)[i]);
    case CUDNN_DATA_BFLOAT16:
        return mt_bf16_to_f32(reinterpret_cast<const uint16_t *>(p)[i]);
    default:
        return reinterpret_cast<const float *>(p)[i];
    }
}

void store(char *p, cudnnDataType_t dt, int64_t i, double v) {
    switch (dt) {
    case CUDNN_DATA_DOUBLE:
        reinterpret_cast<double *>(p)[i] = v;
        break;
    case CUDNN_DATA_HALF:
        reinterpret_cast<uint16_t *>(p)[i] = mt_f32_to_f16(static_cast<float>(v));
        break;
    case CUDNN_DATA_BFLOAT16:
        reinterpret_cast<uint16_t *>(p)[i] = mt_f32_to_bf16(static_cast<float>(v));
        break;
    default:
        reinterpret_cast<float *>(p)[i] = static_cast<float>(v);
        break;
    }
}

// The bytes a tensor spans (largest offset + 1 element).
size_t span_bytes(const int *dims, const int *strides, int nd, cudnnDataType_t dt) {
    int64_t last = 0;
    for (int i = 0; i < nd; i++) last += static_cast<int64_t>(dims[i] - 1) * strides[i];
    return static_cast<size_t>(last + 1) * dtype_size(dt);
}

cudnnStatus_t check_memory(const char *api, const char *name, const void *p, size_t bytes) {
    if (!p) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: %s is NULL", api, name);
    if (mtemu::device_range(p, bytes)) return CUDNN_STATUS_SUCCESS;
    return fail(CUDNN_STATUS_BAD_PARAM,
                "%s: %s (%p, %zu bytes) is not inside one live device allocation", api, name, p,
                bytes);
}

cudnnStatus_t check_handle(const char *api, cudnnHandle_t h) {
    if (is_live(h)) return CUDNN_STATUS_SUCCESS;
    return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)h);
}

cudnnStatus_t check_live(const char *api, const void *d) {
    if (is_live(d)) return CUDNN_STATUS_SUCCESS;
    return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, d);
}

// Only the first nd dims and strides count: a descriptor set again with fewer dims keeps stale
// values past them.
bool same_desc(const cudnnTensorStruct *a, const cudnnTensorStruct *b) {
    size_t n = sizeof(int) * static_cast<size_t>(a->nd);
    return a->dt == b->dt && a->nd == b->nd && std::memcmp(a->dims, b->dims, n) == 0 &&
           std::memcmp(a->strides, b->strides, n) == 0;
}

bool packed(const cudnnTensorStruct *t, bool nhwc) {
    const int *d = t->dims, *s = t->strides;
    if (t->nd != 4) return false;
    if (nhwc) return s[1] == 1 && s[3] == d[1] && s[2] == d[3] * d[1] && s[0] == d[2] * d[3] * d[1];
    return s[3] == 1 && s[2] == d[3] && s[1] == d[2] * d[3] && s[0] == d[1] * d[2] * d[3];
}

cudnnStatus_t check_host_scalars(const char *api, std::initializer_list<const void *> ps,
                                 cudnnStatus_t null_status) {
    for (const void *p : ps) // every NULL first: its status may differ
        if (!p) return fail(null_status, "%s: a blend factor (alpha, beta, ...) is NULL", api);
    for (const void *p : ps)
        if (mtemu::device_range(p, 1))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: the blend factors must be host pointers", api);
    return CUDNN_STATUS_SUCCESS;
}

double scalar(const void *p, bool f64) {
    return f64 ? *static_cast<const double *>(p) : *static_cast<const float *>(p);
}

} // namespace fakednn

using namespace fakednn;

// ---------------------------------------------------------------- handles and descriptors
extern "C" {

const char *cudnnGetErrorString(cudnnStatus_t status) {
    return status_name(status);
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    cudnnStatus_t st = injected("cudnnCreate");
    return st != CUDNN_STATUS_SUCCESS ? st : make("cudnnCreate", handle);
}

// Queued work holds no reference to the handle, so destroying it with work pending is safe.
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    cudnnStatus_t st = check_handle("cudnnDestroy", handle);
    return st != CUDNN_STATUS_SUCCESS ? st : destroy("cudnnDestroy", handle);
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    cudnnStatus_t st = check_handle("cudnnSetStream", handle);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    handle->stream = streamId;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
    if (!is_live(handle) || !streamId)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: bad handle or result");
    *streamId = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
    return make("cudnnCreateTensorDescriptor", d);
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    return destroy("cudnnDestroyTensorDescriptor", d);
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
    return make("cudnnCreateFilterDescriptor", d);
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    return destroy("cudnnDestroyFilterDescriptor", d);
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
    return make("cudnnCreateConvolutionDescriptor", d);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
    return destroy("cudnnDestroyConvolutionDescriptor", d);
}

cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t dataType,
                                         int nbDims, const int dimA[], const int strideA[]) {
    const char *api = "cudnnSetTensorNdDescriptor";
    cudnnStatus_t st = check_live(api, d);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!dimA || !strideA)
        return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL dims or strides", api);
    if (dtype_size(dataType) == 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: data type %d is not emulated", api, dataType);
    if (nbDims < 3 || nbDims > CUDNN_DIM_MAX)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: %d dims", api, nbDims);
    int64_t elems = 1;
    for (int i = 0; i < nbDims; i++) {
        if (dimA[i] <= 0 || strideA[i] <= 0)
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: dim %d is %d with stride %d", api, i, dimA[i],
                        strideA[i]);
        elems *= dimA[i];
    }
    if (elems > INT32_MAX)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: more than 2^31 elements", api);
    d->dt = dataType;
    d->nd = nbDims;
    std::copy(dimA, dimA + nbDims, d->dims);
    std::copy(strideA, strideA + nbDims, d->strides);
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
    const char *api = "cudnnSetFilter4dDescriptor";
    cudnnStatus_t st = check_live(api, d);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (dtype_size(dataType) == 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: data type %d is not emulated", api, dataType);
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: format %d is not emulated", api, format);
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: dims %d x %d x %d x %d", api, k, c, h, w);
    *d = cudnnFilterStruct{true, dataType, format, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    const char *api = "cudnnSetConvolution2dDescriptor";
    cudnnStatus_t st = check_live(api, d);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: pad %d,%d stride %d,%d dilation %d,%d", api, pad_h,
                    pad_w, u, v, dilation_h, dilation_w);
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", api, mode);
    if (dtype_size(computeType) == 0 || computeType == CUDNN_DATA_BFLOAT16)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: compute type %d", api, computeType);
    d->pad = {pad_h, pad_w};
    d->stride = {u, v};
    d->dilation = {dilation_h, dilation_w};
    d->mode = mode;
    d->compute = computeType;
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groupCount) {
    if (!is_live(d) || groupCount < 1)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: %d groups", groupCount);
    d->groups = groupCount;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
    if (!is_live(d) || (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH &&
                        m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && m != CUDNN_FMA_MATH))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: math type %d", m);
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"

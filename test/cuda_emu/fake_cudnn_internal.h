// The fake cuDNN's shared parts (fake_cudnn.cpp): the descriptor structs, the registry of live
// handles and descriptors, element access and the common checks, used by the convolution
// (fake_cudnn_conv.cpp), pooling (fake_cudnn_pool.cpp) and batch norm (fake_cudnn_bn.cpp)
// files.
#ifndef FAKE_CUDNN_INTERNAL_H
#define FAKE_CUDNN_INTERNAL_H
#include "mtemu_internal.h"

#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

// half.h before the toolkit headers: its locals named `half` would shadow cuda_fp16.h's type
#include "../../src/math/half.h"

#include <cudnn.h>

struct cudnnContext {
    cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
    bool set = false;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    int nd = 0;
    int dims[CUDNN_DIM_MAX] = {0};
    int strides[CUDNN_DIM_MAX] = {0};
};

struct cudnnFilterStruct {
    bool set = false;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
    int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
    bool set = false;
    std::array<int, 2> pad = {0, 0}, stride = {1, 1}, dilation = {1, 1};
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    int groups = 1;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

struct cudnnPoolingStruct {
    bool set = false;
    cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
    cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
    std::array<int, 2> window = {1, 1}, pad = {0, 0}, stride = {1, 1};
};

struct cudnnActivationStruct {
    bool set = false;
    cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
    cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
    double coef = 0;
};

namespace fakednn {

const char *status_name(cudnnStatus_t s);
// One line on stderr in mtemu::report's format, then the status: a misuse must be loud.
cudnnStatus_t fail(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// MTEMU_CUDNN_FAIL="name=status": the injected status of entry point `name`, or SUCCESS.
cudnnStatus_t injected(const char *name);
// The registry of handles and descriptors made and not destroyed.
bool is_live(const void *p);
void track(const void *p);
bool untrack(const void *p);

template <class T> cudnnStatus_t make(const char *api, T **out) {
    if (!out) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null result pointer", api);
    T *p = new T;
    track(p);
    *out = p;
    return CUDNN_STATUS_SUCCESS;
}

template <class T> cudnnStatus_t destroy(const char *api, T *p) {
    if (!p) return CUDNN_STATUS_SUCCESS; // as cuDNN: destroying NULL is a no-op
    if (!untrack(p)) return fail(CUDNN_STATUS_BAD_PARAM, "%s: %p is not live", api, (void *)p);
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

size_t dtype_size(cudnnDataType_t dt); // 0: not emulated
float tf32(float x);                   // 10 mantissa bits, to nearest even
double load(const char *p, cudnnDataType_t dt, int64_t i);
void store(char *p, cudnnDataType_t dt, int64_t i, double v);
// The bytes a tensor spans (largest offset + 1 element).
size_t span_bytes(const int *dims, const int *strides, int nd, cudnnDataType_t dt);
// p non-NULL and [p, p + bytes) inside one live device allocation.
cudnnStatus_t check_memory(const char *api, const char *name, const void *p, size_t bytes);
// The checks return SUCCESS (0) or the failure's status, so `(st = check()) || ...` chains stop
// at the first failure.
// A live handle.
cudnnStatus_t check_handle(const char *api, cudnnHandle_t h);
// A live descriptor of any kind, about to be set.
cudnnStatus_t check_live(const char *api, const void *d);
// A live descriptor of any kind that was set.
template <class D> cudnnStatus_t check_set(const char *api, const char *name, const D *d) {
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s descriptor %p is not live", api, name,
                    (const void *)d);
    if (!d->set) return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s descriptor was never set", api, name);
    return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t check_tensor(const char *api, const char *name, cudnnTensorDescriptor_t t) {
    return check_set(api, name, t);
}
// The same data type, dims and strides.
bool same_desc(const cudnnTensorStruct *a, const cudnnTensorStruct *b);
// 4-d and fully packed in NHWC (nhwc) or NCHW order.
bool packed(const cudnnTensorStruct *t, bool nhwc);
// The blend factors (alpha, beta, ...): each a host pointer; null_status for a NULL one.
cudnnStatus_t check_host_scalars(const char *api, std::initializer_list<const void *> ps,
                                 cudnnStatus_t null_status);
// A host scalar of the compute type: double for DOUBLE data, float otherwise.
double scalar(const void *p, bool f64);

} // namespace fakednn
#endif

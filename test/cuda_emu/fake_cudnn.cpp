// The cuDNN functions mixtape calls, for the emulated device. Compiled against the toolkit's
// cudnn.h, so the compiler checks every signature against the real library's.
//
// Convolutions (forward, backward data, backward filter) are queued on the
// handle's stream (mtemu::enqueue) and computed on the host when the stream runs, as direct
// loops: a reference, not fast. Accumulation in the compute type (float, or double for DOUBLE);
// F16/BF16 through src/math/half.h, each output rounded once. FLOAT data with a math type
// other than CUDNN_FMA_MATH has its inputs rounded to TF32 first, as tensor cores would, so a
// TF32 path taken by accident shows as FP32 error in the tests.
//
// Every descriptor and argument is checked; a violation is a CUDNN_STATUS_BAD_PARAM (or
// NOT_SUPPORTED for what this fake does not model) after one stderr line:
// - descriptors: made by cudnnCreate*, set before use, positive sizes and strides, dtypes
//   FLOAT, DOUBLE, HALF or BFLOAT16; 4-d only for convolutions;
// - a convolution's x, filter and y share one data type; compute type FLOAT for FLOAT, HALF
//   and BFLOAT16 data (HALF also with HALF), DOUBLE for DOUBLE; x's channels = filter's
//   channels * groups, filter count divisible by groups, y's dims = cuDNN's output formula;
// - x and y are fully packed NCHW, or both fully packed NHWC, and the filter's format is the
//   same (stricter than cuDNN, which takes some mixed layouts: mixtape never mixes them);
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
// workspace path is exercised), pooling backward, batch norm other than spatial training
// (forward and backward), NCHW_VECT_C, INT8.
#include "mtemu_internal.h"

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <initializer_list>
#include <set>
#include <utility>
#include <vector>

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
    int pad[2] = {0, 0}, stride[2] = {1, 1}, dilation[2] = {1, 1};
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    int groups = 1;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

struct cudnnPoolingStruct {
    bool set = false;
    cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
    cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
    int window[2] = {1, 1}, pad[2] = {0, 0}, stride[2] = {1, 1};
};

namespace {

std::mutex lock;
std::set<const void *> live; // handles and descriptors made and not destroyed

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

// One line on stderr in mtemu::report's format, then the status: a misuse must be loud.
cudnnStatus_t fail(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t fail(cudnnStatus_t s, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "mtemu: %s: %s\n", what, status_name(s));
    return s;
}

// MTEMU_CUDNN_FAIL="name=status": the injected status of entry point `name`, or SUCCESS.
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

template <class T> cudnnStatus_t make(const char *api, T **out) {
    if (!out) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null result pointer", api);
    T *p = new T;
    std::lock_guard<std::mutex> g(lock);
    live.insert(p);
    *out = p;
    return CUDNN_STATUS_SUCCESS;
}

template <class T> cudnnStatus_t destroy(const char *api, T *p) {
    if (!p) return CUDNN_STATUS_SUCCESS; // as cuDNN: destroying NULL is a no-op
    {
        std::lock_guard<std::mutex> g(lock);
        if (!live.erase(p))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: %p is not live", api, (void *)p);
    }
    delete p;
    return CUDNN_STATUS_SUCCESS;
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

// ---------------------------------------------------------------- element access

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

} // namespace

namespace {

// ---------------------------------------------------------------- convolution problems

// A validated convolution, by value (the descriptors may be destroyed while it is queued).
struct conv_problem {
    cudnnDataType_t dt;
    bool f64, tf32_inputs, nhwc, flip;
    int n, c, h, w; // x
    int k, r, s;    // filter: k x (c / groups) x r x s
    int oh, ow;     // y
    int groups;
    int pad[2], stride[2], dil[2];
    int xs[4], ys[4]; // element strides of x and y (NCHW order)
    int64_t fs[4];    // filter strides (NCHW order) from its format
    cudnnMathType_t math;
};

bool packed(const cudnnTensorStruct *t, bool nhwc) {
    const int *d = t->dims, *s = t->strides;
    if (nhwc) return s[1] == 1 && s[3] == d[1] && s[2] == d[3] * d[1] && s[0] == d[2] * d[3] * d[1];
    return s[3] == 1 && s[2] == d[3] && s[1] == d[2] * d[3] && s[0] == d[1] * d[2] * d[3];
}

cudnnStatus_t check_tensor(const char *api, const char *name, cudnnTensorDescriptor_t t) {
    if (!is_live(t))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s descriptor %p is not live", api, name,
                    (void *)t);
    if (!t->set) return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s descriptor was never set", api, name);
    return CUDNN_STATUS_SUCCESS;
}

// The problem of (x, w, conv, y) with x and y in the roles of the forward; SUCCESS or a status.
cudnnStatus_t conv_check(const char *api, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                         cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t cd,
                         cudnnTensorDescriptor_t y, conv_problem *p) {
    if (!is_live(h))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)h);
    cudnnStatus_t st = check_tensor(api, "x", x);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "y", y);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!is_live(w) || !w->set)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: filter descriptor not live or not set", api);
    if (!is_live(cd) || !cd->set)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: convolution descriptor not live or not set", api);
    if (x->nd != 4 || y->nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "%s: only 4-d convolutions are emulated (x %d-d, y %d-d)", api, x->nd, y->nd);
    if (x->dt != w->dt || y->dt != w->dt)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: data types differ: x %d, filter %d, y %d", api,
                    x->dt, w->dt, y->dt);
    cudnnDataType_t dt = x->dt, ct = cd->compute;
    bool ok = (dt == CUDNN_DATA_DOUBLE && ct == CUDNN_DATA_DOUBLE) ||
              (dt == CUDNN_DATA_FLOAT && ct == CUDNN_DATA_FLOAT) ||
              (dt == CUDNN_DATA_HALF && (ct == CUDNN_DATA_FLOAT || ct == CUDNN_DATA_HALF)) ||
              (dt == CUDNN_DATA_BFLOAT16 && ct == CUDNN_DATA_FLOAT);
    if (!ok)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: data type %d with compute type %d", api, dt, ct);
    p->nhwc = w->format == CUDNN_TENSOR_NHWC;
    if (!packed(x, p->nhwc) || !packed(y, p->nhwc))
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "%s: x and y must both be fully packed %s, as the filter's format (mixed or "
                    "strided layouts are not emulated)",
                    api, p->nhwc ? "NHWC" : "NCHW");
    int g = cd->groups;
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->h = x->dims[2];
    p->w = x->dims[3];
    p->k = w->k;
    p->r = w->h;
    p->s = w->w;
    p->groups = g;
    if (w->c * g != p->c || p->k % g != 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: x has %d channels, filter %d x %d (groups %d)",
                    api, p->c, p->k, w->c, g);
    int out[2];
    for (int i = 0; i < 2; i++) {
        int in = i ? p->w : p->h, ks = i ? p->s : p->r;
        int span = (ks - 1) * cd->dilation[i] + 1;
        out[i] = (in + 2 * cd->pad[i] - span) / cd->stride[i] + 1;
        if (in + 2 * cd->pad[i] < span) out[i] = 0;
        p->pad[i] = cd->pad[i];
        p->stride[i] = cd->stride[i];
        p->dil[i] = cd->dilation[i];
    }
    if (y->dims[0] != p->n || y->dims[1] != p->k || y->dims[2] != out[0] || y->dims[3] != out[1] ||
        out[0] < 1 || out[1] < 1)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: y is [%d, %d, %d, %d], the convolution gives [%d, %d, %d, %d]", api,
                    y->dims[0], y->dims[1], y->dims[2], y->dims[3], p->n, p->k, out[0], out[1]);
    p->oh = out[0];
    p->ow = out[1];
    for (int i = 0; i < 4; i++) {
        p->xs[i] = x->strides[i];
        p->ys[i] = y->strides[i];
    }
    int cg = w->c;
    if (p->nhwc) {
        p->fs[0] = (int64_t)p->r * p->s * cg;
        p->fs[1] = 1;
        p->fs[2] = (int64_t)p->s * cg;
        p->fs[3] = cg;
    } else {
        p->fs[0] = (int64_t)cg * p->r * p->s;
        p->fs[1] = (int64_t)p->r * p->s;
        p->fs[2] = p->s;
        p->fs[3] = 1;
    }
    p->dt = dt;
    p->f64 = ct == CUDNN_DATA_DOUBLE;
    p->tf32_inputs = dt == CUDNN_DATA_FLOAT && cd->math != CUDNN_FMA_MATH;
    p->flip = cd->mode == CUDNN_CONVOLUTION;
    p->math = cd->math;
    return CUDNN_STATUS_SUCCESS;
}

enum class conv_kind { fwd, bwd_data, bwd_filter };

// Made-up workspace sizes per algorithm: zero for the plain ones, non-zero for the ones the
// heuristics list first (so the library's workspace path always runs).
size_t workspace_of(conv_kind kind, int algo, const conv_problem &p) {
    size_t cg = static_cast<size_t>(p.c / p.groups), taps = cg * p.r * p.s;
    switch (kind) {
    case conv_kind::fwd:
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ? taps * 8
               : algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM ? taps * p.oh * p.ow * dtype_size(p.dt)
                                                         : 0;
    case conv_kind::bwd_data:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 ? taps * 8 : 0;
    default:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ? taps * 8 + 64 : 0;
    }
}

int algo_count(conv_kind kind) {
    if (kind == conv_kind::fwd) return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    if (kind == conv_kind::bwd_data) return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

// The heuristics' order: the algorithms this fake ranks, best first.
std::vector<int> ranking(conv_kind kind) {
    switch (kind) {
    case conv_kind::fwd:
        return {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_GEMM};
    case conv_kind::bwd_data:
        return {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0};
    default:
        return {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0};
    }
}

cudnnStatus_t check_algo(const char *api, conv_kind kind, int algo) {
    if (algo < 0 || algo >= algo_count(kind))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d is out of range", api, algo);
    return CUDNN_STATUS_SUCCESS;
}

// ---------------------------------------------------------------- the computation

struct conv_job {
    conv_kind kind;
    conv_problem p;
    const char *x, *w, *y; // the operands; the output among them is written through out
    char *out;
    char *ws;
    size_t ws_bytes;
    double alpha, beta;
};

template <class A> A in(const conv_problem &p, const char *base, int64_t i) {
    A v = static_cast<A>(load(base, p.dt, i));
    return p.tf32_inputs ? static_cast<A>(tf32(static_cast<float>(v))) : v;
}

int64_t x_at(const conv_problem &p, int n, int c, int h, int w) {
    return (int64_t)n * p.xs[0] + (int64_t)c * p.xs[1] + (int64_t)h * p.xs[2] +
           (int64_t)w * p.xs[3];
}
int64_t y_at(const conv_problem &p, int n, int k, int h, int w) {
    return (int64_t)n * p.ys[0] + (int64_t)k * p.ys[1] + (int64_t)h * p.ys[2] +
           (int64_t)w * p.ys[3];
}
int64_t f_at(const conv_problem &p, int k, int c, int r, int s) {
    if (p.flip) {
        r = p.r - 1 - r;
        s = p.s - 1 - s;
    }
    return k * p.fs[0] + c * p.fs[1] + r * p.fs[2] + s * p.fs[3];
}

// out = alpha * v + beta * out (beta == 0: out is not read)
template <class A> void put(const conv_job &j, int64_t i, A v) {
    double r = j.alpha * static_cast<double>(v);
    if (j.beta != 0) r += j.beta * load(j.out, j.p.dt, i);
    store(j.out, j.p.dt, i, r);
}

template <class A> void run_fwd(const conv_job &j) {
    const conv_problem &p = j.p;
    int cg = p.c / p.groups, kg = p.k / p.groups;
    for (int n = 0; n < p.n; n++)
        for (int k = 0; k < p.k; k++)
            for (int oh = 0; oh < p.oh; oh++)
                for (int ow = 0; ow < p.ow; ow++) {
                    A acc = 0;
                    for (int c = 0; c < cg; c++)
                        for (int r = 0; r < p.r; r++)
                            for (int s = 0; s < p.s; s++) {
                                int ih = oh * p.stride[0] - p.pad[0] + r * p.dil[0];
                                int iw = ow * p.stride[1] - p.pad[1] + s * p.dil[1];
                                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
                                acc += in<A>(p, j.x, x_at(p, n, k / kg * cg + c, ih, iw)) *
                                       in<A>(p, j.w, f_at(p, k, c, r, s));
                            }
                    put<A>(j, y_at(p, n, k, oh, ow), acc);
                }
}

template <class A> void run_bwd_data(const conv_job &j) {
    const conv_problem &p = j.p;
    int cg = p.c / p.groups, kg = p.k / p.groups;
    for (int n = 0; n < p.n; n++)
        for (int ci = 0; ci < p.c; ci++)
            for (int ih = 0; ih < p.h; ih++)
                for (int iw = 0; iw < p.w; iw++) {
                    A acc = 0;
                    int g = ci / cg, c = ci % cg;
                    for (int k = g * kg; k < (g + 1) * kg; k++)
                        for (int r = 0; r < p.r; r++)
                            for (int s = 0; s < p.s; s++) {
                                int th = ih + p.pad[0] - r * p.dil[0],
                                    tw = iw + p.pad[1] - s * p.dil[1];
                                if (th < 0 || tw < 0 || th % p.stride[0] || tw % p.stride[1])
                                    continue;
                                int oh = th / p.stride[0], ow = tw / p.stride[1];
                                if (oh >= p.oh || ow >= p.ow) continue;
                                acc += in<A>(p, j.y, y_at(p, n, k, oh, ow)) *
                                       in<A>(p, j.w, f_at(p, k, c, r, s));
                            }
                    put<A>(j, x_at(p, n, ci, ih, iw), acc);
                }
}

template <class A> void run_bwd_filter(const conv_job &j) {
    const conv_problem &p = j.p;
    int cg = p.c / p.groups, kg = p.k / p.groups;
    for (int k = 0; k < p.k; k++)
        for (int c = 0; c < cg; c++)
            for (int r = 0; r < p.r; r++)
                for (int s = 0; s < p.s; s++) {
                    A acc = 0;
                    for (int n = 0; n < p.n; n++)
                        for (int oh = 0; oh < p.oh; oh++)
                            for (int ow = 0; ow < p.ow; ow++) {
                                int ih = oh * p.stride[0] - p.pad[0] + r * p.dil[0];
                                int iw = ow * p.stride[1] - p.pad[1] + s * p.dil[1];
                                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
                                acc += in<A>(p, j.y, y_at(p, n, k, oh, ow)) *
                                       in<A>(p, j.x, x_at(p, n, k / kg * cg + c, ih, iw));
                            }
                    put<A>(j, f_at(p, k, c, r, s), acc);
                }
}

void run(const conv_job &j) {
    if (j.ws_bytes) std::memset(j.ws, 0xff, j.ws_bytes); // garbage: NaN in every float type
    switch (j.kind) {
    case conv_kind::fwd:
        j.p.f64 ? run_fwd<double>(j) : run_fwd<float>(j);
        break;
    case conv_kind::bwd_data:
        j.p.f64 ? run_bwd_data<double>(j) : run_bwd_data<float>(j);
        break;
    default:
        j.p.f64 ? run_bwd_filter<double>(j) : run_bwd_filter<float>(j);
        break;
    }
}

double scalar(const void *p, bool f64) {
    return f64 ? *static_cast<const double *>(p) : *static_cast<const float *>(p);
}

size_t x_bytes(const conv_problem &p) {
    const int d[4] = {p.n, p.c, p.h, p.w};
    return span_bytes(d, p.xs, 4, p.dt);
}
size_t y_bytes(const conv_problem &p) {
    const int d[4] = {p.n, p.k, p.oh, p.ow};
    return span_bytes(d, p.ys, 4, p.dt);
}
size_t w_bytes(const conv_problem &p) {
    return static_cast<size_t>(p.k) * (p.c / p.groups) * p.r * p.s * dtype_size(p.dt);
}

// Checks the operands, workspace and scalars of a call and queues it.
cudnnStatus_t conv_queue(const char *api, cudnnHandle_t h, conv_kind kind, const conv_problem &p,
                         int algo, const void *x, const void *w, const void *y, void *ws,
                         size_t ws_bytes, const void *alpha, const void *beta) {
    cudnnStatus_t st = check_algo(api, kind, algo);
    if (st == CUDNN_STATUS_SUCCESS) st = check_memory(api, "x", x, x_bytes(p));
    if (st == CUDNN_STATUS_SUCCESS) st = check_memory(api, "w", w, w_bytes(p));
    if (st == CUDNN_STATUS_SUCCESS) st = check_memory(api, "y", y, y_bytes(p));
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta)
        return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: alpha or beta is NULL", api);
    if (mtemu::device_range(alpha, 1) || mtemu::device_range(beta, 1))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: alpha and beta must be host pointers", api);
    size_t need = workspace_of(kind, algo, p);
    if (ws_bytes < need)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: workspace of %zu bytes, algorithm %d needs %zu",
                    api, ws_bytes, algo, need);
    if (ws_bytes > 0 && (st = check_memory(api, "workspace", ws, ws_bytes)) != CUDNN_STATUS_SUCCESS)
        return st;
    conv_job j;
    j.kind = kind;
    j.p = p;
    j.x = static_cast<const char *>(x);
    j.w = static_cast<const char *>(w);
    j.y = static_cast<const char *>(y);
    j.out = const_cast<char *>(kind == conv_kind::fwd        ? j.y
                               : kind == conv_kind::bwd_data ? j.x
                                                             : j.w);
    j.ws = static_cast<char *>(ws);
    j.ws_bytes = need;
    j.alpha = scalar(alpha, p.f64);
    j.beta = scalar(beta, p.f64);
    mtemu::enqueue(h->stream, [j] { run(j); });
    return CUDNN_STATUS_SUCCESS;
}

template <class Perf>
cudnnStatus_t perf_list(const char *api, conv_kind kind, const conv_problem &p, int requested,
                        int *returned, Perf *out, size_t ws_cap) {
    if (requested < 1 || !returned || !out)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: requested %d, returned %p, results %p", api,
                    requested, (void *)returned, (void *)out);
    int n = 0;
    for (int a : ranking(kind)) {
        size_t need = workspace_of(kind, a, p);
        if (n == requested || need > ws_cap) continue;
        Perf r;
        std::memset(&r, 0, sizeof r);
        r.algo = static_cast<decltype(r.algo)>(a);
        r.status = CUDNN_STATUS_SUCCESS;
        r.time = static_cast<float>(n + 1);
        r.memory = need;
        r.determinism = CUDNN_DETERMINISTIC;
        r.mathType = p.math;
        out[n++] = r;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

// ---------------------------------------------------------------- the cuDNN API
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
    if (!is_live(handle))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: handle %p is not live", (void *)handle);
    return destroy("cudnnDestroy", handle);
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    if (!is_live(handle))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: handle %p is not live",
                    (void *)handle);
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
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
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
    for (int i = 0; i < nbDims; i++) {
        d->dims[i] = dimA[i];
        d->strides[i] = strideA[i];
    }
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
    const char *api = "cudnnSetFilter4dDescriptor";
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
    if (dtype_size(dataType) == 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: data type %d is not emulated", api, dataType);
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: format %d is not emulated", api, format);
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: dims %d x %d x %d x %d", api, k, c, h, w);
    d->dt = dataType;
    d->format = format;
    d->k = k;
    d->c = c;
    d->h = h;
    d->w = w;
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    const char *api = "cudnnSetConvolution2dDescriptor";
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: pad %d,%d stride %d,%d dilation %d,%d", api, pad_h,
                    pad_w, u, v, dilation_h, dilation_w);
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", api, mode);
    if (dtype_size(computeType) == 0 || computeType == CUDNN_DATA_BFLOAT16)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: compute type %d", api, computeType);
    d->pad[0] = pad_h;
    d->pad[1] = pad_w;
    d->stride[0] = u;
    d->stride[1] = v;
    d->dilation[0] = dilation_h;
    d->dilation[1] = dilation_w;
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

// ---- algorithm choice

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    const char *api = "cudnnGetConvolutionForwardAlgorithm_v7";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = conv_check(api, handle, srcDesc, filterDesc, convDesc, destDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return perf_list(api, conv_kind::fwd, p, requestedAlgoCount, returnedAlgoCount, perfResults,
                     SIZE_MAX);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
    const char *api = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = conv_check(api, handle, gradDesc, filterDesc, convDesc, diffDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return perf_list(api, conv_kind::bwd_data, p, requestedAlgoCount, returnedAlgoCount,
                     perfResults, SIZE_MAX);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
    const char *api = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = conv_check(api, handle, srcDesc, gradDesc, convDesc, diffDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return perf_list(api, conv_kind::bwd_filter, p, requestedAlgoCount, returnedAlgoCount,
                     perfResults, SIZE_MAX);
}

// The Find functions run the best-ranked algorithm that fits the workspace on the operands
// (so the output is written, as cuDNN's timing runs write it) and list those that fit.
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t yDesc, void *y, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    const char *api = "cudnnFindConvolutionForwardAlgorithmEx";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, xDesc, wDesc, convDesc, yDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS)
        st = perf_list(api, conv_kind::fwd, p, requestedAlgoCount, returnedAlgoCount, perfResults,
                       workSpaceSizeInBytes);
    const float one = 1, zero = 0;
    const double one64 = 1, zero64 = 0;
    if (st == CUDNN_STATUS_SUCCESS && *returnedAlgoCount > 0)
        st = conv_queue(api, handle, conv_kind::fwd, p, perfResults[0].algo, x, w, y, workSpace,
                        workSpaceSizeInBytes, p.f64 ? (const void *)&one64 : &one,
                        p.f64 ? (const void *)&zero64 : &zero);
    return st;
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes) {
    const char *api = "cudnnFindConvolutionBackwardDataAlgorithmEx";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, dxDesc, wDesc, convDesc, dyDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS)
        st = perf_list(api, conv_kind::bwd_data, p, requestedAlgoCount, returnedAlgoCount,
                       perfResults, workSpaceSizeInBytes);
    const float one = 1, zero = 0;
    const double one64 = 1, zero64 = 0;
    if (st == CUDNN_STATUS_SUCCESS && *returnedAlgoCount > 0)
        st = conv_queue(api, handle, conv_kind::bwd_data, p, perfResults[0].algo, dx, w, dy,
                        workSpace, workSpaceSizeInBytes, p.f64 ? (const void *)&one64 : &one,
                        p.f64 ? (const void *)&zero64 : &zero);
    return st;
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *y,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void *dw,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    const char *api = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, xDesc, dwDesc, convDesc, dyDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS)
        st = perf_list(api, conv_kind::bwd_filter, p, requestedAlgoCount, returnedAlgoCount,
                       perfResults, workSpaceSizeInBytes);
    const float one = 1, zero = 0;
    const double one64 = 1, zero64 = 0;
    if (st == CUDNN_STATUS_SUCCESS && *returnedAlgoCount > 0)
        st = conv_queue(api, handle, conv_kind::bwd_filter, p, perfResults[0].algo, x, dw, y,
                        workSpace, workSpaceSizeInBytes, p.f64 ? (const void *)&one64 : &one,
                        p.f64 ? (const void *)&zero64 : &zero);
    return st;
}

// ---- workspace sizes

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes) {
    const char *api = "cudnnGetConvolutionForwardWorkspaceSize";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, xDesc, wDesc, convDesc, yDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS) st = check_algo(api, conv_kind::fwd, algo);
    if (st == CUDNN_STATUS_SUCCESS && !sizeInBytes)
        st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL result", api);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = workspace_of(conv_kind::fwd, algo, p);
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    const char *api = "cudnnGetConvolutionBackwardDataWorkspaceSize";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, dxDesc, wDesc, convDesc, dyDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS) st = check_algo(api, conv_kind::bwd_data, algo);
    if (st == CUDNN_STATUS_SUCCESS && !sizeInBytes)
        st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL result", api);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = workspace_of(conv_kind::bwd_data, algo, p);
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
    const char *api = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
    conv_problem p;
    cudnnStatus_t st = conv_check(api, handle, xDesc, gradDesc, convDesc, dyDesc, &p);
    if (st == CUDNN_STATUS_SUCCESS) st = check_algo(api, conv_kind::bwd_filter, algo);
    if (st == CUDNN_STATUS_SUCCESS && !sizeInBytes)
        st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL result", api);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = workspace_of(conv_kind::bwd_filter, algo, p);
    return st;
}

// ---- the convolutions

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                      const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc,
                                      cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                      size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    const char *api = "cudnnConvolutionForward";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = conv_check(api, handle, xDesc, wDesc, convDesc, yDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return conv_queue(api, handle, conv_kind::fwd, p, algo, x, w, y, workSpace,
                      workSpaceSizeInBytes, alpha, beta);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void *w,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    const char *api = "cudnnConvolutionBackwardData";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = conv_check(api, handle, dxDesc, wDesc, convDesc, dyDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return conv_queue(api, handle, conv_kind::bwd_data, p, algo, dx, w, dy, workSpace,
                      workSpaceSizeInBytes, alpha, beta);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    const char *api = "cudnnConvolutionBackwardFilter";
    conv_problem p;
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = conv_check(api, handle, xDesc, dwDesc, convDesc, dyDesc, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return conv_queue(api, handle, conv_kind::bwd_filter, p, algo, x, dw, dy, workSpace,
                      workSpaceSizeInBytes, alpha, beta);
}

// ---- pooling (forward only: mixtape's backward is its own kernel)

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d) {
    return make("cudnnCreatePoolingDescriptor", d);
}
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) {
    return destroy("cudnnDestroyPoolingDescriptor", d);
}

cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight,
                                          int windowWidth, int verticalPadding,
                                          int horizontalPadding, int verticalStride,
                                          int horizontalStride) {
    const char *api = "cudnnSetPooling2dDescriptor";
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
    if (mode != CUDNN_POOLING_MAX && mode != CUDNN_POOLING_MAX_DETERMINISTIC &&
        mode != CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING &&
        mode != CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", api, mode);
    if (maxpoolingNanOpt != CUDNN_PROPAGATE_NAN && maxpoolingNanOpt != CUDNN_NOT_PROPAGATE_NAN)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: NaN option %d", api, maxpoolingNanOpt);
    if (windowHeight <= 0 || windowWidth <= 0 || verticalStride <= 0 || horizontalStride <= 0 ||
        verticalPadding < 0 || horizontalPadding < 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: window %dx%d, padding %d,%d, stride %d,%d", api,
                    windowHeight, windowWidth, verticalPadding, horizontalPadding, verticalStride,
                    horizontalStride);
    d->mode = mode;
    d->nan = maxpoolingNanOpt;
    d->window[0] = windowHeight;
    d->window[1] = windowWidth;
    d->pad[0] = verticalPadding;
    d->pad[1] = horizontalPadding;
    d->stride[0] = verticalStride;
    d->stride[1] = horizontalStride;
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

// cuDNN's pooling: the output size is its floor formula (checked); max pads with -inf (a NaN
// wins only with CUDNN_PROPAGATE_NAN); INCLUDE_PADDING divides by the whole window, EXCLUDE by
// its part inside the input. Any strides. Accumulation in float (double for DOUBLE).
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc,
                                  const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                  const void *x, const void *beta,
                                  const cudnnTensorDescriptor_t yDesc, void *y) {
    const char *api = "cudnnPoolingForward";
    if (!is_live(handle))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)handle);
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "x", xDesc);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "y", yDesc);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!is_live(poolingDesc) || !poolingDesc->set)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: pooling descriptor not live or not set", api);
    cudnnTensorStruct xt = *xDesc, yt = *yDesc;
    cudnnPoolingStruct pd = *poolingDesc;
    if (xt.nd != 4 || yt.nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: only 4-d pooling is emulated", api);
    if (xt.dt != yt.dt) return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y data types differ", api);
    for (int i = 0; i < 2; i++) {
        int out = (xt.dims[2 + i] + 2 * pd.pad[i] - pd.window[i]) / pd.stride[i] + 1;
        if (pd.pad[i] >= pd.window[i] || out < 1 || yt.dims[2 + i] != out ||
            yt.dims[0] != xt.dims[0] || yt.dims[1] != xt.dims[1])
            return fail(
                CUDNN_STATUS_BAD_PARAM,
                "%s: y is [%d, %d, %d, %d] for x [%d, %d, %d, %d] (window %d, pad %d, stride %d)",
                api, yt.dims[0], yt.dims[1], yt.dims[2], yt.dims[3], xt.dims[0], xt.dims[1],
                xt.dims[2], xt.dims[3], pd.window[i], pd.pad[i], pd.stride[i]);
    }
    st = check_memory(api, "x", x, span_bytes(xt.dims, xt.strides, 4, xt.dt));
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_memory(api, "y", y, span_bytes(yt.dims, yt.strides, 4, yt.dt));
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta || mtemu::device_range(alpha, 1) || mtemu::device_range(beta, 1))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: alpha and beta must be host pointers", api);
    bool f64 = xt.dt == CUDNN_DATA_DOUBLE;
    double al = scalar(alpha, f64), be = scalar(beta, f64);
    const char *xp = static_cast<const char *>(x);
    char *yp = static_cast<char *>(y);
    mtemu::enqueue(handle->stream, [xt, yt, pd, xp, yp, al, be, f64] {
        const int *xs = xt.strides, *ys = yt.strides;
        bool max = pd.mode == CUDNN_POOLING_MAX || pd.mode == CUDNN_POOLING_MAX_DETERMINISTIC;
        for (int n = 0; n < yt.dims[0]; n++)
            for (int c = 0; c < yt.dims[1]; c++)
                for (int oh = 0; oh < yt.dims[2]; oh++)
                    for (int ow = 0; ow < yt.dims[3]; ow++) {
                        double acc = max ? -INFINITY : 0.0;
                        int inside = 0;
                        for (int r = 0; r < pd.window[0]; r++)
                            for (int q = 0; q < pd.window[1]; q++) {
                                int ih = oh * pd.stride[0] - pd.pad[0] + r,
                                    iw = ow * pd.stride[1] - pd.pad[1] + q;
                                if (ih < 0 || ih >= xt.dims[2] || iw < 0 || iw >= xt.dims[3])
                                    continue;
                                inside++;
                                double v = load(xp, xt.dt,
                                                (int64_t)n * xs[0] + (int64_t)c * xs[1] +
                                                    (int64_t)ih * xs[2] + (int64_t)iw * xs[3]);
                                if (!f64) v = static_cast<float>(v);
                                if (max) {
                                    if (std::isnan(v)
                                            ? pd.nan == CUDNN_PROPAGATE_NAN && !std::isnan(acc)
                                            : v > acc)
                                        acc = v;
                                } else {
                                    acc = f64 ? acc + v : static_cast<float>(acc + v);
                                }
                            }
                        if (!max)
                            acc /= pd.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                       ? pd.window[0] * pd.window[1]
                                       : inside;
                        int64_t yi = (int64_t)n * ys[0] + (int64_t)c * ys[1] + (int64_t)oh * ys[2] +
                                     (int64_t)ow * ys[3];
                        double r = al * acc;
                        if (be != 0) r += be * load(yp, yt.dt, yi);
                        store(yp, yt.dt, yi, r);
                    }
    });
    return CUDNN_STATUS_SUCCESS;
}

// ---- batch norm in training, spatial mode: per channel over N, H and W, in double

namespace {

struct bn_shape {
    cudnnDataType_t dt, pdt;
    int n, c, h, w;
    int xs[4];
};

int64_t bn_at(const bn_shape &b, int n, int c, int h, int w) {
    return (int64_t)n * b.xs[0] + (int64_t)c * b.xs[1] + (int64_t)h * b.xs[2] +
           (int64_t)w * b.xs[3];
}

// x (and y, dy, dx: the same descriptor contents), the parameter descriptor 1 x C x 1 x 1 of
// float (double for DOUBLE x), the mode, epsilon and the blend factors' pointers.
cudnnStatus_t bn_check(const char *api, cudnnHandle_t h, cudnnBatchNormMode_t mode,
                       cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                       cudnnTensorDescriptor_t p, double eps, const void *const *scalars,
                       int nscalars, bn_shape *b) {
    if (!is_live(h))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)h);
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "x", x);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "y", y);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "bnScaleBiasMeanVar", p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (mode != CUDNN_BATCHNORM_SPATIAL && mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: mode %d is not emulated", api, mode);
    if (x->nd != 4 || y->nd != 4 || p->nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: only 4-d batch norm is emulated", api);
    if (x->dt != y->dt || std::memcmp(x->dims, y->dims, sizeof x->dims) != 0 ||
        std::memcmp(x->strides, y->strides, sizeof x->strides) != 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y (dx, dy) descriptors differ", api);
    cudnnDataType_t want = x->dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    if (p->dt != want || p->dims[0] != 1 || p->dims[1] != x->dims[1] || p->dims[2] != 1 ||
        p->dims[3] != 1)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: the parameter descriptor must be 1 x %d x 1 x 1 of %s", api, x->dims[1],
                    want == CUDNN_DATA_DOUBLE ? "DOUBLE" : "FLOAT");
    if (!(eps >= CUDNN_BN_MIN_EPSILON))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g", api, eps);
    for (int i = 0; i < nscalars; i++)
        if (!scalars[i] || mtemu::device_range(scalars[i], 1))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: the blend factors must be host pointers", api);
    b->dt = x->dt;
    b->pdt = want;
    b->n = x->dims[0];
    b->c = x->dims[1];
    b->h = x->dims[2];
    b->w = x->dims[3];
    for (int i = 0; i < 4; i++) b->xs[i] = x->strides[i];
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t bn_memory(const char *api, const bn_shape &b,
                        std::initializer_list<std::pair<const char *, const void *>> xs,
                        std::initializer_list<std::pair<const char *, const void *>> ps) {
    const int d[4] = {b.n, b.c, b.h, b.w};
    size_t xb = span_bytes(d, b.xs, 4, b.dt), pb = static_cast<size_t>(b.c) * dtype_size(b.pdt);
    for (auto &e : xs) {
        cudnnStatus_t st = check_memory(api, e.first, e.second, xb);
        if (st != CUDNN_STATUS_SUCCESS) return st;
    }
    for (auto &e : ps) {
        cudnnStatus_t st = check_memory(api, e.first, e.second, pb);
        if (st != CUDNN_STATUS_SUCCESS) return st;
    }
    return CUDNN_STATUS_SUCCESS;
}

// The mean and 1/sqrt(biased var + eps) of channel c, or the saved ones.
void bn_stats(const bn_shape &b, const char *x, int c, double eps, double *mean, double *var) {
    double s = 0, q = 0;
    int64_t m = (int64_t)b.n * b.h * b.w;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) s += load(x, b.dt, bn_at(b, n, c, h, w));
    *mean = s / m;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) {
                double d = load(x, b.dt, bn_at(b, n, c, h, w)) - *mean;
                q += d * d;
            }
    *var = q / m;
    (void)eps;
}

} // namespace

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean,
    void *resultSaveInvVariance) {
    const char *api = "cudnnBatchNormalizationForwardTraining";
    bn_shape b;
    const void *sc[2] = {alpha, beta};
    cudnnStatus_t st =
        bn_check(api, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon, sc, 2, &b);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!resultRunningMean != !resultRunningVariance || !resultSaveMean != !resultSaveInvVariance)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: running (or saved) mean and variance must both be given or both NULL",
                    api);
    st = bn_memory(api, b, {{"x", x}, {"y", y}}, {{"bnScale", bnScale}, {"bnBias", bnBias}});
    if (st == CUDNN_STATUS_SUCCESS && resultRunningMean)
        st = bn_memory(api, b, {},
                       {{"resultRunningMean", resultRunningMean},
                        {"resultRunningVariance", resultRunningVariance}});
    if (st == CUDNN_STATUS_SUCCESS && resultSaveMean)
        st = bn_memory(
            api, b, {},
            {{"resultSaveMean", resultSaveMean}, {"resultSaveInvVariance", resultSaveInvVariance}});
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    double al = scalar(alpha, f64), be = scalar(beta, f64), f = exponentialAverageFactor,
           eps = epsilon;
    const char *xp = static_cast<const char *>(x), *wp = static_cast<const char *>(bnScale),
               *bp = static_cast<const char *>(bnBias);
    char *yp = static_cast<char *>(y), *rm = static_cast<char *>(resultRunningMean),
         *rv = static_cast<char *>(resultRunningVariance),
         *sm = static_cast<char *>(resultSaveMean),
         *si = static_cast<char *>(resultSaveInvVariance);
    mtemu::enqueue(handle->stream, [=] {
        int64_t m = (int64_t)b.n * b.h * b.w;
        for (int c = 0; c < b.c; c++) {
            double mean, var;
            bn_stats(b, xp, c, eps, &mean, &var);
            double inv = 1.0 / std::sqrt(var + eps), g = load(wp, b.pdt, c),
                   sh = load(bp, b.pdt, c);
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double v = al * ((load(xp, b.dt, i) - mean) * inv * g + sh);
                        if (be != 0) v += be * load(yp, b.dt, i);
                        store(yp, b.dt, i, v);
                    }
            if (rm) { // the unbiased variance into the running estimate
                store(rm, b.pdt, c, (1 - f) * load(rm, b.pdt, c) + f * mean);
                store(rv, b.pdt, c, (1 - f) * load(rv, b.pdt, c) + f * var * m / (double)(m - 1));
            }
            if (sm) {
                store(sm, b.pdt, c, mean);
                store(si, b.pdt, c, inv);
            }
        }
    });
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance) {
    const char *api = "cudnnBatchNormalizationBackward";
    bn_shape b;
    const void *sc[4] = {alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff};
    cudnnStatus_t st =
        bn_check(api, handle, mode, xDesc, dyDesc, dBnScaleBiasDesc, epsilon, sc, 4, &b);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "dx", dxDesc);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (dxDesc->dt != b.dt || std::memcmp(dxDesc->dims, xDesc->dims, sizeof xDesc->dims) != 0 ||
        std::memcmp(dxDesc->strides, xDesc->strides, sizeof xDesc->strides) != 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: dx and x descriptors differ", api);
    if (!savedMean != !savedInvVariance)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: saved mean and inverse variance must both be given or both NULL", api);
    st = bn_memory(api, b, {{"x", x}, {"dy", dy}, {"dx", dx}},
                   {{"bnScale", bnScale},
                    {"dBnScaleResult", dBnScaleResult},
                    {"dBnBiasResult", dBnBiasResult}});
    if (st == CUDNN_STATUS_SUCCESS && savedMean)
        st = bn_memory(api, b, {},
                       {{"savedMean", savedMean}, {"savedInvVariance", savedInvVariance}});
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    double ad = scalar(alphaDataDiff, f64), bd = scalar(betaDataDiff, f64),
           ap = scalar(alphaParamDiff, f64), bpd = scalar(betaParamDiff, f64), eps = epsilon;
    const char *xp = static_cast<const char *>(x), *gyp = static_cast<const char *>(dy),
               *wp = static_cast<const char *>(bnScale),
               *smp = static_cast<const char *>(savedMean),
               *sip = static_cast<const char *>(savedInvVariance);
    char *gxp = static_cast<char *>(dx), *gwp = static_cast<char *>(dBnScaleResult),
         *gbp = static_cast<char *>(dBnBiasResult);
    mtemu::enqueue(handle->stream, [=] {
        int64_t m = (int64_t)b.n * b.h * b.w;
        for (int c = 0; c < b.c; c++) {
            double mean, inv;
            if (smp) {
                mean = load(smp, b.pdt, c);
                inv = load(sip, b.pdt, c);
            } else {
                double var;
                bn_stats(b, xp, c, eps, &mean, &var);
                inv = 1.0 / std::sqrt(var + eps);
            }
            double sg = 0, sgx = 0; // sum(dy), sum(dy * xhat)
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double g = load(gyp, b.dt, i);
                        sg += g;
                        sgx += g * (load(xp, b.dt, i) - mean) * inv;
                    }
            double gamma = load(wp, b.pdt, c);
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double xh = (load(xp, b.dt, i) - mean) * inv;
                        double v = ad * gamma * inv * (load(gyp, b.dt, i) - sg / m - xh * sgx / m);
                        if (bd != 0) v += bd * load(gxp, b.dt, i);
                        store(gxp, b.dt, i, v);
                    }
            double gw = ap * sgx, gb = ap * sg;
            if (bpd != 0) {
                gw += bpd * load(gwp, b.pdt, c);
                gb += bpd * load(gbp, b.pdt, c);
            }
            store(gwp, b.pdt, c, gw);
            store(gbp, b.pdt, c, gb);
        }
    });
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"

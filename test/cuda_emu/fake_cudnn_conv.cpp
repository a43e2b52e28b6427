// The fake cuDNN's convolutions (see fake_cudnn.cpp for the rules): the problem check, the
// made-up algorithms and workspaces, the direct loops, and the entry points.
#include "fake_cudnn_internal.h"

#include <vector>

using namespace fakednn;

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

enum class conv_kind { fwd, bwd_data, bwd_filter };

// One call: its name, what it computes, and its descriptors in the forward's roles (x, w, y),
// whatever order the entry point takes them in.
struct conv_call {
    const char *api;
    conv_kind kind;
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t cd;
    cudnnTensorDescriptor_t y;
};

cudnnStatus_t conv_geometry(const conv_call &c, conv_problem *p);

// The problem of a call; SUCCESS or a status. The handle and descriptors: live and set, 4-d,
// the data and compute types, the layouts; then the geometry (conv_geometry).
cudnnStatus_t conv_check(const conv_call &c, conv_problem *p) {
    const char *api = c.api;
    cudnnTensorDescriptor_t x = c.x, y = c.y;
    cudnnFilterDescriptor_t w = c.w;
    cudnnConvolutionDescriptor_t cd = c.cd;
    cudnnStatus_t st;
    if ((st = check_handle(api, c.h)) || (st = check_tensor(api, "x", x)) ||
        (st = check_tensor(api, "y", y)) || (st = check_set(api, "filter", w)) ||
        (st = check_set(api, "convolution", cd)))
        return st;
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
    if (p->nhwc && dt == CUDNN_DATA_DOUBLE)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: DOUBLE convolutions are emulated in NCHW only",
                    api);
    if (!packed(x, p->nhwc) || !packed(y, p->nhwc))
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "%s: x and y must both be fully packed %s, as the filter's format (mixed or "
                    "strided layouts are not emulated)",
                    api, p->nhwc ? "NHWC" : "NCHW");
    p->dt = dt;
    p->f64 = ct == CUDNN_DATA_DOUBLE;
    p->tf32_inputs = dt == CUDNN_DATA_FLOAT && cd->math != CUDNN_FMA_MATH;
    p->flip = cd->mode == CUDNN_CONVOLUTION;
    p->math = cd->math;
    return conv_geometry(c, p);
}

// Sizes and strides: x's channels = filter's channels * groups, y's dims = the output formula.
cudnnStatus_t conv_geometry(const conv_call &c, conv_problem *p) {
    const char *api = c.api;
    cudnnTensorDescriptor_t x = c.x, y = c.y;
    cudnnFilterDescriptor_t w = c.w;
    cudnnConvolutionDescriptor_t cd = c.cd;
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
    return CUDNN_STATUS_SUCCESS;
}

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

// The input element that output (oh, ow) reads through filter tap (r, s); false in the padding.
bool tap(const conv_problem &p, int oh, int ow, int r, int s, int *ih, int *iw) {
    *ih = oh * p.stride[0] - p.pad[0] + r * p.dil[0];
    *iw = ow * p.stride[1] - p.pad[1] + s * p.dil[1];
    return *ih >= 0 && *ih < p.h && *iw >= 0 && *iw < p.w;
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
                                int ih, iw;
                                if (!tap(p, oh, ow, r, s, &ih, &iw)) continue;
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
                                int ih, iw;
                                if (!tap(p, oh, ow, r, s, &ih, &iw)) continue;
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
    st = check_host_scalars(api, {alpha, beta}, CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
    if (st != CUDNN_STATUS_SUCCESS) return st;
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

// What every entry point does first: the fault injection, then the problem (conv_check).
cudnnStatus_t conv_start(const conv_call &c, conv_problem *p) {
    cudnnStatus_t st = injected(c.api);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return conv_check(c, p);
}

// cudnnGetConvolution*Algorithm_v7: the ranking, whatever the workspace.
template <class Perf>
cudnnStatus_t conv_get_algorithms(const conv_call &c, int requested, int *returned, Perf *out) {
    conv_problem p;
    cudnnStatus_t st = conv_start(c, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return perf_list(c.api, c.kind, p, requested, returned, out, SIZE_MAX);
}

// cudnnFindConvolution*AlgorithmEx: runs the best-ranked algorithm that fits the workspace on
// the operands (so the output is written, as cuDNN's timing runs write it) and lists those
// that fit.
template <class Perf>
cudnnStatus_t conv_find(const conv_call &c, const void *x, const void *w, const void *y,
                        int requested, int *returned, Perf *out, void *ws, size_t ws_bytes) {
    conv_problem p;
    cudnnStatus_t st = conv_start(c, &p);
    if (st == CUDNN_STATUS_SUCCESS)
        st = perf_list(c.api, c.kind, p, requested, returned, out, ws_bytes);
    if (st != CUDNN_STATUS_SUCCESS || *returned == 0) return st;
    const float one = 1, zero = 0;
    const double one64 = 1, zero64 = 0;
    return conv_queue(c.api, c.h, c.kind, p, out[0].algo, x, w, y, ws, ws_bytes,
                      p.f64 ? (const void *)&one64 : &one, p.f64 ? (const void *)&zero64 : &zero);
}

// cudnnGetConvolution*WorkspaceSize.
cudnnStatus_t conv_workspace(const conv_call &c, int algo, size_t *size) {
    conv_problem p;
    cudnnStatus_t st = conv_start(c, &p);
    if (st == CUDNN_STATUS_SUCCESS) st = check_algo(c.api, c.kind, algo);
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL result", c.api);
    if (st == CUDNN_STATUS_SUCCESS) *size = workspace_of(c.kind, algo, p);
    return st;
}

// cudnnConvolutionForward, BackwardData, BackwardFilter.
cudnnStatus_t conv_run(const conv_call &c, const void *alpha, const void *x, const void *w,
                       const void *y, int algo, void *ws, size_t ws_bytes, const void *beta) {
    conv_problem p;
    cudnnStatus_t st = conv_start(c, &p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return conv_queue(c.api, c.h, c.kind, p, algo, x, w, y, ws, ws_bytes, alpha, beta);
}

} // namespace

// Every entry point answers MTEMU_CUDNN_FAIL and checks its descriptors and arguments
// through the helpers above, with its operands put in the forward's roles.
extern "C" {

// ---- algorithm choice

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    return conv_get_algorithms({"cudnnGetConvolutionForwardAlgorithm_v7", conv_kind::fwd, handle,
                                srcDesc, filterDesc, convDesc, destDesc},
                               requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
    return conv_get_algorithms({"cudnnGetConvolutionBackwardDataAlgorithm_v7", conv_kind::bwd_data,
                                handle, gradDesc, filterDesc, convDesc, diffDesc},
                               requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
    return conv_get_algorithms({"cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                                conv_kind::bwd_filter, handle, srcDesc, gradDesc, convDesc,
                                diffDesc},
                               requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t yDesc, void *y, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    return conv_find({"cudnnFindConvolutionForwardAlgorithmEx", conv_kind::fwd, handle, xDesc,
                      wDesc, convDesc, yDesc},
                     x, w, y, requestedAlgoCount, returnedAlgoCount, perfResults, workSpace,
                     workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes) {
    return conv_find({"cudnnFindConvolutionBackwardDataAlgorithmEx", conv_kind::bwd_data, handle,
                      dxDesc, wDesc, convDesc, dyDesc},
                     dx, w, dy, requestedAlgoCount, returnedAlgoCount, perfResults, workSpace,
                     workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *y,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void *dw,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes) {
    return conv_find({"cudnnFindConvolutionBackwardFilterAlgorithmEx", conv_kind::bwd_filter,
                      handle, xDesc, dwDesc, convDesc, dyDesc},
                     x, dw, y, requestedAlgoCount, returnedAlgoCount, perfResults, workSpace,
                     workSpaceSizeInBytes);
}

// ---- workspace sizes

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes) {
    return conv_workspace({"cudnnGetConvolutionForwardWorkspaceSize", conv_kind::fwd, handle, xDesc,
                           wDesc, convDesc, yDesc},
                          algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    return conv_workspace({"cudnnGetConvolutionBackwardDataWorkspaceSize", conv_kind::bwd_data,
                           handle, dxDesc, wDesc, convDesc, dyDesc},
                          algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
    return conv_workspace({"cudnnGetConvolutionBackwardFilterWorkspaceSize", conv_kind::bwd_filter,
                           handle, xDesc, gradDesc, convDesc, dyDesc},
                          algo, sizeInBytes);
}

// ---- the convolutions

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                      const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc,
                                      cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                      size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    return conv_run(
        {"cudnnConvolutionForward", conv_kind::fwd, handle, xDesc, wDesc, convDesc, yDesc}, alpha,
        x, w, y, algo, workSpace, workSpaceSizeInBytes, beta);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void *w,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    return conv_run({"cudnnConvolutionBackwardData", conv_kind::bwd_data, handle, dxDesc, wDesc,
                     convDesc, dyDesc},
                    alpha, dx, w, dy, algo, workSpace, workSpaceSizeInBytes, beta);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    return conv_run({"cudnnConvolutionBackwardFilter", conv_kind::bwd_filter, handle, xDesc, dwDesc,
                     convDesc, dyDesc},
                    alpha, x, dw, dy, algo, workSpace, workSpaceSizeInBytes, beta);
}

} // extern "C"

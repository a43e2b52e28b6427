// 2-d pooling on the device (max, average, adaptive average), forward and backward, any
// strides (NCHW and NHWC alike), with the window rules of src/math/pool_window.h that the
// CPU loops use, so ceil_mode, count_include_pad and uneven adaptive windows all match torch.
// Not cuDNN: its average divides by the full kernel where torch clips the window to the padded
// input (ceil_mode), it has no uneven adaptive pooling, and its max backward takes the
// forward's output instead of torch's rule (the first maximum of the window, a NaN taking
// over) that the backward here applies by finding each window's argmax again from x.
// Forward: a thread per output element. Backward: a thread per input element, gathering the
// outputs whose windows hold it (no atomics, deterministic). Threads take the elements of the
// tensor they write in its memory order (split4): channels-last tensors channel-fastest, so a
// warp's loads and stores are coalesced (the NCHW order on channels-last memory put a warp's
// 32 accesses on 32 cache lines: the max-pool backward of a channels-last ResNet-50 stem took
// 10 ms per step on the H200, torch's 0.7).
#include "cuda_compat.h"
#include <math.h>
#include "element_access.cuh"
#include "pool_kernels.h"
#include "../math/pool_window.h"

constexpr int POOL_THREADS = 256;

static unsigned pool_blocks(const mt_cuda_ctx *c, int64_t work) {
    int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t b = (work + POOL_THREADS - 1) / POOL_THREADS;
    return (unsigned)(b < cap ? (b > 0 ? b : 1) : cap);
}

MT_DEV void window_at(const mt_cuda_pool_args &a, int64_t oh, int64_t ow, mt_pool_window *w) {
    mt_pool_window_of(a.adaptive, a.kernel, a.stride, a.padding, a.count_include_pad, oh, ow, a.H,
                      a.W, a.OH, a.OW, w);
}

MT_DEV int64_t at4(const int64_t *s, int64_t n, int64_t c, int64_t h, int64_t w) {
    return n * s[0] + c * s[1] + h * s[2] + w * s[3];
}

// Element e of an [N, C, H, W] walk into its indices: channel-fastest when cl (the written
// tensor is channels-last: channel stride 1), else width-fastest.
MT_DEV void split4(int64_t e, bool cl, int64_t C, int64_t H, int64_t W, int64_t *n, int64_t *c,
                   int64_t *h, int64_t *w) {
    if (cl) {
        *c = e % C;
        *w = e / C % W;
        *h = e / (C * W) % H;
        *n = e / (C * W * H);
    } else {
        *w = e % W;
        *h = e / W % H;
        *c = e / (W * H) % C;
        *n = e / (W * H * C);
    }
}

// The argmax of the window in the plane (n, c) of x: torch's order and NaN rule.
template <typename A>
MT_DEV void window_argmax(const mt_cuda_pool_args &a, int64_t n, int64_t c, const mt_pool_window &w,
                          int64_t *bh, int64_t *bw, A *best) {
    *bh = w.h0;
    *bw = w.w0;
    *best = (A)-INFINITY;
    for (int64_t h = w.h0; h < w.h1; h++)
        for (int64_t v = w.w0; v < w.w1; v++) {
            A e = mt_load<A>(a.x, a.dt, at4(a.xs, n, c, h, v));
            if (e > *best || e != e) { // e != e: NaN (no libm call in the loop)
                *best = e;
                *bh = h;
                *bw = v;
            }
        }
}

template <typename A>
__global__ void __launch_bounds__(POOL_THREADS) pool_kernel(mt_cuda_pool_args a) {
    int64_t total = a.N * a.C * a.OH * a.OW;
    bool cl = a.ys[1] == 1 && a.C > 1;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, oh, ow;
        split4(e, cl, a.C, a.OH, a.OW, &n, &c, &oh, &ow);
        mt_pool_window w;
        window_at(a, oh, ow, &w);
        A r;
        if (a.max) {
            int64_t bh, bw;
            window_argmax<A>(a, n, c, w, &bh, &bw, &r);
        } else {
            A s = 0;
            for (int64_t h = w.h0; h < w.h1; h++)
                for (int64_t v = w.w0; v < w.w1; v++)
                    s += mt_load<A>(a.x, a.dt, at4(a.xs, n, c, h, v));
            r = s / (A)w.divisor;
        }
        mt_store<A>(a.y, a.dt, at4(a.ys, n, c, oh, ow), r);
    }
}

// The outputs whose windows may hold input row i (of n inputs, `no` outputs): [*lo, *hi).
MT_DEV void out_range(const mt_cuda_pool_args &a, int d, int64_t i, int64_t n, int64_t no,
                      int64_t *lo, int64_t *hi) {
    if (a.adaptive) { // o with floor(o n / no) <= i < ceil((o + 1) n / no)
        *lo = mt_pool_floor_div(i * no, n);
        *hi = mt_pool_floor_div((i + 1) * no + n - 1, n) + 1;
        *lo = *lo > 0 ? *lo - 1 : 0;
    } else { // o with o s - p <= i < o s - p + k
        int64_t t = i + a.padding[d] - a.kernel[d] + 1;
        *lo = t > 0 ? (t + a.stride[d] - 1) / a.stride[d] : 0;
        *hi = (i + a.padding[d]) / a.stride[d] + 1;
    }
    if (*hi > no) *hi = no;
}

// MAX a template argument: the max and average paths are separate kernels, each with its own
// registers. No __launch_bounds__: with it ptxas held the max path to 64 registers and spilled
// (about 95 without; a block of POOL_THREADS still fits the register file).
template <typename A, bool MAX> __global__ void pool_backward_kernel(mt_cuda_pool_args a) {
    int64_t total = a.N * a.C * a.H * a.W;
    bool cl = a.gxs[1] == 1 && a.C > 1;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c, ih, iw;
        split4(e, cl, a.C, a.H, a.W, &n, &c, &ih, &iw);
        int64_t h_lo, h_hi, w_lo, w_hi;
        out_range(a, 0, ih, a.H, a.OH, &h_lo, &h_hi);
        out_range(a, 1, iw, a.W, a.OW, &w_lo, &w_hi);
        A g = 0;
        for (int64_t oh = h_lo; oh < h_hi; oh++)
            for (int64_t ow = w_lo; ow < w_hi; ow++) {
                mt_pool_window w;
                window_at(a, oh, ow, &w);
                if (ih < w.h0 || ih >= w.h1 || iw < w.w0 || iw >= w.w1) continue;
                A gv = mt_load<A>(a.gy, a.dt, at4(a.ys, n, c, oh, ow));
                if (MAX) {
                    int64_t bh, bw;
                    A best;
                    window_argmax<A>(a, n, c, w, &bh, &bw, &best);
                    if (bh == ih && bw == iw) g += gv;
                } else {
                    g += gv / (A)w.divisor;
                }
            }
        mt_store<A>(a.gx, a.dt, at4(a.gxs, n, c, ih, iw), g);
    }
}

extern "C" int mt_cuda_pool2d(const mt_cuda_ctx *c, const mt_cuda_pool_args *a) {
    int64_t n = a->N * a->C * a->OH * a->OW;
    if (n == 0) return 0;
    if (a->dt == MT_F64)
        MT_LAUNCH(pool_kernel<double>, pool_blocks(c, n), POOL_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(pool_kernel<float>, pool_blocks(c, n), POOL_THREADS, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

template <typename A>
static void launch_backward(const mt_cuda_ctx *c, const mt_cuda_pool_args *a, int64_t n) {
    if (a->max)
        MT_LAUNCH((pool_backward_kernel<A, true>), pool_blocks(c, n), POOL_THREADS, 0, c->stream,
                  *a);
    else
        MT_LAUNCH((pool_backward_kernel<A, false>), pool_blocks(c, n), POOL_THREADS, 0, c->stream,
                  *a);
}

extern "C" int mt_cuda_pool2d_backward(const mt_cuda_ctx *c, const mt_cuda_pool_args *a) {
    int64_t n = a->N * a->C * a->H * a->W;
    if (n == 0) return 0;
    if (a->dt == MT_F64)
        launch_backward<double>(c, a, n);
    else
        launch_backward<float>(c, a, n);
    return (int)cudaGetLastError();
}

// Indexing on the device: index_select and gather copy elements, argmax scans a dim; their
// adjoints index_add and scatter_add are written without atomics: a thread owns one
// destination element and adds the sources that land on it in index order, the order of
// the CPU kernels (cpu_index.c), so both devices give the same bits. That costs a scan of
// the index per destination element: fine for embedding and classifier shapes, and
// deterministic, unlike an atomicAdd scatter.
#include "cuda_compat.h"
#include <math.h>
#include <string.h>
#include "element_access.cuh"

constexpr int INDEX_THREADS = 256;

static unsigned index_blocks(const mt_cuda_ctx *c, int64_t work) {
    int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 32;
    int64_t b = (work + INDEX_THREADS - 1) / INDEX_THREADS;
    return (unsigned)(b < cap ? (b > 0 ? b : 1) : cap);
}

#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

MT_DEV void copy_element(char *dst, const char *src, int es) {
    switch (es) {
    case 8:
        *(uint64_t *)dst = *(const uint64_t *)src;
        break;
    case 4:
        *(uint32_t *)dst = *(const uint32_t *)src;
        break;
    case 2:
        *(uint16_t *)dst = *(const uint16_t *)src;
        break;
    default:
        *dst = *src;
        break;
    }
}

// First writer wins: the host reports this one at the next synchronisation.
MT_DEV void fault_index(mt_cuda_fault *f, int op, int dim, int64_t pos, int64_t value,
                        int64_t bound) {
    if (f && atomicCAS(&f->code, 0, (int)MT_CUDA_FAULT_INDEX_RANGE) == 0) {
        f->op = op;
        f->dim = dim;
        f->a = pos;
        f->b = value;
        f->c = bound;
    }
}

MT_DEV void zero_element(char *dst, int es) {
    for (int b = 0; b < es; b++) dst[b] = 0;
}

// out[o, j, i] = x[o, index[j], i]
__global__ void __launch_bounds__(INDEX_THREADS)
    index_select_kernel(mt_cuda_index_args a, mt_cuda_fault *fault) {
    GRID_STRIDE(e, a.outer * a.k * a.inner) {
        int64_t i = e % a.inner, j = e / a.inner % a.k, o = e / (a.inner * a.k);
        int64_t r = a.index[j];
        if (r < 0 || r >= a.n) {
            zero_element(a.dst + e * a.es, a.es);
            if (o == 0 && i == 0) fault_index(fault, a.op, a.dim, j, r, a.n);
            continue;
        }
        copy_element(a.dst + e * a.es, a.src + ((o * a.n + r) * a.inner + i) * a.es, a.es);
    }
}

// dst[o, r, i] += the src[o, j, i] with index[j] == r, j ascending
template <typename A>
__global__ void __launch_bounds__(INDEX_THREADS) index_add_kernel(mt_cuda_index_args a) {
    GRID_STRIDE(e, a.outer * a.n * a.inner) {
        int64_t i = e % a.inner, r = e / a.inner % a.n, o = e / (a.inner * a.n);
        A v = ((A *)a.dst)[e];
        for (int64_t j = 0; j < a.k; j++)
            if (a.index[j] == r) v += mt_load<A>(a.src, a.sdt, (o * a.k + j) * a.inner + i);
        ((A *)a.dst)[e] = v;
    }
}

// Any dtype as a double, as the CPU compares (exact for I32 and BOOL; I64 takes
// argmax_i64_kernel instead).
MT_DEV double argmax_load(const char *p, mt_dtype dt, int64_t i) {
    switch (dt) {
    case MT_I32:
        return (double)((const int32_t *)p)[i];
    case MT_BOOL:
        return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
    default:
        return mt_load<double>(p, dt, i);
    }
}

// out[o, i] = the first j of the largest x[o, j, i]; NaN beats numbers
__global__ void __launch_bounds__(INDEX_THREADS) argmax_kernel(mt_cuda_index_args a) {
    GRID_STRIDE(e, a.outer * a.inner) {
        int64_t i = e % a.inner, o = e / a.inner, best_j = 0;
        double best = argmax_load(a.src, a.sdt, o * a.n * a.inner + i);
        for (int64_t j = 1; j < a.n; j++) {
            double v = argmax_load(a.src, a.sdt, (o * a.n + j) * a.inner + i);
            if (!isnan(best) && (v > best || isnan(v))) {
                best = v;
                best_j = j;
            }
        }
        ((int64_t *)a.dst)[e] = best_j;
    }
}

// I64 compared as integers: as doubles, values above 2^53 would tie.
__global__ void __launch_bounds__(INDEX_THREADS) argmax_i64_kernel(mt_cuda_index_args a) {
    const int64_t *x = (const int64_t *)a.src;
    GRID_STRIDE(e, a.outer * a.inner) {
        int64_t i = e % a.inner, o = e / a.inner, best_j = 0;
        int64_t best = x[o * a.n * a.inner + i];
        for (int64_t j = 1; j < a.n; j++) {
            int64_t v = x[(o * a.n + j) * a.inner + i];
            if (v > best) {
                best = v;
                best_j = j;
            }
        }
        ((int64_t *)a.dst)[e] = best_j;
    }
}

// Coordinates are taken apart one dim at a time, never stored in an array (a dynamically
// indexed array would live in local memory).

// out[p] = x[p with coordinate dim replaced by index[p]], out and index of one shape
__global__ void __launch_bounds__(INDEX_THREADS)
    gather_kernel(mt_cuda_gather_args a, mt_cuda_fault *fault) {
    GRID_STRIDE(p, a.numel) {
        int64_t r = a.index[p], bound = a.x_shape[a.dim];
        if (r < 0 || r >= bound) {
            zero_element(a.out + p * a.es, a.es);
            fault_index(fault, (int)MT_OP_GATHER, a.user_dim, p, r, bound);
            continue;
        }
        int64_t rem = p, off = 0;
        for (int d = a.nd - 1; d >= 0; d--) {
            int64_t c = rem % a.index_shape[d];
            rem /= a.index_shape[d];
            off += (d == a.dim ? r : c) * a.x_strides[d];
        }
        copy_element(a.out + p * a.es, a.x + off * a.es, a.es);
    }
}

// dst[q] += src[p] for every position p of index with p's coordinates but dim equal to q's
// and index[p] == q[dim], in row-major order of p (the CPU's order)
template <typename A>
__global__ void __launch_bounds__(INDEX_THREADS) scatter_add_kernel(mt_cuda_gather_args a) {
    GRID_STRIDE(q, a.numel) {
        // p0: the flat position in index of q's coordinates with dim at 0
        int64_t rem = q, target = 0, p0 = 0;
        bool inside = true;
        for (int d = a.nd - 1; d >= 0; d--) {
            int64_t c = rem % a.x_shape[d];
            rem /= a.x_shape[d];
            if (d == a.dim) {
                target = c;
            } else {
                inside = inside && c < a.index_shape[d];
                p0 += c * a.index_strides[d];
            }
        }
        if (!inside) continue;
        int64_t pstride = a.index_strides[a.dim];
        A v = ((A *)a.out)[q];
        for (int64_t t = 0; t < a.index_shape[a.dim]; t++) {
            int64_t p = p0 + t * pstride;
            if (a.index[p] == target) v += mt_load<A>(a.x, a.sdt, p);
        }
        ((A *)a.out)[q] = v;
    }
}

// The range check alone, for an index that selects into an empty output (another dim 0):
// its values are still checked, as on the CPU and in torch.
__global__ void __launch_bounds__(INDEX_THREADS)
    index_check_kernel(mt_cuda_index_args a, mt_cuda_fault *fault) {
    GRID_STRIDE(j, a.k) {
        int64_t r = a.index[j];
        if (r < 0 || r >= a.n) fault_index(fault, a.op, a.dim, j, r, a.n);
    }
}

extern "C" int mt_cuda_index_select(const mt_cuda_ctx *c, const mt_cuda_index_args *a) {
    int64_t n = a->outer * a->k * a->inner;
    if (n == 0 && a->k > 0) {
        MT_LAUNCH(index_check_kernel, index_blocks(c, a->k), INDEX_THREADS, 0, c->stream, *a,
                  c->fault);
        return (int)cudaGetLastError();
    }
    if (n == 0) return 0;
    MT_LAUNCH(index_select_kernel, index_blocks(c, n), INDEX_THREADS, 0, c->stream, *a, c->fault);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_index_add(const mt_cuda_ctx *c, const mt_cuda_index_args *a) {
    int64_t n = a->outer * a->n * a->inner;
    if (n == 0 || a->k == 0) return 0;
    if (a->ddt == MT_F64)
        MT_LAUNCH(index_add_kernel<double>, index_blocks(c, n), INDEX_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(index_add_kernel<float>, index_blocks(c, n), INDEX_THREADS, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_argmax(const mt_cuda_ctx *c, const mt_cuda_index_args *a) {
    int64_t n = a->outer * a->inner;
    if (n == 0 || a->n == 0) return 0;
    if (a->sdt == MT_I64)
        MT_LAUNCH(argmax_i64_kernel, index_blocks(c, n), INDEX_THREADS, 0, c->stream, *a);
    else
        MT_LAUNCH(argmax_kernel, index_blocks(c, n), INDEX_THREADS, 0, c->stream, *a);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_gather(const mt_cuda_ctx *c, const mt_cuda_gather_args *a) {
    if (a->numel == 0) return 0;
    MT_LAUNCH(gather_kernel, index_blocks(c, a->numel), INDEX_THREADS, 0, c->stream, *a, c->fault);
    return (int)cudaGetLastError();
}

extern "C" int mt_cuda_scatter_add(const mt_cuda_ctx *c, const mt_cuda_gather_args *a) {
    if (a->numel == 0) return 0;
    if (a->ddt == MT_F64)
        MT_LAUNCH(scatter_add_kernel<double>, index_blocks(c, a->numel), INDEX_THREADS, 0,
                  c->stream, *a);
    else
        MT_LAUNCH(scatter_add_kernel<float>, index_blocks(c, a->numel), INDEX_THREADS, 0, c->stream,
                  *a);
    return (int)cudaGetLastError();
}

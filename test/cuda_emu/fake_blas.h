// What the fake cuBLAS (fake_cublas.cpp) and the fake cuBLASLt (fake_cublaslt.cpp) share:
// status names, the loud failure report, data types, operand extents checked against the
// device allocations, and element loads and stores through src/math/half.h.
#ifndef MTEMU_FAKE_BLAS_H
#define MTEMU_FAKE_BLAS_H
#include "mtemu_internal.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>

// half.h before the toolkit headers: its locals named `half` would shadow cuda_fp16.h's type
#include "../../src/math/half.h"

#include <cublas_v2.h>

namespace fakeblas {

inline const char *status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

// One line on stderr in mtemu::report's format, then the status: a misuse must be loud.
inline cublasStatus_t fail(cublasStatus_t s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
inline cublasStatus_t fail(cublasStatus_t s, const char *fmt, ...) {
    MTEMU_FORMAT(what, fmt);
    std::fprintf(stderr, "mtemu: %s: %s\n", what, status_name(s));
    return s;
}

inline size_t type_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF:
        return 2;
    case CUDA_R_32F:
        return 4;
    case CUDA_R_64F:
        return 8;
    default:
        return 0;
    }
}

inline const char *type_name(cudaDataType t) {
    switch (t) {
    case CUDA_R_16F:
        return "CUDA_R_16F";
    case CUDA_R_16BF:
        return "CUDA_R_16BF";
    case CUDA_R_32F:
        return "CUDA_R_32F";
    case CUDA_R_64F:
        return "CUDA_R_64F";
    default:
        return "an unsupported cudaDataType";
    }
}

// One operand as cuBLAS stores it: `batch` column-major rows x cols matrices, ld apart in
// columns, stride elements apart.
struct operand {
    const char *name;
    const void *p;
    cudaDataType type;
    long long rows, cols, ld, stride;
};

// The bytes [*lo, *hi) that op's batch touches, relative to op.p; false on overflow.
inline bool extent(const operand &op, long long batch, long long *lo, long long *hi) {
    long long es = static_cast<long long>(type_size(op.type)), last, span, end;
    if (__builtin_mul_overflow(batch - 1, op.stride, &last) ||
        __builtin_mul_overflow(op.cols - 1, op.ld, &span) ||
        __builtin_add_overflow(span, op.rows, &span))
        return false;
    long long first = last < 0 ? last : 0;
    if (__builtin_add_overflow(last > 0 ? last : 0, span, &end) ||
        __builtin_mul_overflow(first, es, lo) || __builtin_mul_overflow(end, es, hi))
        return false;
    return true;
}

// ld >= rows, and the whole batch inside one device allocation. An empty matrix touches
// nothing and is not checked beyond its ld.
inline cublasStatus_t check_operand(const char *api, const operand &op, long long batch) {
    if (op.ld < (op.rows > 1 ? op.rows : 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: ld%s = %lld < %lld rows of the stored %s",
                    api, op.name, op.ld, op.rows, op.name);
    if (op.rows == 0 || op.cols == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    long long lo, hi;
    if (!op.p || !extent(op, batch, &lo, &hi))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s (%p): null or extent overflows", api,
                    op.name, op.p);
    const char *start = static_cast<const char *>(op.p) + lo;
    if (mtemu::device_range(start, static_cast<size_t>(hi - lo))) return CUBLAS_STATUS_SUCCESS;
    if (!mtemu::device_range(op.p, 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s (%p) is not in a live device allocation",
                    api, op.name, op.p);
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "%s: %s: %lld matrices of %lld x %lld (ld %lld, batch stride %lld, %s) span "
                "bytes [%lld, %lld) from %p, outside its device allocation",
                api, op.name, batch, op.rows, op.cols, op.ld, op.stride, type_name(op.type), lo, hi,
                op.p);
}

inline bool overlap(const operand &x, const operand &y, long long batch) {
    long long xl = 0, xh = 0, yl = 0, yh = 0;
    if (x.rows == 0 || x.cols == 0 || y.rows == 0 || y.cols == 0) return false;
    if (!extent(x, batch, &xl, &xh) || !extent(y, batch, &yl, &yh)) return false; // checked before
    // as integers: pointers into different allocations are not comparable in C++
    long long xp = static_cast<long long>(reinterpret_cast<uintptr_t>(x.p));
    long long yp = static_cast<long long>(reinterpret_cast<uintptr_t>(y.p));
    return xp + xl < yp + yh && yp + yl < xp + xh;
}

inline double load(const char *p, cudaDataType t, long long i) {
    switch (t) {
    case CUDA_R_16F:
        return mt_f16_to_f32(reinterpret_cast<const uint16_t *>(p)[i]);
    case CUDA_R_16BF:
        return mt_bf16_to_f32(reinterpret_cast<const uint16_t *>(p)[i]);
    case CUDA_R_32F:
        return reinterpret_cast<const float *>(p)[i];
    default:
        return reinterpret_cast<const double *>(p)[i];
    }
}

inline void store(char *p, cudaDataType t, long long i, double v) {
    switch (t) {
    case CUDA_R_16F:
        reinterpret_cast<uint16_t *>(p)[i] = mt_f32_to_f16(static_cast<float>(v));
        break;
    case CUDA_R_16BF:
        reinterpret_cast<uint16_t *>(p)[i] = mt_f32_to_bf16(static_cast<float>(v));
        break;
    case CUDA_R_32F:
        reinterpret_cast<float *>(p)[i] = static_cast<float>(v);
        break;
    default:
        reinterpret_cast<double *>(p)[i] = v;
        break;
    }
}

} // namespace fakeblas
#endif

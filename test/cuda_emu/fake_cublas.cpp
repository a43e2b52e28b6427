// The cuBLAS functions mixtape calls, for the emulated device. Compiled against the toolkit's
// cublas_v2.h, so the compiler checks every signature (and the _v2 names its macros give).
//
// GEMMs are queued on the handle's stream (mtemu::enqueue) and computed on the host when the
// stream runs: column-major, FP32 accumulation (FP64 for the 64F compute types), F16/BF16
// through src/math/half.h, the output rounded once. The fast compute types (and the handle's
// TF32 / tensor-op math modes on FP32 data) round the inputs as the tensor cores would, so a
// TF32 path taken by accident shows as FP32 error in the tests.
//
// Stricter than cuBLAS, each violation a CUBLAS_STATUS_INVALID_VALUE after one stderr line:
// - every operand's extent, batch strides included, lies inside one device allocation (so a
//   host pointer or a stride past the buffer is refused at the call, not found as a fault);
// - ld >= rows of the stored matrix; ops N or T only (C is refused: mixtape has no complex);
// - only these (A, B, C, compute) combinations: 32F/32F/32F with every 32F compute type,
//   16F/16F/{16F,32F} and 16BF/16BF/{16BF,32F} with COMPUTE_32F(_PEDANTIC), 64F with 64F;
// - alpha and beta are host pointers (the pointer mode is host), read as the compute type's
//   scalar: float for COMPUTE_32F even with half C, double for 64F;
// - C must not overlap A or B, nor its own batch entries; beta == 0 never reads C (fresh
//   device memory is NaN, so a read would show);
// - cublasSetMathMode: a live handle, and a mode of DEFAULT, TENSOR_OP, PEDANTIC or
//   TF32_TENSOR_OP, optionally | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION.
// Reduced-precision reduction, as the real library may do it: a handle whose math mode lacks
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (the default) lets cuBLAS pick a split-K
// algorithm that adds the partial sums in C's type. Here an F16/BF16 C with k >= 256
// (split_k_min) on such a handle is computed so: the two halves of K each summed in FP32 and
// rounded to C's type (alpha applied), their sum rounded again. On an H200 this showed as 3
// FP16 ulps off an FP32-accumulated 300x700x530 product; mixtape disallows it.
// Not modelled otherwise: cuBLAS's numerics (tensor-core summation order), workspaces,
// algorithms.
#include "mtemu_internal.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <set>
#include <vector>

#include "fake_blas.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
};

namespace {
using namespace fakeblas;

std::mutex handles_lock;
std::set<cublasHandle_t> handles;

bool live(cublasHandle_t h) {
    std::lock_guard<std::mutex> g(handles_lock);
    return h && handles.count(h);
}

// A status for a call on a handle that cublasCreate did not make (or that was destroyed).
cublasStatus_t bad_handle(const char *api, cublasHandle_t h) {
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle %p is not a live cuBLAS handle", api,
                static_cast<void *>(h));
}

// cublasGetStream, cublasGetMathMode: one field of a live handle.
template <class T>
cublasStatus_t get(const char *api, cublasHandle_t h, T cublasContext::*field, T *out) {
    std::lock_guard<std::mutex> g(handles_lock);
    if (!h || !handles.count(h)) return bad_handle(api, h);
    if (!out) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: null result", api);
    *out = h->*field;
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------- GEMM arguments

// How the inputs are rounded before the products (what tensor cores would read).
enum class input_round { none, tf32, f16, bf16 };

// The scalar type and input rounding of a valid (A, B, C, compute, math mode) combination;
// false when the combination is not one cuBLAS documents (or one this fake does not model).
bool combination(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t ct,
                 cublasMath_t math, bool *f64, input_round *r) {
    bool all32 = a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F;
    bool low = a == b && (a == CUDA_R_16F || a == CUDA_R_16BF) && (c == a || c == CUDA_R_32F);
    int mode = static_cast<int>(math) &
               ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    *f64 = false;
    *r = input_round::none;
    switch (ct) {
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
        *f64 = true;
        return a == CUDA_R_64F && b == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_32F:
        // the handle's math mode may let FP32 data through the tensor cores
        if (all32 && mode == CUBLAS_TF32_TENSOR_OP_MATH) *r = input_round::tf32;
        if (all32 && mode == CUBLAS_TENSOR_OP_MATH) *r = input_round::f16;
        return all32 || low;
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        return all32 || low;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        *r = input_round::tf32;
        return all32;
    case CUBLAS_COMPUTE_32F_FAST_16F:
        *r = input_round::f16;
        return all32;
    case CUBLAS_COMPUTE_32F_FAST_16BF:
        *r = input_round::bf16;
        return all32;
    default:
        return false;
    }
}

bool algo_valid(cublasGemmAlgo_t algo) {
    int a = static_cast<int>(algo);
    return a == CUBLAS_GEMM_DEFAULT || a == CUBLAS_GEMM_DEFAULT_TENSOR_OP ||
           (a >= CUBLAS_GEMM_ALGO0 && a <= CUBLAS_GEMM_ALGO23) ||
           (a >= CUBLAS_GEMM_ALGO0_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

// ---------------------------------------------------------------- the computation

// The smallest K for which a handle that allows reduced-precision reduction splits K in two
// with the partial sums rounded to C's type (see the header).
constexpr long long split_k_min = 256;

// v rounded to the storage type t (F16 or BF16), back as float.
float round_to(cudaDataType t, float v) {
    return t == CUDA_R_16F ? mt_f16_to_f32(mt_f32_to_f16(v)) : mt_bf16_to_f32(mt_f32_to_bf16(v));
}

// A GEMM as queued: plain values, nothing that refers to the handle or the caller's stack.
struct job {
    cublasOperation_t ta, tb;
    long long m, n, k, batch;
    const char *a, *b;
    char *c;
    cudaDataType at, bt, ct;
    long long lda, ldb, ldc, sa, sb, sc;
    bool f64;
    input_round round;
    bool split_k; // the partial sums of two halves of K reduced in C's type (F16/BF16)
    double alpha, beta;
};

float round_input(float x, input_round r) {
    switch (r) {
    case input_round::tf32: { // 10 mantissa bits, to nearest even; inf and nan kept
        uint32_t u = mt_f32_bits(x);
        if ((u & 0x7f800000u) == 0x7f800000u) return x;
        u += 0xfffu + ((u >> 13) & 1u);
        return mt_bits_f32(u & ~0x1fffu);
    }
    case input_round::f16:
        return mt_f16_to_f32(mt_f32_to_f16(x));
    case input_round::bf16:
        return mt_bf16_to_f32(mt_f32_to_bf16(x));
    default:
        return x;
    }
}

// rows x k values, row after row (so that the dot products below read contiguous runs):
// element (r, l) is X[r + l * ld] when x_rows_first, else X[l + r * ld]. op(A) is m x k with
// element (i, l) at A[i + l * lda] (no transpose); op(B)^T is n x k with element (j, l) at
// B[l + j * ldb] (no transpose).
template <typename T>
void gather(std::vector<T> &dst, const char *x, cudaDataType t, bool x_rows_first, long long ld,
            long long rows, long long k, input_round r) {
    dst.resize(static_cast<size_t>(rows * k));
    for (long long i = 0; i < rows; i++)
        for (long long l = 0; l < k; l++) {
            double v = load(x, t, x_rows_first ? i + l * ld : l + i * ld);
            dst[static_cast<size_t>(i * k + l)] =
                sizeof(T) == 8 ? static_cast<T>(v) : round_input(static_cast<float>(v), r);
        }
}

// C = alpha * op(A) op(B) + beta * C per batch entry, accumulating in T (float or double),
// the epilogue in T too, the output rounded once (split_k: twice, see the header).
template <typename T> void run(const job &j) {
    std::vector<T> a, b;
    long long ea = static_cast<long long>(type_size(j.at));
    long long eb = static_cast<long long>(type_size(j.bt));
    long long ec = static_cast<long long>(type_size(j.ct));
    T alpha = static_cast<T>(j.alpha), beta = static_cast<T>(j.beta);
    for (long long p = 0; p < j.batch; p++) {
        gather<T>(a, j.a + p * j.sa * ea, j.at, j.ta == CUBLAS_OP_N, j.lda, j.m, j.k, j.round);
        gather<T>(b, j.b + p * j.sb * eb, j.bt, j.tb != CUBLAS_OP_N, j.ldb, j.n, j.k, j.round);
        char *c = j.c + p * j.sc * ec;
        for (long long col = 0; col < j.n; col++)
            for (long long row = 0; row < j.m; row++) {
                const T *ar = a.data() + row * j.k, *bc = b.data() + col * j.k;
                T acc = 0, v;
                if (j.split_k) { // float only: C is F16/BF16
                    long long half = j.k / 2;
                    T lo = 0;
                    for (long long l = 0; l < half; l++) lo += ar[l] * bc[l];
                    for (long long l = half; l < j.k; l++) acc += ar[l] * bc[l];
                    v = static_cast<T>(round_to(j.ct, static_cast<float>(alpha * lo))) +
                        static_cast<T>(round_to(j.ct, static_cast<float>(alpha * acc)));
                } else {
                    for (long long l = 0; l < j.k; l++) acc += ar[l] * bc[l];
                    v = alpha * acc;
                }
                long long ci = row + col * j.ldc;
                if (beta != 0) v += beta * static_cast<T>(load(c, j.ct, ci)); // beta 0: not read
                store(c, j.ct, ci, static_cast<double>(v));
            }
    }
}

// ---------------------------------------------------------------- the GEMM entry

struct gemm_args {
    const char *api;
    cublasHandle_t h;
    cublasOperation_t ta, tb;
    long long m, n, k;
    const void *alpha, *beta;
    operand a, b, c;
    long long batch;
    cublasComputeType_t compute;
    cublasGemmAlgo_t algo;
};

// The scalar checks: handle, ops, sizes, types, algorithm, scalars in host memory.
cublasStatus_t check_scalars(const gemm_args &g, bool *f64, input_round *r, cudaStream_t *s,
                             cublasMath_t *math_out) {
    cublasMath_t math;
    {
        std::lock_guard<std::mutex> lk(handles_lock);
        if (!g.h || !handles.count(g.h)) return bad_handle(g.api, g.h);
        math = g.h->math;
        *s = g.h->stream;
    }
    *math_out = math;
    for (cublasOperation_t op : {g.ta, g.tb})
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: op %d (only CUBLAS_OP_N, CUBLAS_OP_T)",
                        g.api, static_cast<int>(op));
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: m %lld, n %lld, k %lld, batch %lld", g.api,
                    g.m, g.n, g.k, g.batch);
    if (!combination(g.a.type, g.b.type, g.c.type, g.compute, math, f64, r))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: A %s, B %s, C %s with compute type %d is not a supported combination",
                    g.api, type_name(g.a.type), type_name(g.b.type), type_name(g.c.type),
                    static_cast<int>(g.compute));
    if (!algo_valid(g.algo))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: algo %d", g.api, static_cast<int>(g.algo));
    size_t scalar = *f64 ? sizeof(double) : sizeof(float);
    if (!g.alpha || !g.beta)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: null alpha or beta", g.api);
    if (mtemu::device_range(g.alpha, scalar) || mtemu::device_range(g.beta, scalar))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: alpha or beta points into device memory, but the pointer mode is host",
                    g.api);
    return CUBLAS_STATUS_SUCCESS;
}

// The operand checks: extents, and C apart from A, B and its own other entries.
cublasStatus_t check_operands(const gemm_args &g) {
    bool reads_ab = g.k > 0 && g.m > 0 && g.n > 0;
    for (const operand *op : {&g.a, &g.b, &g.c}) {
        if (op != &g.c && !reads_ab) continue;
        cublasStatus_t st = check_operand(g.api, *op, g.batch);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    if (g.batch > 1 && g.m > 0 && g.n > 0) {
        long long need = (g.n - 1) * g.c.ld + g.m;
        long long sc = g.c.stride < 0 ? -g.c.stride : g.c.stride;
        if (sc < need)
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: strideC %lld: the %lld entries of C (%lld x %lld, ldc %lld) overlap",
                        g.api, g.c.stride, g.batch, g.m, g.n, g.c.ld);
    }
    if (reads_ab && g.batch > 0 && (overlap(g.a, g.c, g.batch) || overlap(g.b, g.c, g.batch)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: C (%p) overlaps A (%p) or B (%p)", g.api,
                    g.c.p, g.a.p, g.b.p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm(const gemm_args &g) {
    bool f64 = false;
    input_round r = input_round::none;
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasStatus_t st = check_scalars(g, &f64, &r, &stream, &math);
    if (st == CUBLAS_STATUS_SUCCESS) st = check_operands(g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
    job j;
    j.ta = g.ta;
    j.tb = g.tb;
    j.m = g.m;
    j.n = g.n;
    j.k = g.k;
    j.batch = g.batch;
    j.a = static_cast<const char *>(g.a.p);
    j.b = static_cast<const char *>(g.b.p);
    j.c = static_cast<char *>(const_cast<void *>(g.c.p));
    j.at = g.a.type;
    j.bt = g.b.type;
    j.ct = g.c.type;
    j.lda = g.a.ld;
    j.ldb = g.b.ld;
    j.ldc = g.c.ld;
    j.sa = g.a.stride;
    j.sb = g.b.stride;
    j.sc = g.c.stride;
    j.f64 = f64;
    j.round = r;
    j.split_k = (g.c.type == CUDA_R_16F || g.c.type == CUDA_R_16BF) && g.k >= split_k_min &&
                !(static_cast<int>(math) &
                  static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    // host pointer mode: the scalars are read now, typed by the compute type
    j.alpha = f64 ? *static_cast<const double *>(g.alpha) : *static_cast<const float *>(g.alpha);
    j.beta = f64 ? *static_cast<const double *>(g.beta) : *static_cast<const float *>(g.beta);
    mtemu::enqueue(stream, [j] {
        if (j.f64)
            run<double>(j);
        else
            run<float>(j);
    });
    return CUBLAS_STATUS_SUCCESS;
}

// The stored shape of op(X) = rows x cols: X itself is cols x rows when transposed.
operand stored(const char *name, const void *p, cudaDataType t, cublasOperation_t op,
               long long rows, long long cols, long long ld, long long stride) {
    bool n = op == CUBLAS_OP_N;
    return operand{name, p, t, n ? rows : cols, n ? cols : rows, ld, stride};
}

} // namespace

// ---------------------------------------------------------------- the cuBLAS API
extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: null result pointer");
    cublasHandle_t h = new cublasContext;
    std::lock_guard<std::mutex> g(handles_lock);
    handles.insert(h);
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

// Queued GEMMs hold no reference to the handle, so destroying it with work pending is safe.
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    std::lock_guard<std::mutex> g(handles_lock);
    if (!handle || !handles.erase(handle)) return bad_handle("cublasDestroy", handle);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    std::lock_guard<std::mutex> g(handles_lock);
    if (!handle || !handles.count(handle)) return bad_handle("cublasSetStream", handle);
    handle->stream = streamId;
    // as cuBLAS: a new stream drops a user workspace (it belonged to the old stream's order)
    handle->workspace = nullptr;
    handle->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    return get("cublasGetStream", handle, &cublasContext::stream, streamId);
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    int m = static_cast<int>(mode) &
            ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    if (!live(handle)) return bad_handle("cublasSetMathMode", handle);
    if (m != CUBLAS_DEFAULT_MATH && m != CUBLAS_TENSOR_OP_MATH && m != CUBLAS_PEDANTIC_MATH &&
        m != CUBLAS_TF32_TENSOR_OP_MATH)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: mode %d is not emulated",
                    static_cast<int>(mode));
    std::lock_guard<std::mutex> g(handles_lock);
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    return get("cublasGetMathMode", handle, &cublasContext::math, mode);
}

// Accepted and checked (device memory, 256-byte aligned as cuBLAS requires), never used.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                     size_t workspaceSizeInBytes) {
    if (!live(handle)) return bad_handle("cublasSetWorkspace", handle);
    if (workspaceSizeInBytes > 0 && (!mtemu::device_range(workspace, workspaceSizeInBytes) ||
                                     reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasSetWorkspace(%p, %zu bytes): not a 256-byte aligned range inside one "
                    "device allocation",
                    workspace, workspaceSizeInBytes);
    std::lock_guard<std::mutex> g(handles_lock);
    handle->workspace = workspace;
    handle->workspace_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) {
    return status_name(status);
}

// The texts of the real library.
const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "the functionality requested requires some license and an error was detected "
               "when trying to check the current licensing";
    }
    return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    operand a = stored("A", A, Atype, transa, m, k, lda, 0);
    operand b = stored("B", B, Btype, transb, k, n, ldb, 0);
    operand c = stored("C", C, Ctype, CUBLAS_OP_N, m, n, ldc, 0);
    return gemm({"cublasGemmEx", handle, transa, transb, m, n, k, alpha, beta, a, b, c, 1,
                 computeType, algo});
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    operand a = stored("A", A, Atype, transa, m, k, lda, strideA);
    operand b = stored("B", B, Btype, transb, k, n, ldb, strideB);
    operand c = stored("C", C, Ctype, CUBLAS_OP_N, m, n, ldc, strideC);
    return gemm({"cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, beta, a, b,
                 c, batchCount, computeType, algo});
}

} // extern "C"

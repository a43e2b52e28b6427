// A control for compute-sanitizer's initcheck (tools/gpu_steps_tools.sh): no mixtape code, only
// cuBLAS and one kernel of our own. C = A @ B by cublasGemmEx (F16 on tensor cores, then F64)
// into memory nothing else wrote, then a kernel reads every element of C. Every byte of C was
// written by cuBLAS, so any "Uninitialized __global__ memory read" that initcheck reports here
// is initcheck not seeing cuBLAS's stores (Hopper kernels store through the tensor memory
// accelerator), not a bug: the sanitizer step then reports mixtape's initcheck findings on
// memory that cuBLAS or cuDNN wrote as unattributable. The program's own checks: every CUDA
// and cuBLAS status, and the sum of C against the host's.
// Build: nvcc -O2 -arch=sm_90 tools/initcheck_control.cu -lcublas -o initcheck_control
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));                              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define BLAS(x)                                                                                    \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            std::printf("FAIL %s: status %d\n", #x, (int)s_);                                      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

template <typename T> __global__ void sum_all(const T *c, int n, double *out) {
    double s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        s += (double)c[i];
    atomicAdd(out, s);
}

static double host_value(int i) { return (double)((i * 7 + 3) % 11) / 8.0 - 0.5; }

// C[n, n] = A[n, n] @ B[n, n] with every entry of A and B a small multiple of 1/8 (exact in
// F16, sums exact in FP32): the sum of C is known on the host.
template <typename T>
static int run(cublasHandle_t h, int n, cudaDataType ty, cublasComputeType_t ct, const char *name) {
    std::vector<T> a((size_t)n * n), b((size_t)n * n);
    double want = 0;
    std::vector<double> colsum(n, 0.0), rowsum(n, 0.0);
    for (int i = 0; i < n * n; i++) {
        a[i] = (T)host_value(i);
        b[i] = (T)host_value(i + 5);
    }
    // sum of A @ B (column-major) = sum_k (sum_i A[i, k]) (sum_j B[k, j])
    for (int k = 0; k < n; k++)
        for (int i = 0; i < n; i++) {
            colsum[k] += (double)a[(size_t)k * n + i];
            rowsum[k] += (double)b[(size_t)i * n + k];
        }
    for (int k = 0; k < n; k++) want += colsum[k] * rowsum[k];
    T *da, *db, *dc;
    double *dsum, got = 0;
    size_t bytes = sizeof(T) * n * n;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes)); // not written before the GEMM
    CHECK(cudaMalloc(&dsum, sizeof(double)));
    CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dsum, 0, sizeof(double)));
    float one32 = 1, zero32 = 0;
    double one64 = 1, zero64 = 0;
    bool f64 = ty == CUDA_R_64F;
    const void *one = f64 ? (const void *)&one64 : (const void *)&one32;
    const void *zero = f64 ? (const void *)&zero64 : (const void *)&zero32;
    BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, one, da, ty, n, db, ty, n, zero, dc, ty,
                      n, ct, CUBLAS_GEMM_DEFAULT));
    sum_all<<<64, 256>>>(dc, n * n, dsum);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&got, dsum, sizeof(double), cudaMemcpyDeviceToHost));
    // F64 is exact; F16 rounds each entry of C once: up to 2^-11 of |C| (about 16 here), a
    // sum of n * n such errors (an H200 was 4051 off in 1024 * 1024 entries)
    double tol = f64 ? 0.0 : 0x1p-11 * 16.0 * (double)n * n;
    bool ok = got - want <= tol && want - got <= tol;
    std::printf("%s %dx%dx%d: sum of C %.9g, host %.9g: %s\n", name, n, n, n, got, want,
                ok ? "agree" : "DIFFER");
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dsum);
    return ok ? 0 : 1;
}

int main() {
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    int rc = run<__half>(h, 1024, CUDA_R_16F, CUBLAS_COMPUTE_32F, "F16 GEMM (tensor cores)");
    rc |= run<double>(h, 256, CUDA_R_64F, CUBLAS_COMPUTE_64F, "F64 GEMM");
    cublasDestroy(h);
    return rc;
}

// The fake cuBLASLt on its own: the epilogues compute what cuBLASLt documents (bias per row
// of the column-major D, RELU, GELU in its tanh form, the pre-activation in the aux matrix),
// and the argument checks refuse what the real library refuses (a BIAS epilogue without a
// bias pointer, a bias of the wrong type, an aux ld that is not a multiple of 8, a host
// pointer, layouts that do not fit, dead descriptors, pointers less aligned than the chosen
// algorithm assumes) without queueing anything. The reduction scheme mask is checked, and a
// preference that allows reducing in D's type gives the split-K result of an FP16 D (two
// halves of K rounded to FP16, then added), one that allows only COMPUTE_TYPE | NONE the FP32
// sum rounded once.
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
extern "C" {
#include <cmocka.h>
}
// half.h before the toolkit headers: its locals named `half` would shadow cuda_fp16.h's type
#include "../../src/math/half.h"
#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace {

const long long M = 16, N = 8, K = 5; // D is M x N column-major (cuBLASLt's m, n)

struct fixture {
    cublasLtHandle_t h = nullptr;
    cudaStream_t s = nullptr;
    float *a = nullptr, *b = nullptr, *d = nullptr, *bias = nullptr, *aux = nullptr;
    std::vector<float> ha, hb, hbias;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;

    fixture() {
        assert_int_equal(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
        assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
        ha.resize(M * K);
        hb.resize(K * N);
        hbias.resize(M);
        for (size_t i = 0; i < ha.size(); i++) ha[i] = 0.25f * static_cast<float>(i % 7) - 0.7f;
        for (size_t i = 0; i < hb.size(); i++) hb[i] = 0.5f - 0.125f * static_cast<float>(i % 9);
        for (size_t i = 0; i < hbias.size(); i++) hbias[i] = 0.1f * static_cast<float>(i) - 0.8f;
        upload(&a, ha);
        upload(&b, hb);
        upload(&bias, hbias);
        assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&d), M * N * 4), cudaSuccess);
        assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&aux), M * N * 4), cudaSuccess);
        assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                         CUBLAS_STATUS_SUCCESS);
        assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, M, K, M), 0);
        assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, K, N, K), 0);
        assert_int_equal(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, M, N, M), 0);
    }
    ~fixture() {
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        for (float *p : {a, b, d, bias, aux}) cudaFree(p);
        cudaStreamDestroy(s);
        cublasLtDestroy(h);
    }
    void upload(float **p, const std::vector<float> &v) {
        assert_int_equal(cudaMalloc(reinterpret_cast<void **>(p), v.size() * 4), cudaSuccess);
        assert_int_equal(cudaMemcpy(*p, v.data(), v.size() * 4, cudaMemcpyHostToDevice),
                         cudaSuccess);
    }
    template <typename T> cublasStatus_t set(cublasLtMatmulDescAttributes_t at, T v) {
        return cublasLtMatmulDescSetAttribute(desc, at, &v, sizeof v);
    }
    cublasStatus_t run() {
        float one = 1.0f, zero = 0.0f;
        return cublasLtMatmul(h, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, nullptr, nullptr, 0,
                              s);
    }
    std::vector<float> download(const float *p) {
        std::vector<float> v(M * N);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        assert_int_equal(cudaMemcpy(v.data(), p, M * N * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
    }
    float pre(long long r, long long c, bool with_bias) const {
        float acc = 0;
        for (long long l = 0; l < K; l++) acc += ha[r + l * M] * hb[l + c * K];
        return acc + (with_bias ? hbias[r] : 0.0f);
    }
};

float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}

void test_relu_bias(void **state) {
    (void)state;
    fixture f;
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_BIAS), 0);
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(f.bias)),
                     0);
    assert_int_equal(f.run(), CUBLAS_STATUS_SUCCESS);
    std::vector<float> got = f.download(f.d);
    int negatives = 0;
    for (long long c = 0; c < N; c++)
        for (long long r = 0; r < M; r++) {
            float p = f.pre(r, c, true);
            negatives += p < 0;
            assert_float_equal(got[r + c * M], p > 0 ? p : 0.0f, 1e-5f);
        }
    assert_true(negatives > 0); // the relu did something
}

void test_gelu_aux_bias(void **state) {
    (void)state;
    fixture f;
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS), 0);
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(f.bias)),
                     0);
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void *>(f.aux)),
                     0);
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(M)), 0);
    assert_int_equal(f.run(), CUBLAS_STATUS_SUCCESS);
    std::vector<float> got = f.download(f.d), pre = f.download(f.aux);
    for (long long c = 0; c < N; c++)
        for (long long r = 0; r < M; r++) {
            float p = f.pre(r, c, true);
            assert_float_equal(pre[r + c * M], p, 1e-5f);
            assert_float_equal(got[r + c * M], gelu_tanh(p), 1e-5f);
        }
}

// Each misuse is refused at the call (nothing is queued, D keeps its poison).
void test_refusals(void **state) {
    (void)state;
    {
        fixture f; // BIAS epilogue, no bias pointer
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // a bias pointer without an epilogue that reads it
        assert_int_equal(
            f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(f.bias)), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // a bias typed unlike D
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS), 0);
        assert_int_equal(
            f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(f.bias)), 0);
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{CUDA_R_16F}), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // a host bias
        static float host_bias[M];
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS), 0);
        assert_int_equal(
            f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(host_bias)), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // aux ld not a multiple of 8
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX), 0);
        assert_int_equal(
            f.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void *>(f.aux)), 0);
        assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{M + 1}), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // an attribute set with the wrong size
        int16_t small = 1;
        assert_int_equal(cublasLtMatmulDescSetAttribute(f.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &small, sizeof small),
                         CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // layouts that do not fit: B with K + 1 rows
        cublasLtMatrixLayoutDestroy(f.lb);
        assert_int_equal(cublasLtMatrixLayoutCreate(&f.lb, CUDA_R_32F, K + 1, N, K + 1), 0);
        assert_int_equal(f.run(), CUBLAS_STATUS_INVALID_VALUE);
    }
    {
        fixture f; // a destroyed descriptor
        cublasLtMatmulDescDestroy(f.desc);
        f.desc = nullptr;
        float one = 1.0f, zero = 0.0f;
        assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, f.a, f.la, f.b, f.lb, &zero, f.d, f.ld,
                                        f.d, f.ld, nullptr, nullptr, 0, f.s),
                         CUBLAS_STATUS_INVALID_VALUE);
    }
}

// Alignment, as a GPU kernel needs it: algo NULL (the default preference) assumes 256 bytes
// for every matrix, an algorithm from the heuristic what its preference promised, and the
// bias at least 16 bytes; an emptied heuristic answers NOT_SUPPORTED with no result.
void test_alignment(void **state) {
    (void)state;
    fixture f;
    float *a4 = nullptr, *bias4 = nullptr; // one float in: 4-byte aligned
    assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&a4), (M * K + 1) * 4), cudaSuccess);
    assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&bias4), (M + 1) * 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(a4 + 1, f.ha.data(), M * K * 4, cudaMemcpyHostToDevice),
                     cudaSuccess);
    float one = 1.0f, zero = 0.0f;
    assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, a4 + 1, f.la, f.b, f.lb, &zero, f.d, f.ld,
                                    f.d, f.ld, nullptr, nullptr, 0, f.s),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatmulPreference_t p = nullptr;
    assert_int_equal(cublasLtMatmulPreferenceCreate(&p), CUBLAS_STATUS_SUCCESS);
    uint32_t four = 4, three = 3;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &three, sizeof three),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four),
                     CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(f.h, f.desc, f.la, f.lb, f.ld, f.ld, p, 1, &r, &n),
        CUBLAS_STATUS_SUCCESS);
    assert_int_equal(n, 1);
    assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, a4 + 1, f.la, f.b, f.lb, &zero, f.d, f.ld,
                                    f.d, f.ld, &r.algo, nullptr, 0, f.s),
                     CUBLAS_STATUS_SUCCESS);
    std::vector<float> got = f.download(f.d);
    for (long long c = 0; c < N; c++)
        for (long long i = 0; i < M; i++)
            assert_float_equal(got[i + c * M], f.pre(i, c, false), 1e-5f);
    // the same algorithm with B only 4-byte aligned: B was promised 256
    assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, f.a, f.la, a4 + 1, f.lb, &zero, f.d, f.ld,
                                    f.d, f.ld, &r.algo, nullptr, 0, f.s),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    // an algorithm allowed a workspace may need one: then it must be given
    uint64_t ws_max = 1 << 20;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(f.h, f.desc, f.la, f.lb, f.ld, f.ld, p, 1, &r, &n),
        CUBLAS_STATUS_SUCCESS);
    assert_true(r.workspaceSize > 0 && r.workspaceSize <= ws_max);
    assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, a4 + 1, f.la, f.b, f.lb, &zero, f.d, f.ld,
                                    f.d, f.ld, &r.algo, nullptr, 0, f.s),
                     CUBLAS_STATUS_INVALID_VALUE);
    void *ws = nullptr;
    assert_int_equal(cudaMalloc(&ws, r.workspaceSize), cudaSuccess);
    assert_int_equal(cublasLtMatmul(f.h, f.desc, &one, a4 + 1, f.la, f.b, f.lb, &zero, f.d, f.ld,
                                    f.d, f.ld, &r.algo, ws, r.workspaceSize, f.s),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamSynchronize(f.s), cudaSuccess);
    cudaFree(ws);
    // a bias 4 bytes in
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS), 0);
    assert_int_equal(f.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void *>(bias4 + 1)),
                     0);
    assert_int_equal(f.run(), CUBLAS_STATUS_NOT_SUPPORTED);
    // no algorithm at all
    assert_int_equal(setenv("MTEMU_CUBLASLT_NO_ALGO", "1", 1), 0);
    n = 7;
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(f.h, f.desc, f.la, f.lb, f.ld, f.ld, p, 1, &r, &n),
        CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(n, 0);
    assert_int_equal(unsetenv("MTEMU_CUBLASLT_NO_ALGO"), 0);
    assert_int_equal(cublasLtMatmulPreferenceDestroy(p), CUBLAS_STATUS_SUCCESS);
    cudaFree(a4);
    cudaFree(bias4);
}

// FP16 operands and D, K = 512: the default preference (every reduction scheme) may reduce
// split-K partial sums in FP16, modelled as two halves of K each rounded to FP16; a mask of
// COMPUTE_TYPE | NONE (what mixtape sets) keeps the FP32 sum, rounded once. A mask with bits
// outside CUBLASLT_REDUCTION_SCHEME_MASK, or of the wrong size, is refused.
void test_reduction_scheme(void **state) {
    (void)state;
    const long long m = 4, n = 3, k = 512;
    cublasLtHandle_t h = nullptr;
    cudaStream_t s = nullptr;
    assert_int_equal(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    std::vector<uint16_t> ha(m * k), hb(k * n);
    std::vector<float> fa(m * k), fb(k * n);
    for (long long i = 0; i < m * k; i++) {
        ha[i] = mt_f32_to_f16(0.0625f * static_cast<float>((i * 7) % 13) - 0.33f);
        fa[i] = mt_f16_to_f32(ha[i]);
    }
    for (long long i = 0; i < k * n; i++) {
        hb[i] = mt_f32_to_f16(0.125f * static_cast<float>((i * 5) % 11) - 0.47f);
        fb[i] = mt_f16_to_f32(hb[i]);
    }
    void *a = nullptr, *b = nullptr, *d = nullptr;
    assert_int_equal(cudaMalloc(&a, ha.size() * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, hb.size() * 2), cudaSuccess);
    assert_int_equal(cudaMalloc(&d, m * n * 2), cudaSuccess);
    assert_int_equal(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, m, k, m), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, n, k), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16F, m, n, m), 0);
    // the expected bits: FP32 sums in order, rounded once or per half
    std::vector<uint16_t> once(m * n), split(m * n);
    for (long long c = 0; c < n; c++)
        for (long long r = 0; r < m; r++) {
            float lo = 0, hi = 0, all = 0;
            for (long long l = 0; l < k; l++) {
                float p = fa[r + l * m] * fb[l + c * k];
                all += p;
                (l < k / 2 ? lo : hi) += p;
            }
            once[r + c * m] = mt_f32_to_f16(all);
            split[r + c * m] =
                mt_f32_to_f16(mt_f16_to_f32(mt_f32_to_f16(lo)) + mt_f16_to_f32(mt_f32_to_f16(hi)));
        }
    assert_memory_not_equal(once.data(), split.data(),
                            once.size() * 2); // the inputs tell them apart
    cublasLtMatmulPreference_t p = nullptr;
    assert_int_equal(cublasLtMatmulPreferenceCreate(&p), CUBLAS_STATUS_SUCCESS);
    uint32_t bad = 8;
    uint16_t small = CUBLASLT_REDUCTION_SCHEME_NONE;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &bad, sizeof bad),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &small, sizeof small),
                     CUBLAS_STATUS_INVALID_VALUE);
    float one = 1.0f, zero = 0.0f;
    std::vector<uint16_t> got(m * n);
    for (int strict = 0; strict < 2; strict++) {
        if (strict) {
            uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_NONE;
            assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                                 p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask),
                             CUBLAS_STATUS_SUCCESS);
        }
        cublasLtMatmulHeuristicResult_t r;
        int count = 0;
        assert_int_equal(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, p, 1, &r, &count),
                         CUBLAS_STATUS_SUCCESS);
        assert_int_equal(count, 1);
        assert_int_equal(cublasLtMatmul(h, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &r.algo,
                                        nullptr, 0, s),
                         CUBLAS_STATUS_SUCCESS);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        assert_int_equal(cudaMemcpy(got.data(), d, got.size() * 2, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(got.data(), strict ? once.data() : split.data(), got.size() * 2);
    }
    assert_int_equal(cublasLtMatmulPreferenceDestroy(p), CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    for (void *q : {a, b, d}) cudaFree(q);
    cudaStreamDestroy(s);
    cublasLtDestroy(h);
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu_bias),        cmocka_unit_test(test_gelu_aux_bias),
        cmocka_unit_test(test_refusals),         cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_reduction_scheme),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}

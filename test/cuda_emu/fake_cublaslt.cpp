// The cuBLASLt functions mixtape calls (the GEMM with a bias / activation epilogue), for the
// emulated device. Compiled against the toolkit's cublasLt.h, so the compiler checks every
// signature. Handles, matmul descriptors and matrix layouts are registered when created, and
// a call with one that was not (or was destroyed) is refused.
//
// cublasLtMatmul is queued on its stream and computed on the host when the stream runs:
// column-major D = alpha op(A) op(B) (+ beta C), FP32 accumulation, then the epilogue in FP32
// (bias added per row of D, RELU, or GELU in the tanh form cuBLASLt computes; the _AUX
// variants also store the pre-activation), the output rounded once.
//
// Checked like the real library (stricter where noted), each violation a
// CUBLAS_STATUS_INVALID_VALUE (or NOT_SUPPORTED for a combination it lacks) after one stderr line:
// - attributes set with the size of their documented type; only the attributes below;
// - A/B types equal, C and D of one type, the (A, D, compute, scale) combinations
//   32F/32F/COMPUTE_32F/32F and 16F|16BF/same|32F/COMPUTE_32F/32F;
// - op(A) m x k, op(B) k x n, C and D m x n; ld >= rows; every matrix inside one device
//   allocation; D apart from A and B; beta must be 0 (C is never read: a non-zero beta is
//   CUBLAS_STATUS_NOT_SUPPORTED here, mixtape never asks for one);
// - an epilogue with BIAS needs a bias pointer to m elements of device memory whose type
//   (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, default D's) is D's; an _AUX epilogue needs an aux
//   pointer, an aux ld >= m divisible by 8 (GELU) and an aux type of D's, its matrix inside
//   device memory and apart from D; a bias or aux pointer set without an epilogue that uses
//   it is refused (stricter than cuBLASLt, which ignores it: a mixtape bug either way);
// - alpha and beta host pointers; a workspace, when given, inside device memory.
// - alignment, as a GPU kernel needs it: cublasLtMatmulAlgoGetHeuristic hands out an algorithm
//   that assumes the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES (default
//   256, cuBLASLt's documented default), and cublasLtMatmul refuses pointers that break what
//   its algorithm assumes; algo NULL (the implicit heuristic with the default preference)
//   assumes 256 bytes. Bias and aux pointers need 16 bytes (the epilogue's vector loads; not
//   covered by the preference). On a GPU such a call picks a kernel that faults with
//   "misaligned address" or answers NOT_SUPPORTED; here it is CUBLAS_STATUS_NOT_SUPPORTED.
//   MTEMU_CUBLASLT_NO_ALGO=1 in the environment makes the heuristic find no algorithm
//   (NOT_SUPPORTED, count 0), as the real one may for a shape or alignment, so that the
//   caller's fallback is tested.
// - CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: a uint32_t of CUBLASLT_REDUCTION_SCHEME_* bits
//   only (others INVALID_VALUE); default CUBLASLT_REDUCTION_SCHEME_MASK, as cuBLASLt's.
// Reduced-precision reduction, as the real library may do it: an algorithm from a preference
// whose mask allows INPLACE or OUTPUT_TYPE (the default, and algo NULL) may split K and add
// the partial sums in D's type. Here a F16/BF16 D with k >= 256 (split_k_min) under such an
// algorithm is computed so: the two halves of K each summed in FP32 and rounded to D's type
// (alpha applied), then added in FP32 for the epilogue and the final rounding. mixtape allows
// only COMPUTE_TYPE | NONE (lt_plan_cache.c), which keeps the FP32 sum.
// Fault injection for tests of the library's error paths: MTEMU_CUBLASLT_FAIL="name=status"
// makes the entry point `name` (a create, set, heuristic or matmul) return `status` (a
// number) without doing anything.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "fake_blas.h"
#include "mtemu_cublaslt_counts.h"

#include <cublasLt.h>

namespace {
using namespace fakeblas;

struct lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int32_t bias_type = -1;
    void *aux = nullptr;
    int64_t aux_ld = 0;
    int32_t aux_type = -1;
};

struct lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

// What the caller promises the heuristic (cuBLASLt's defaults: no workspace, 256 bytes,
// every reduction scheme allowed).
struct lt_pref {
    uint64_t max_workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; // A, B, C, D
    uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};
// The schemes that reduce split-K partial sums in D's type, and the smallest K that the
// heuristic splits when one of them is allowed (see the header).
constexpr uint32_t output_type_reduction =
    CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
constexpr long long split_k_min = 256;
constexpr uint32_t default_alignment = 256;
constexpr uintptr_t epilogue_alignment = 16; // bias and aux pointers
// An algorithm from the heuristic: data[0] this tag, data[1..4] the alignments of A, B, C, D
// it was chosen for, data[5] the workspace it needs: algo_workspace bytes when the preference
// allows that much (so that callers' workspace path runs), else none; data[6] 1 when the
// preference let it reduce in D's type.
constexpr size_t algo_workspace = 4096;
constexpr uintptr_t workspace_alignment = 256; // as cublasSetWorkspace requires
constexpr uint64_t algo_tag = 0x6d74656d756c7401ull;

std::mutex lt_lock;
std::map<void *, lt_pref> lt_prefs;
std::set<void *> lt_handles;
std::map<void *, lt_desc> lt_descs;
std::map<void *, lt_layout> lt_layouts;
// How often mixtape called each kind of entry point (mtemu_cublaslt_counts_get), so tests
// can tell how much host work one fused linear costs and that cached plans are reused.
mtemu_cublaslt_counts lt_counts; // under lt_lock

const uint32_t EP_BIAS = CUBLASLT_EPILOGUE_BIAS, EP_RELU = CUBLASLT_EPILOGUE_RELU,
               EP_GELU = CUBLASLT_EPILOGUE_GELU, EP_AUX = 128;

bool epilogue_known(uint32_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return true;
    default:
        return false;
    }
}

// A matmul as queued: plain values only.
struct lt_job {
    cublasOperation_t ta, tb;
    long long m, n, k, lda, ldb, ldd, aux_ld;
    const char *a, *b, *bias;
    char *d, *aux;
    cudaDataType at, dt;
    float alpha;
    uint32_t epilogue;
    bool split_k; // the partial sums of two halves of K reduced in D's type (F16/BF16)
};

float gelu_tanh(float x) { // cuBLASLt's GELU: the tanh approximation
    float inner = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + std::tanh(inner));
}

// v rounded to the storage type t (F16 or BF16), back as float.
float round_to(cudaDataType t, float v) {
    return t == CUDA_R_16F ? mt_f16_to_f32(mt_f32_to_f16(v)) : mt_bf16_to_f32(mt_f32_to_bf16(v));
}

void lt_run(const lt_job &j) {
    long long half = j.split_k ? j.k / 2 : 0;
    for (long long col = 0; col < j.n; col++)
        for (long long row = 0; row < j.m; row++) {
            float lo = 0, acc = 0;
            for (long long l = 0; l < j.k; l++) {
                long long ai = j.ta == CUBLAS_OP_N ? row + l * j.lda : l + row * j.lda;
                long long bi = j.tb == CUBLAS_OP_N ? l + col * j.ldb : col + l * j.ldb;
                (l < half ? lo : acc) += static_cast<float>(load(j.a, j.at, ai)) *
                                         static_cast<float>(load(j.b, j.at, bi));
            }
            float v = j.split_k ? round_to(j.dt, j.alpha * lo) + round_to(j.dt, j.alpha * acc)
                                : j.alpha * acc;
            if (j.epilogue & EP_BIAS) v += static_cast<float>(load(j.bias, j.dt, row));
            if (j.epilogue & EP_AUX) store(j.aux, j.dt, row + col * j.aux_ld, v);
            if (j.epilogue & EP_RELU) v = v > 0 ? v : (v == v ? 0.0f : v);
            if (j.epilogue & EP_GELU) v = gelu_tanh(v);
            store(j.d, j.dt, row + col * j.ldd, v);
        }
}

cublasStatus_t check_types(const lt_desc &d, const lt_layout &a, const lt_layout &b,
                           const lt_layout &c, const lt_layout &dl) {
    const char *api = "cublasLtMatmul";
    if (a.type != b.type || c.type != dl.type)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: A %s, B %s, C %s, D %s: A/B and C/D differ",
                    api, type_name(a.type), type_name(b.type), type_name(c.type),
                    type_name(dl.type));
    bool f32 = a.type == CUDA_R_32F && dl.type == CUDA_R_32F;
    bool low = (a.type == CUDA_R_16F || a.type == CUDA_R_16BF) &&
               (dl.type == a.type || dl.type == CUDA_R_32F);
    if ((d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_PEDANTIC) ||
        d.scale != CUDA_R_32F || !(f32 || low))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: A %s, D %s with compute type %d and scale type %s is not emulated", api,
                    type_name(a.type), type_name(dl.type), static_cast<int>(d.compute),
                    type_name(d.scale));
    return CUBLAS_STATUS_SUCCESS;
}

// Bias and aux: present exactly when the epilogue uses them, typed and inside device memory.
cublasStatus_t check_epilogue(const lt_desc &d, const lt_layout &dl, long long m, long long n,
                              const void *dp) {
    const char *api = "cublasLtMatmul";
    bool bias = d.epilogue & EP_BIAS, aux = d.epilogue & EP_AUX;
    if (bias != (d.bias != nullptr))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %u with bias pointer %p", api,
                    d.epilogue, d.bias);
    if (aux != (d.aux != nullptr))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %u with aux pointer %p", api,
                    d.epilogue, d.aux);
    for (const void *p :
         {bias ? d.bias : nullptr, aux ? static_cast<const void *>(d.aux) : nullptr})
        if (reinterpret_cast<uintptr_t>(p) % epilogue_alignment != 0)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                        "%s: epilogue %s pointer %p is not %zu-byte aligned (a GPU kernel faults "
                        "with a misaligned address)",
                        api, p == d.bias ? "bias" : "aux", p, (size_t)epilogue_alignment);
    if (bias) {
        cudaDataType bt = d.bias_type < 0 ? dl.type : static_cast<cudaDataType>(d.bias_type);
        if (bt != dl.type)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: bias type %s, D type %s", api,
                        type_name(bt), type_name(dl.type));
        if (m > 0 && !mtemu::device_range(d.bias, static_cast<size_t>(m) * type_size(bt)))
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: bias %p: %lld elements of %s are not inside one device allocation",
                        api, d.bias, m, type_name(bt));
    }
    if (aux) {
        cudaDataType xt = d.aux_type < 0 ? dl.type : static_cast<cudaDataType>(d.aux_type);
        if (xt != dl.type || d.aux_ld < m || d.aux_ld % 8 != 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: aux type %s (D %s), aux ld %lld (m %lld; a multiple of 8 needed)", api,
                        type_name(xt), type_name(dl.type), static_cast<long long>(d.aux_ld), m);
        operand x{"aux", d.aux, xt, m, n, d.aux_ld, 0}, dd{"D", dp, dl.type, m, n, dl.ld, 0};
        cublasStatus_t st = check_operand(api, x, 1);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        if (overlap(x, dd, 1))
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: aux (%p) overlaps D (%p)", api, d.aux,
                        dp);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t injected(const char *name) {
    const char *v = std::getenv("MTEMU_CUBLASLT_FAIL");
    size_t n = std::strlen(name);
    if (!v || std::strncmp(v, name, n) != 0 || v[n] != '=') return CUBLAS_STATUS_SUCCESS;
    int s = std::atoi(v + n + 1);
    if (s == 0) return CUBLAS_STATUS_SUCCESS;
    return fail(static_cast<cublasStatus_t>(s), "%s: failure injected by MTEMU_CUBLASLT_FAIL",
                name);
}

template <typename T> cublasStatus_t set_value(T *dst, const void *buf, size_t size, int attr) {
    if (!buf || size != sizeof(T))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmulDescSetAttribute: attribute %d takes %zu bytes, got %zu", attr,
                    sizeof(T), size);
    std::memcpy(dst, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulDescDestroy, cublasLtMatrixLayoutDestroy: d must be live in `live`.
template <typename T, typename V>
cublasStatus_t destroy(const char *api, T *d, std::map<void *, V> &live) {
    std::lock_guard<std::mutex> g(lt_lock);
    if (!live.erase(d))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %p is not live", api, static_cast<void *>(d));
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

// The alignments an algorithm assumes of A, B, C and D (algo NULL: the default preference's).
cublasStatus_t check_alignment(const cublasLtMatmulAlgo_t *algo, const void *const (&p)[4],
                               const void *ws, size_t ws_size) {
    const char *api = "cublasLtMatmul";
    uint64_t need[4] = {default_alignment, default_alignment, default_alignment, default_alignment};
    if (algo) {
        if (algo->data[0] != algo_tag)
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: algo %p did not come from cublasLtMatmulAlgoGetHeuristic", api,
                        static_cast<const void *>(algo));
        for (int i = 0; i < 4; i++) need[i] = algo->data[1 + i];
    }
    size_t ws_need = algo ? static_cast<size_t>(algo->data[5]) : 0;
    if (ws_need > ws_size ||
        (ws_need > 0 && (!mtemu::device_range(ws, ws_need) ||
                         reinterpret_cast<uintptr_t>(ws) % workspace_alignment)))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: its algorithm needs a workspace of %zu bytes in device memory, %zu-byte "
                    "aligned; got %p of %zu bytes",
                    api, ws_need, (size_t)workspace_alignment, ws, ws_size);
    static const char *const names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++)
        if (reinterpret_cast<uintptr_t>(p[i]) % need[i] != 0)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                        "%s: %s (%p) is not %llu-byte aligned, which its algorithm assumes (%s): "
                        "a GPU kernel faults with a misaligned address",
                        api, names[i], p[i], static_cast<unsigned long long>(need[i]),
                        algo ? "the heuristic's preference" : "algo NULL: the default preference");
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null result");
    auto *h = new char[1];
    std::lock_guard<std::mutex> g(lt_lock);
    lt_handles.insert(h);
    *lightHandle = reinterpret_cast<cublasLtHandle_t>(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    std::lock_guard<std::mutex> g(lt_lock);
    if (!lt_handles.erase(lightHandle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: %p is not a live handle",
                    static_cast<void *>(lightHandle));
    delete[] reinterpret_cast<char *>(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (cublasStatus_t st = injected("cublasLtMatmulDescCreate"); st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!matmulDesc) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: null");
    auto *d = new cublasLtMatmulDescOpaque_t();
    lt_desc s;
    s.compute = computeType;
    s.scale = scaleType;
    std::lock_guard<std::mutex> g(lt_lock);
    lt_counts.creates++;
    lt_descs[d] = s;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    return destroy("cublasLtMatmulDescDestroy", matmulDesc, lt_descs);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes) {
    if (cublasStatus_t st = injected("cublasLtMatmulDescSetAttribute"); st != CUBLAS_STATUS_SUCCESS)
        return st;
    std::lock_guard<std::mutex> g(lt_lock);
    lt_counts.sets++;
    auto it = lt_descs.find(matmulDesc);
    if (it == lt_descs.end())
        return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: %p is not live",
                    static_cast<void *>(matmulDesc));
    lt_desc &d = it->second;
    int a = static_cast<int>(attr);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return set_value(&d.transa, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return set_value(&d.transb, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t e = 0;
        cublasStatus_t st = set_value(&e, buf, sizeInBytes, a);
        if (st == CUBLAS_STATUS_SUCCESS && !epilogue_known(e))
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "cublasLtMatmulDescSetAttribute: epilogue %u "
                        "is not emulated",
                        e);
        if (st == CUBLAS_STATUS_SUCCESS) d.epilogue = e;
        return st;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return set_value(&d.bias, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return set_value(&d.bias_type, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return set_value(&d.aux, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return set_value(&d.aux_ld, buf, sizeInBytes, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        return set_value(&d.aux_type, buf, sizeInBytes, a);
    default:
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmulDescSetAttribute: attribute %d is not emulated", a);
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (cublasStatus_t st = injected("cublasLtMatrixLayoutCreate"); st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!matLayout) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: null");
    if (type_size(type) == 0 || ld < static_cast<int64_t>(rows > 1 ? rows : 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatrixLayoutCreate: %s %llu x %llu with ld %lld", type_name(type),
                    static_cast<unsigned long long>(rows), static_cast<unsigned long long>(cols),
                    static_cast<long long>(ld));
    auto *l = new cublasLtMatrixLayoutOpaque_t();
    std::lock_guard<std::mutex> g(lt_lock);
    lt_counts.creates++;
    lt_layouts[l] = lt_layout{type, rows, cols, ld};
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    return destroy("cublasLtMatrixLayoutDestroy", matLayout, lt_layouts);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
    if (cublasStatus_t st = injected("cublasLtMatmul"); st != CUBLAS_STATUS_SUCCESS) return st;
    const char *api = "cublasLtMatmul";
    lt_desc d;
    lt_layout la, lb, lc, ld;
    {
        std::lock_guard<std::mutex> g(lt_lock);
        lt_counts.matmuls++;
        if (!lt_handles.count(lightHandle))
            return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: %p is not a live handle", api,
                        static_cast<void *>(lightHandle));
        auto di = lt_descs.find(computeDesc);
        auto ai = lt_layouts.find(Adesc), bi = lt_layouts.find(Bdesc);
        auto ci = lt_layouts.find(Cdesc), dd = lt_layouts.find(Ddesc);
        if (di == lt_descs.end() || ai == lt_layouts.end() || bi == lt_layouts.end() ||
            ci == lt_layouts.end() || dd == lt_layouts.end())
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: a descriptor or layout is not live", api);
        d = di->second;
        la = ai->second, lb = bi->second, lc = ci->second, ld = dd->second;
    }
    cublasStatus_t st = check_types(d, la, lb, lc, ld);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    for (int32_t op : {d.transa, d.transb})
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: op %d", api, op);
    bool ta = d.transa == CUBLAS_OP_T, tb = d.transb == CUBLAS_OP_T;
    long long m = static_cast<long long>(ld.rows), n = static_cast<long long>(ld.cols);
    long long k = static_cast<long long>(ta ? la.rows : la.cols);
    if (static_cast<long long>(ta ? la.cols : la.rows) != m ||
        static_cast<long long>(tb ? lb.cols : lb.rows) != k ||
        static_cast<long long>(tb ? lb.rows : lb.cols) != n || lc.rows != ld.rows ||
        lc.cols != ld.cols)
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: op(A) of %llu x %llu, op(B) of %llu x %llu, C %llu x %llu, D %llu x %llu "
                    "do not fit",
                    api, (unsigned long long)(ta ? la.cols : la.rows),
                    (unsigned long long)(ta ? la.rows : la.cols),
                    (unsigned long long)(tb ? lb.cols : lb.rows),
                    (unsigned long long)(tb ? lb.rows : lb.cols), (unsigned long long)lc.rows,
                    (unsigned long long)lc.cols, (unsigned long long)m, (unsigned long long)n);
    if (!alpha || !beta || mtemu::device_range(alpha, 4) || mtemu::device_range(beta, 4))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta null or in device memory", api);
    float a32 = *static_cast<const float *>(alpha), b32 = *static_cast<const float *>(beta);
    if (b32 != 0.0f) // mixtape never asks for C: a beta would need C's reads modelled
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: beta %g is not emulated", api, b32);
    if (workspaceSizeInBytes > 0 && !mtemu::device_range(workspace, workspaceSizeInBytes))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: workspace %p of %zu bytes", api, workspace,
                    workspaceSizeInBytes);
    operand oa{"A", A, la.type, (long long)la.rows, (long long)la.cols, la.ld, 0};
    operand ob{"B", B, lb.type, (long long)lb.rows, (long long)lb.cols, lb.ld, 0};
    operand od{"D", D, ld.type, m, n, ld.ld, 0};
    bool reads = k > 0 && m > 0 && n > 0;
    for (const operand *op : {&oa, &ob, &od}) {
        if (op != &od && !reads) continue;
        st = check_operand(api, *op, 1);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    if (reads && (overlap(oa, od, 1) || overlap(ob, od, 1)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: D (%p) overlaps A (%p) or B (%p)", api, D, A,
                    B);
    st = check_alignment(algo, {A, B, C, D}, workspace, workspaceSizeInBytes);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    st = check_epilogue(d, ld, m, n, D);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    lt_job j{d.transa == CUBLAS_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N,
             d.transb == CUBLAS_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, la.ld, lb.ld, ld.ld,
             d.aux_ld, static_cast<const char *>(A), static_cast<const char *>(B),
             static_cast<const char *>(d.bias), static_cast<char *>(D), static_cast<char *>(d.aux),
             la.type, ld.type, a32, d.epilogue,
             // algo NULL: the default preference, which allows every reduction scheme
             (!algo || algo->data[6] != 0) && (ld.type == CUDA_R_16F || ld.type == CUDA_R_16BF) &&
                 k >= split_k_min};
    mtemu::enqueue(stream, [j] { lt_run(j); });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (cublasStatus_t st = injected("cublasLtMatmulPreferenceCreate"); st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: null");
    auto *p = new cublasLtMatmulPreferenceOpaque_t();
    std::lock_guard<std::mutex> g(lt_lock);
    lt_counts.creates++;
    lt_prefs[p] = lt_pref();
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    std::lock_guard<std::mutex> g(lt_lock);
    if (!lt_prefs.erase(pref))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy: %p is not live",
                    static_cast<void *>(pref));
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

// The workspace limit, the four minimum alignments (a power of two each) and the reduction
// scheme mask; nothing else.
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes) {
    if (cublasStatus_t st = injected("cublasLtMatmulPreferenceSetAttribute");
        st != CUBLAS_STATUS_SUCCESS)
        return st;
    const char *api = "cublasLtMatmulPreferenceSetAttribute";
    std::lock_guard<std::mutex> g(lt_lock);
    lt_counts.sets++;
    auto it = lt_prefs.find(pref);
    if (it == lt_prefs.end())
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %p is not live", api,
                    static_cast<void *>(pref));
    int a = static_cast<int>(attr);
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return set_value(&it->second.max_workspace, buf, sizeInBytes, a);
    if (attr == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK) {
        uint32_t m = 0;
        cublasStatus_t st = set_value(&m, buf, sizeInBytes, a);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        if (m & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK))
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: reduction scheme mask 0x%x has bits outside "
                        "CUBLASLT_REDUCTION_SCHEME_MASK",
                        api, m);
        it->second.reduction_mask = m;
        return CUBLAS_STATUS_SUCCESS;
    }
    int slot = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                    : -1;
    if (slot < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d is not emulated", api, a);
    uint32_t v = 0;
    cublasStatus_t st = set_value(&v, buf, sizeInBytes, a);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (v == 0 || (v & (v - 1)) != 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alignment %u is not a power of two", api, v);
    it->second.align[slot] = v;
    return CUBLAS_STATUS_SUCCESS;
}

// One algorithm that assumes the preference's alignments (and needs a small workspace when
// allowed one); the types are checked as cublasLtMatmul checks them.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount) {
    if (cublasStatus_t st = injected("cublasLtMatmulAlgoGetHeuristic"); st != CUBLAS_STATUS_SUCCESS)
        return st;
    const char *api = "cublasLtMatmulAlgoGetHeuristic";
    lt_desc d;
    lt_layout la, lb, lc, ld;
    lt_pref p;
    {
        std::lock_guard<std::mutex> g(lt_lock);
        lt_counts.heuristics++;
        auto di = lt_descs.find(operationDesc);
        auto ai = lt_layouts.find(Adesc), bi = lt_layouts.find(Bdesc);
        auto ci = lt_layouts.find(Cdesc), dd = lt_layouts.find(Ddesc);
        auto pi = lt_prefs.find(preference);
        if (!lt_handles.count(lightHandle) || di == lt_descs.end() || ai == lt_layouts.end() ||
            bi == lt_layouts.end() || ci == lt_layouts.end() || dd == lt_layouts.end() ||
            pi == lt_prefs.end())
            return fail(CUBLAS_STATUS_INVALID_VALUE,
                        "%s: a handle, descriptor, layout or preference is not live", api);
        d = di->second;
        la = ai->second, lb = bi->second, lc = ci->second, ld = dd->second;
        p = pi->second;
    }
    if (!returnAlgoCount || !heuristicResultsArray || requestedAlgoCount < 1)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %d results asked into %p, count into %p", api,
                    requestedAlgoCount, static_cast<void *>(heuristicResultsArray),
                    static_cast<void *>(returnAlgoCount));
    *returnAlgoCount = 0;
    cublasStatus_t st = check_types(d, la, lb, lc, ld);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const char *none = std::getenv("MTEMU_CUBLASLT_NO_ALGO");
    if (none && none[0] && std::strcmp(none, "0") != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED; // what the real one answers when it finds none
    cublasLtMatmulHeuristicResult_t r;
    std::memset(&r, 0, sizeof r);
    r.algo.data[0] = algo_tag;
    for (int i = 0; i < 4; i++) r.algo.data[1 + i] = p.align[i];
    r.workspaceSize = p.max_workspace >= algo_workspace ? algo_workspace : 0;
    r.algo.data[5] = r.workspaceSize;
    r.algo.data[6] = (p.reduction_mask & output_type_reduction) != 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    heuristicResultsArray[0] = r;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

void mtemu_cublaslt_counts_get(mtemu_cublaslt_counts *out) {
    std::lock_guard<std::mutex> g(lt_lock);
    *out = lt_counts;
    out->live = static_cast<int64_t>(lt_descs.size() + lt_layouts.size() + lt_prefs.size());
}

} // extern "C"

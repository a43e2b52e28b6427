/* The host side of the CUDA backend (C11): per-device context, error mapping, the caching
   allocator, and the conversions from tensors to the plain data of kernels.h. */
#ifndef MT_CUDA_IMPL_H
#define MT_CUDA_IMPL_H
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include "../tensor/backend.h"
#include "kernels.h"

/* One per device, made on first use: the device's one stream (every kernel, copy and
   cuBLAS call of the library goes there, so stream order is program order), the cuBLAS
   handle bound to it, the deferred-fault word and the launch context handed to kernels. */
typedef struct mt_cuda_staging mt_cuda_staging;
typedef struct mt_cudnn_state mt_cudnn_state;     /* cudnn_state.c */
typedef struct mt_lt_plan_cache mt_lt_plan_cache; /* lt_plan_cache.c */

typedef struct {
    int device;
    cudaStream_t stream;
    mt_cuda_staging *staging; /* pinned blocks for uploads (cuda_staging.c); NULL: none */
    cublasHandle_t blas;
    cublasLtHandle_t blas_lt;  /* cuBLASLt, for GEMMs with an epilogue (cuda_gemm.c) */
    mt_cuda_fault *fault_host; /* mapped pinned memory: written by kernels, read after syncs */
    cudaEvent_t peer_event;    /* orders the two streams of a device-to-device copy */
    /* Collectives (NCCL) run on their own stream so that they overlap the compute stream:
       comm_in makes a collective wait for the compute work before it, comm_out makes later
       compute wait for the collectives before it (src/dist/nccl.c). */
    cudaStream_t comm_stream;
    cudaEvent_t comm_in, comm_out;
    mt_cuda_ctx kctx;
    mt_cudnn_state *dnn; /* cuDNN handle and algorithm cache, made on first use (cudnn_state.c) */
    mt_lt_plan_cache *lt_plans; /* the fused linear's cuBLASLt plans (lt_plan_cache.c) */
} mt_cuda_device_ctx;

/* The context of device `index`, created on first use; NULL with an error naming op. */
mt_cuda_device_ctx *mt_cuda_ctx_get(const char *op, int index);

void mt_cudnn_state_free(mt_cudnn_state *s); /* NULL: nothing */

bool mt_cuda_allow_tf32(void); /* mt_cuda_set_allow_tf32's setting (device.c) */

/* ---- uploads (cuda_staging.c) */
mt_cuda_staging *mt_cuda_staging_new(void); /* NULL when out of memory */
void mt_cuda_staging_free(mt_cuda_staging *s);
/* Queues a copy of n host bytes (any host memory, reusable as soon as this returns) to dst
   on the device's stream, through a pinned staging block without waiting for the device,
   unless every block is still in flight (then it waits for one, counted as a host sync). */
int mt_cuda_upload_bytes(const char *op, mt_cuda_device_ctx *c, void *dst, const void *src,
                         size_t n);

/* ---- cuBLAS, loaded on first use (cublas_loader.c) */
typedef struct {
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetMathMode) set_math_mode;
    __typeof__(&cublasGemmEx) gemm_ex;
    __typeof__(&cublasGemmStridedBatchedEx) gemm_strided_batched_ex;
    __typeof__(&cublasGetStatusName) status_name;
    __typeof__(&cublasGetStatusString) status_string;
    /* cuBLASLt (libcublasLt, loaded with cuBLAS) */
    __typeof__(&cublasLtCreate) lt_create;
    __typeof__(&cublasLtDestroy) lt_destroy;
    __typeof__(&cublasLtMatmulDescCreate) lt_desc_create;
    __typeof__(&cublasLtMatmulDescDestroy) lt_desc_destroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) lt_desc_set;
    __typeof__(&cublasLtMatrixLayoutCreate) lt_layout_create;
    __typeof__(&cublasLtMatrixLayoutDestroy) lt_layout_destroy;
    __typeof__(&cublasLtMatmul) lt_matmul;
    __typeof__(&cublasLtMatmulPreferenceCreate) lt_pref_create;
    __typeof__(&cublasLtMatmulPreferenceDestroy) lt_pref_destroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) lt_pref_set;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) lt_heuristic;
} mt_cublas_api;
/* Loads cuBLAS once; NULL with an MT_ERR_DEVICE error naming op when it cannot be loaded. */
const mt_cublas_api *mt_cublas_load(const char *op);
/* The loaded entry points (valid after a successful mt_cublas_load: every context has one). */
const mt_cublas_api *mt_cublas(void);

/* Maps a CUDA / cuBLAS status to an mt error naming op and the library's own message;
   returns 0 for success. */
int mt_cuda_check(const char *op, cudaError_t e);
int mt_cublas_check(const char *op, cublasStatus_t s);

/* Waits for the device's stream: counted in mt_host_sync_count(), then reports a deferred
   kernel fault (naming its op) as the thread's error. Every host wait of the library goes
   through here. */
int mt_cuda_sync(const char *op, mt_cuda_device_ctx *ctx);

/* ---- normalisation, dropout and indexing families (cuda_norm.c) */
int mt_cuda_be_layer_norm(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                          const mt_tensor *weight, const mt_tensor *bias, double eps);
int mt_cuda_be_layer_norm_backward(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                                   const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                                   const mt_tensor *weight);
int mt_cuda_be_batch_norm(const mt_bn_args *a);
int mt_cuda_be_batch_norm_backward(const mt_bn_backward_args *a);
int mt_cuda_be_dropout(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed,
                       uint64_t offset);
int mt_cuda_be_index_select(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                            mt_op_id op);
int mt_cuda_be_index_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
int mt_cuda_be_gather(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index);
int mt_cuda_be_scatter_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src);
int mt_cuda_be_argmax(mt_tensor *out, const mt_tensor *x, int dim);
/* ---- pooling families (pool_cuda.c, kernels in pool.cu) */
int mt_cuda_be_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p);
int mt_cuda_be_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                               const mt_tensor *idx, const mt_pool2d_params *p);

/* ---- caching allocator (cuda_alloc.c): stream-ordered reuse on the device's one stream */
void *mt_cuda_alloc(int device, size_t nbytes); /* NULL on failure, no error set */
void mt_cuda_free(int device, void *p, size_t nbytes);
int mt_cuda_memory_stats(int device, mt_memory_stats *out);
void mt_cuda_memory_peak_reset(int device);
int mt_cuda_empty_cache(int device); /* cudaFree of every cached block (waits) */

/* ---- tensors to kernel data (cuda_iter.c) */
void mt_cuda_array_of(const mt_tensor *t, mt_cuda_array *out);
/* Operands of the same shape (operand 0 the output); dims coalesced where all allow. */
void mt_cuda_iter_init(mt_cuda_iter *it, int nops, const mt_tensor *const *ts);

/* ---- GEMM (cuda_gemm.c): the backend's gemm family */
int mt_cuda_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta);
int mt_cuda_gemm_epilogue(const mt_gemm_epilogue_args *e);

/* ---- cuBLASLt plans of the fused linear (lt_plan_cache.c) */
#define MT_LT_PLAN_CAP 64 /* plans per device; the least recently used is evicted */
/* Everything that decides the descriptors and the algorithm of one cublasLtMatmul (in
   cuBLASLt's column-major terms: A is our b, see cuda_gemm.c). Compared with memcmp: zero it
   before filling it; fields are ordered so that it has no padding. */
typedef struct {
    uint64_t a_rows, a_cols, b_rows, b_cols, d_rows, d_cols;
    int64_t a_ld, b_ld, d_ld;
    uint64_t max_workspace;
    int32_t type_ab, type_d; /* cudaDataType; the bias has D's type */
    int32_t opa, opb;        /* cublasOperation_t */
    uint32_t epilogue;       /* cublasLtEpilogue_t */
    uint32_t align[4];       /* what the algorithm may assume of A, B, C and D (bytes) */
    int32_t has_bias;        /* the size is a multiple of 8 with it: no padding */
} mt_lt_plan_key;
mt_lt_plan_cache *mt_lt_plan_cache_new(void);    /* NULL when out of memory */
void mt_lt_plan_cache_free(mt_lt_plan_cache *c); /* NULL: nothing */
int mt_lt_plan_cache_clear(mt_lt_plan_cache *c); /* the number of plans dropped */
int mt_lt_plan_cache_size(mt_lt_plan_cache *c);
/* d = epilogue(a @ b) with key's plan (cached, or made and cached): queued on the device's
   stream; errors name `op`. A new key in a full cache evicts the least recently used plan
   when `evict`; without it nothing is made (*no_algo). *no_algo: no plan with an algorithm
   for key, and nothing was queued (the caller takes another path). */
int mt_lt_plan_run(const char *op, mt_cuda_device_ctx *ctx, const mt_lt_plan_key *key,
                   const void *a, const void *b, void *d, const void *bias, bool evict,
                   bool *no_algo);
/* Test hooks for the emulated device's tests: device's plans dropped (their number) or
   counted; -1 with an error when the device has no context. */
int mt_cuda_lt_plans_clear(int device);
int mt_cuda_lt_plans_count(int device);

extern const mt_backend mt_cuda_backend;
#endif

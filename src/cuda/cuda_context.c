/* Per-device contexts, error mapping and the one place the library waits for a device. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "cuda_impl.h"

#define MAX_DEVICES 64

static _Atomic(mt_cuda_device_ctx *) contexts[MAX_DEVICES];
static mtx_t create_lock;
static once_flag lock_once = ONCE_FLAG_INIT;

static void lock_init(void) {
    mtx_init(&create_lock, mtx_plain);
}

int mt_cuda_check(const char *op, cudaError_t e) {
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError(); /* clear the runtime's sticky copy of a non-fatal error */
    mt_status st = e == cudaErrorMemoryAllocation ? MT_ERR_OOM : MT_ERR_DEVICE;
    return mt_error_set(st, "%s: CUDA error %s: %s", op, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

int mt_cublas_check(const char *op, cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    mt_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? MT_ERR_OOM : MT_ERR_DEVICE;
    return mt_error_set(st, "%s: cuBLAS error %s: %s", op, mt_cublas()->status_name(s),
                        mt_cublas()->status_string(s));
}

/* The scratch callbacks of the kernel context: the caching allocator, counted like tensors. */
static void *scratch_alloc(int device, size_t nbytes) {
    return mt_cuda_alloc(device, nbytes);
}
static void scratch_free(int device, void *p, size_t nbytes) {
    mt_cuda_free(device, p, nbytes);
}

static void ctx_destroy(mt_cuda_device_ctx *c) {
    mt_cuda_staging_free(c->staging);
    mt_cudnn_state_free(c->dnn);
    mt_lt_plan_cache_free(c->lt_plans); /* before the cuBLASLt handle its plans were made with */
    if (c->blas) mt_cublas()->destroy(c->blas);
    if (c->blas_lt) mt_cublas()->lt_destroy(c->blas_lt);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->fault_host) cudaFreeHost(c->fault_host);
    if (c->peer_event) cudaEventDestroy(c->peer_event);
    if (c->comm_in) cudaEventDestroy(c->comm_in);
    if (c->comm_out) cudaEventDestroy(c->comm_out);
    if (c->comm_stream) cudaStreamDestroy(c->comm_stream);
    free(c);
}

static mt_cuda_device_ctx *ctx_create(const char *op, int index) {
    mt_cuda_device_ctx *c = mt_heap_calloc(1, sizeof *c);
    if (!c) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory creating the context of cuda:%d", op, index);
        return NULL;
    }
    c->device = index;
    void *fault_dev = NULL;
    int rc = mt_cuda_check(op, cudaSetDevice(index));
    /* non-blocking: the legacy default stream must not serialise with ours */
    if (!rc) rc = mt_cuda_check(op, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (!rc)
        rc = mt_cuda_check(
            op, cudaHostAlloc((void **)&c->fault_host, sizeof *c->fault_host, cudaHostAllocMapped));
    if (!rc) rc = mt_cuda_check(op, cudaHostGetDevicePointer(&fault_dev, c->fault_host, 0));
    if (!rc && !mt_cublas_load(op)) rc = MT_ERR_DEVICE;
    if (!rc) rc = mt_cublas_check(op, mt_cublas()->create(&c->blas));
    if (!rc) rc = mt_cublas_check(op, mt_cublas()->set_stream(c->blas, c->stream));
    /* FP16/BF16 GEMMs accumulate in FP32 and round the output once: cuBLAS's default math
       lets a split-K algorithm reduce its partial sums in the output type (measured 3 FP16
       ulps off on an H200). TF32 is not the handle's business: cuda_gemm.c asks for it with
       the compute type (CUBLAS_COMPUTE_32F_FAST_TF32), so the math mode stays the default. */
    if (!rc)
        rc = mt_cublas_check(
            op, mt_cublas()->set_math_mode(
                    c->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    if (!rc)
        rc = mt_cuda_check(op, cudaEventCreateWithFlags(&c->peer_event, cudaEventDisableTiming));
    if (!rc)
        rc = mt_cuda_check(op, cudaStreamCreateWithFlags(&c->comm_stream, cudaStreamNonBlocking));
    if (!rc) rc = mt_cuda_check(op, cudaEventCreateWithFlags(&c->comm_in, cudaEventDisableTiming));
    if (!rc) rc = mt_cuda_check(op, cudaEventCreateWithFlags(&c->comm_out, cudaEventDisableTiming));
    if (!rc) rc = mt_cublas_check(op, mt_cublas()->lt_create(&c->blas_lt));
    if (!rc && !(c->lt_plans = mt_lt_plan_cache_new()))
        rc = mt_error_set(MT_ERR_OOM, "%s: out of memory for the cuBLASLt plans of cuda:%d", op,
                          index);
    if (!rc) c->staging = mt_cuda_staging_new(); /* none: uploads copy from pageable memory */
    int sms = 1;
    if (!rc)
        rc = mt_cuda_check(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index));
    if (rc) {
        ctx_destroy(c);
        return NULL;
    }
    memset(c->fault_host, 0, sizeof *c->fault_host);
    c->kctx = (mt_cuda_ctx){.device = index,
                            .stream = c->stream,
                            .fault = fault_dev,
                            .sm_count = sms > 0 ? sms : 1,
                            .scratch_alloc = scratch_alloc,
                            .scratch_free = scratch_free};
    return c;
}

mt_cuda_device_ctx *mt_cuda_ctx_get(const char *op, int index) {
    if (index < 0 || index >= MAX_DEVICES || index >= mt_cuda_device_count()) {
        mt_error_set(MT_ERR_DEVICE, "%s: device cuda:%d is not available", op, index);
        return NULL;
    }
    mt_cuda_device_ctx *c = atomic_load_explicit(&contexts[index], memory_order_acquire);
    if (!c) {
        call_once(&lock_once, lock_init);
        mtx_lock(&create_lock);
        c = atomic_load_explicit(&contexts[index], memory_order_relaxed);
        if (!c) {
            c = ctx_create(op, index);
            if (c) atomic_store_explicit(&contexts[index], c, memory_order_release);
        }
        mtx_unlock(&create_lock);
        if (!c) return NULL;
    }
    /* The current device is per host thread: set it when there is more than one. */
    if (mt_cuda_device_count() > 1 && mt_cuda_check(op, cudaSetDevice(index)) < 0) return NULL;
    return c;
}

/* A fault a kernel recorded becomes the thread's error, once. */
static int report_fault(const char *op, mt_cuda_device_ctx *c) {
    volatile mt_cuda_fault *f = c->fault_host;
    if (f->code == MT_CUDA_FAULT_NONE) return 0;
    mt_cuda_fault seen = {f->code, f->op, f->a, f->b, f->c, f->dim};
    memset(c->fault_host, 0, sizeof *c->fault_host);
    if (seen.code == MT_CUDA_FAULT_LABEL_RANGE)
        return mt_error_set(MT_ERR_INVALID,
                            "mt_%s: arg 2: label %lld at row %lld is out of range [0, %lld) "
                            "(found on cuda:%d by the kernel, reported by %s)",
                            mt_op_name((mt_op_id)seen.op), seen.b, seen.a, seen.c, c->device, op);
    if (seen.code == MT_CUDA_FAULT_INDEX_RANGE) {
        /* the words of the CPU's host check (src/ops/index.c), plus where it was found */
        bool embedding = seen.op == MT_OP_EMBEDDING;
        char what[64];
        if (embedding)
            snprintf(what, sizeof what, "weight has %lld rows", seen.c);
        else
            snprintf(what, sizeof what, "dim %d has size %lld", seen.dim, seen.c);
        return mt_error_set(MT_ERR_INVALID,
                            "mt_%s: arg %d: index %lld at position %lld is out of range [0, %lld) "
                            "(%s; found on cuda:%d by the kernel, reported by %s)",
                            mt_op_name((mt_op_id)seen.op), embedding ? 2 : 3, seen.b, seen.a,
                            seen.c, what, c->device, op);
    }
    return mt_error_set(MT_ERR_INTERNAL, "mt_%s: unknown device fault %d (reported by %s)",
                        mt_op_name((mt_op_id)seen.op), seen.code, op);
}

int mt_cuda_sync(const char *op, mt_cuda_device_ctx *c) {
    mt_host_sync_counted();
    int rc = mt_cuda_check(op, cudaStreamSynchronize(c->stream));
    return rc ? rc : report_fault(op, c);
}

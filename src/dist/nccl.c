/* Collectives on CUDA tensors through NCCL. The library is loaded on first use (dlopen, like
   cuBLAS), never linked: a CPU-only user needs no NCCL. The communicator is made by the first
   collective on a CUDA tensor (every rank calls it, so it is a safe point to meet), on that
   tensor's device: the unique id comes from rank 0 through MPI, is made locally in a world of
   one, or is the one the threads of mt_dist_init_thread share. Collectives run on the device
   context's communication stream, after an event on its compute stream (the stream every
   kernel of the library uses), so they overlap the compute work queued after them (DDP's
   rest of backward); mt_dist_nccl_join makes later compute wait for them, with no host wait. The
   emulated device links its fake NCCL (test/cuda_emu/fake_nccl.cpp) into the program;
   MT_NCCL_LIBRARY names the library to load instead, in both builds. */
#include <stdlib.h>
#include <string.h>
#include "dist_impl.h"

#if !defined(MT_WITH_CUDA)
#define MT_NCCL_MISSING_WHAT "CUDA"
#else
#define MT_NCCL_MISSING_WHAT "nccl.h (neither the CUDA toolkit nor the system has it)"
#endif

#if !defined(MT_WITH_CUDA) || !defined(MT_HAVE_NCCL)
int mt_dist_nccl_new_id(const char *op, unsigned char *id) {
    (void)id;
    return mt_error_set(MT_ERR_UNSUPPORTED,
                        "%s: this mixtape was built without %s, so NCCL is "
                        "not available",
                        op, MT_NCCL_MISSING_WHAT);
}
int mt_dist_nccl_start(const char *op, const mt_dist_nccl_call *c) {
    (void)c;
    return mt_dist_nccl_new_id(op, NULL);
}
int mt_dist_nccl_async_error(const char *op) {
    (void)op;
    return 0;
}
void mt_dist_nccl_destroy(mt_dist_state *st) {
    (void)st;
}
const char *mt_dist_nccl_load_error(void) {
    return "built without " MT_NCCL_MISSING_WHAT;
}
int mt_dist_nccl_join(const char *op, int device) {
    (void)device;
    return mt_dist_nccl_new_id(op, NULL);
}
#else
#include <stdio.h>
#include <threads.h>
#include <nccl.h>
#include "../cuda/cuda_impl.h"
#include "../cuda/dl_library.h"

typedef struct {
    __typeof__(&ncclGetUniqueId) get_unique_id;
    __typeof__(&ncclCommInitRank) comm_init_rank;
    __typeof__(&ncclCommDestroy) comm_destroy;
    __typeof__(&ncclCommGetAsyncError) comm_get_async_error;
    __typeof__(&ncclGetErrorString) get_error_string;
    __typeof__(&ncclGetLastError) get_last_error; /* the detail of the last failure */
    __typeof__(&ncclAllReduce) all_reduce;
    __typeof__(&ncclBroadcast) broadcast;
    __typeof__(&ncclAllGather) all_gather;
} nccl_api;

static nccl_api api;
static char load_error[256]; /* empty once loaded */
static once_flag load_once = ONCE_FLAG_INIT;

static void load_from(const char *const *names, size_t n) {
    void *lib = mt_dl_open(names, n, load_error, sizeof load_error);
    if (!lib) return;
#define MT_LOAD(field, name) MT_DL_LOAD(lib, "NCCL", api.field, name, load_error)
    MT_LOAD(get_unique_id, "ncclGetUniqueId");
    MT_LOAD(comm_init_rank, "ncclCommInitRank");
    MT_LOAD(comm_destroy, "ncclCommDestroy");
    MT_LOAD(comm_get_async_error, "ncclCommGetAsyncError");
    MT_LOAD(get_error_string, "ncclGetErrorString");
    MT_LOAD(all_reduce, "ncclAllReduce");
    MT_LOAD(broadcast, "ncclBroadcast");
    MT_LOAD(all_gather, "ncclAllGather");
#undef MT_LOAD
    /* optional (NCCL 2.13+): the detail of a failure; its absence is no error */
    char optional[64] = "";
    MT_DL_LOAD(lib, "NCCL", api.get_last_error, "ncclGetLastError", optional);
}

static void load(void) {
    const char *env = getenv("MT_NCCL_LIBRARY");
    if (env && *env) {
        load_from(&env, 1);
        return;
    }
#if defined(MT_CUDA_EMU)
    api = (nccl_api){.get_unique_id = ncclGetUniqueId,
                     .comm_init_rank = ncclCommInitRank,
                     .comm_destroy = ncclCommDestroy,
                     .comm_get_async_error = ncclCommGetAsyncError,
                     .get_error_string = ncclGetErrorString,
                     .get_last_error = ncclGetLastError,
                     .all_reduce = ncclAllReduce,
                     .broadcast = ncclBroadcast,
                     .all_gather = ncclAllGather};
#else
    static const char *const names[] = {"libnccl.so." MT_DL_STR(NCCL_MAJOR), "libnccl.so"};
    load_from(names, sizeof names / sizeof *names);
#endif
}

const char *mt_dist_nccl_load_error(void) {
    call_once(&load_once, load);
    return load_error[0] ? load_error : NULL;
}

static const nccl_api *nccl(const char *op) {
    call_once(&load_once, load);
    if (load_error[0]) {
        mt_error_set(MT_ERR_UNSUPPORTED,
                     "%s: collectives on CUDA tensors need NCCL, which is unavailable (%s)", op,
                     load_error);
        return NULL;
    }
    return &api;
}

static ncclComm_t st_comm(void) {
    return mt_dist_state_get()->nccl_comm;
}

/* An NCCL failure as an mt error; a failure of the library or the network leaves the
   communicator unusable (NCCL's own rule), so the world is marked broken. */
static int nccl_error(const char *op, ncclResult_t r) {
    const char *text = api.get_error_string(r);
    const char *detail = api.get_last_error ? api.get_last_error(st_comm()) : NULL;
    mt_dist_state *st = mt_dist_state_get();
    if (r == ncclInvalidArgument || r == ncclInvalidUsage)
        return mt_error_set(r == ncclInvalidArgument ? MT_ERR_INVALID : MT_ERR_STATE,
                            "%s: NCCL refused the call on rank %d of %d: %s (%s)", op, st->rank,
                            st->world, text, detail ? detail : "");
    char why[160];
    snprintf(why, sizeof why, "%s: NCCL error: %s", op, text);
    mt_dist_mark_broken(why);
    return mt_error_set(MT_ERR_DEVICE, "%s: NCCL failed on rank %d of %d: %s (%s)", op, st->rank,
                        st->world, text, detail ? detail : "");
}

int mt_dist_nccl_new_id(const char *op, unsigned char *id) {
    const nccl_api *a = nccl(op);
    if (!a) return MT_ERR_UNSUPPORTED;
    ncclUniqueId u;
    ncclResult_t r = a->get_unique_id(&u);
    if (r != ncclSuccess) return nccl_error(op, r);
    memcpy(id, u.internal, sizeof u.internal);
    return 0;
}

/* Rank 0's id to every rank over MPI, once every rank has NCCL (else all fail alike). */
static int shared_id(const char *op, mt_dist_state *st, ncclUniqueId *id) {
    if (st->has_nccl_id) {
        memcpy(id->internal, st->nccl_id, sizeof id->internal);
        return 0;
    }
    bool ok = nccl(op) != NULL;
    if (st->mpi) {
        int64_t v = ok;
        int bad = 0;
        int64_t lo = 0, hi = 0;
        int rc = mt_dist_agree(op, st->comm, &v, 1, &bad, &lo, &hi);
        if (rc == MT_ERR_SHAPE)
            return ok ? mt_error_set(MT_ERR_UNSUPPORTED, "%s: another rank cannot load NCCL", op)
                      : MT_ERR_UNSUPPORTED;
        if (rc < 0) return rc;
    }
    if (!ok) return MT_ERR_UNSUPPORTED;
    int rc = st->rank == 0 ? mt_dist_nccl_new_id(op, (unsigned char *)id->internal) : 0;
    /* rank 0 failing here alone leaves the others to the bounded wait below */
    if (!st->mpi || rc < 0) return rc;
    MPI_Request req;
    rc = MPI_Ibcast(id->internal, (int)sizeof id->internal, MPI_BYTE, 0, st->comm, &req);
    return rc != MPI_SUCCESS ? mt_dist_mpi_error(op, rc) : mt_dist_wait_request(op, &req);
}

/* The world's communicator on device; made by the first call (a collective point). */
static ncclComm_t comm_for(const char *op, mt_dist_state *st, int device) {
    if (st->nccl_comm) {
        if (device == st->nccl_device) return st->nccl_comm;
        mt_error_set(MT_ERR_INVALID,
                     "%s: this rank's NCCL communicator is on cuda:%d, the tensor on cuda:%d "
                     "(one device per rank)",
                     op, st->nccl_device, device);
        return NULL;
    }
    ncclUniqueId id;
    if (shared_id(op, st, &id) < 0) return NULL;
    if (!mt_cuda_ctx_get(op, device) || mt_cuda_check(op, cudaSetDevice(device)) < 0) return NULL;
    ncclComm_t comm = NULL;
    ncclResult_t r = api.comm_init_rank(&comm, st->world, id, st->rank);
    if (r != ncclSuccess) {
        nccl_error(op, r);
        return NULL;
    }
    st->nccl_comm = comm;
    st->nccl_device = device;
    return comm;
}

static int nccl_type(const char *op, mt_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case MT_F32:
        *out = ncclFloat32;
        return 0;
    case MT_F16:
        *out = ncclFloat16;
        return 0;
    case MT_BF16:
        *out = ncclBfloat16;
        return 0;
    case MT_F64:
        *out = ncclFloat64;
        return 0;
    case MT_I64:
        *out = ncclInt64;
        return 0;
    case MT_I32:
        *out = ncclInt32;
        return 0;
    case MT_BOOL:
        *out = ncclUint8;
        return 0;
    default:
        return mt_error_set(MT_ERR_DTYPE, "%s: dtype %s has no NCCL type", op, mt_dtype_name(dt));
    }
}

int mt_dist_nccl_start(const char *op, const mt_dist_nccl_call *c) {
    mt_dist_state *st = mt_dist_state_get();
    ncclDataType_t type = ncclFloat32; /* set by nccl_type; GCC -O3 cannot tell */
    int rc = nccl_type(op, c->t->dtype, &type);
    if (rc < 0) return rc;
    ncclComm_t comm = comm_for(op, st, c->t->device.index);
    if (!comm) return mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get(op, c->t->device.index);
    if (!ctx) return mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    /* on the communication stream, after the compute work that made the data */
    rc = mt_cuda_check(op, cudaEventRecord(ctx->comm_in, ctx->stream));
    if (!rc) rc = mt_cuda_check(op, cudaStreamWaitEvent(ctx->comm_stream, ctx->comm_in, 0));
    if (rc) return rc;
    void *buf = mt_tensor_data(c->t);
    size_t n = (size_t)(c->src ? c->src->numel : c->t->numel);
    ncclResult_t r;
    if (c->src) {
        r = api.all_gather(mt_tensor_data(c->src), buf, n, type, comm, ctx->comm_stream);
    } else if (c->root >= 0) {
        r = api.broadcast(buf, buf, n, type, c->root, comm, ctx->comm_stream);
    } else {
        /* a bool sum is a logical or, and max of 0/1 is exactly that */
        ncclRedOp_t o = c->reduce == MT_REDUCE_MAX || c->t->dtype == MT_BOOL ? ncclMax
                        : c->reduce == MT_REDUCE_AVG                         ? ncclAvg
                                                                             : ncclSum;
        r = api.all_reduce(buf, buf, n, type, o, comm, ctx->comm_stream);
    }
    return r == ncclSuccess ? 0 : nccl_error(op, r);
}

int mt_dist_nccl_join(const char *op, int device) {
    mt_cuda_device_ctx *ctx = mt_cuda_ctx_get(op, device);
    if (!ctx) return mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL;
    int rc = mt_cuda_check(op, cudaEventRecord(ctx->comm_out, ctx->comm_stream));
    return rc ? rc : mt_cuda_check(op, cudaStreamWaitEvent(ctx->stream, ctx->comm_out, 0));
}

int mt_dist_nccl_async_error(const char *op) {
    mt_dist_state *st = mt_dist_state_get();
    if (!st->nccl_comm) return 0;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = api.comm_get_async_error(st->nccl_comm, &async);
    if (r == ncclSuccess) r = async;
    return r == ncclSuccess ? 0 : nccl_error(op, r);
}

void mt_dist_nccl_destroy(mt_dist_state *st) {
    if (!st->nccl_comm) return;
    api.comm_destroy(st->nccl_comm);
    st->nccl_comm = NULL;
}
#endif

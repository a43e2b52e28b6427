// The NCCL functions mixtape calls, for the emulated device. Compiled against the toolkit's
// nccl.h, so the compiler checks every signature against the real one.
//
// Ranks are communicators of one process: a world of one, or several ranks as threads
// (ncclCommInitRank with one id shared by the threads, or ncclCommInitAll). What it models:
// - ncclCommInitRank blocks until all nranks ranks of the id have joined (a host rendezvous,
//   as the real one's bootstrap), bounded by MTEMU_NCCL_TIMEOUT seconds (default 60).
// - A collective blocks its host thread until every rank of the communicator has called its
//   collective of the same sequence number; the last to arrive queues one piece of device
//   work that reads every rank's send buffer and writes every rank's receive buffer. All of
//   each rank's earlier work is queued before it and none of its later work can be, which is
//   the stream order the real collective gives (the real one blocks the streams, not the
//   host). Nothing is computed at the call: a host read without a sync sees stale data.
// - Stricter than the real library: the ranks' calls are compared (collective, count,
//   dtype, op, root) and a mismatch fails on every rank with ncclInvalidUsage, where the real
//   one hangs or corrupts memory; buffers must lie inside one device allocation.
// - Reductions run in rank order in the element type (FP16/BF16 through FP32, rounded once);
//   ncclAvg divides the sum by the number of ranks.
#include "mtemu_internal.h"

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nccl.h>

#include "../../src/math/half.h"

// Named (not anonymous): struct ncclComm, declared by nccl.h at global scope, holds a group.
namespace mtemu_nccl {

enum kind { k_all_reduce = 1, k_broadcast, k_all_gather };

struct call {
    int kind = 0;
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t op = ncclSum;
    int root = 0;
};

struct group {
    int nranks = 0;
    int joined = 0;   // ranks that called ncclCommInitRank
    int alive = 0;    // communicators not yet destroyed
    uint64_t gen = 0; // collectives completed (or failed) so far
    int arrived = 0;  // ranks inside the current collective
    std::vector<call> calls;
    ncclResult_t outcome = ncclSuccess;
    std::string why;
};

} // namespace mtemu_nccl

struct ncclComm {
    std::shared_ptr<mtemu_nccl::group> g;
    int rank;
};

namespace {
using namespace mtemu_nccl;

constexpr char id_magic[] = "mtemu-nccl-id";

std::mutex lock; // every piece of this file's state
std::condition_variable changed;
std::map<std::string, std::shared_ptr<group>> pending_ids; // ids whose ranks are still joining
std::set<ncclComm_t> comms;                                // live communicators
uint64_t next_id = 1;
thread_local std::string last_error;

double timeout_s() {
    const char *v = std::getenv("MTEMU_NCCL_TIMEOUT");
    double t = v ? std::atof(v) : 0;
    return t > 0 ? t : 60.0;
}

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    MTEMU_FORMAT(what, fmt);
    last_error = what;
    std::fprintf(stderr, "mtemu-nccl: %s\n", what);
    return r;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0; // FP8 and out-of-range values: not modelled
    }
}

template <typename T> T combine(T a, T b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd:
        return a * b;
    case ncclMax:
        return a > b ? a : b;
    case ncclMin:
        return a < b ? a : b;
    default:
        return a + b; // ncclSum, ncclAvg
    }
}

// acc := op over the ranks' send buffers, element i; T is the arithmetic type.
template <typename T, typename L, typename S>
void reduce_typed(const std::vector<call> &calls, ncclRedOp_t op, L load, S store) {
    size_t n = calls[0].count;
    std::vector<T> acc(n);
    for (size_t i = 0; i < n; i++) acc[i] = load(calls[0].send, i);
    for (size_t r = 1; r < calls.size(); r++)
        for (size_t i = 0; i < n; i++) acc[i] = combine(acc[i], load(calls[r].send, i), op);
    if (op == ncclAvg)
        for (size_t i = 0; i < n; i++) acc[i] = acc[i] / static_cast<T>(calls.size());
    for (const call &c : calls)
        for (size_t i = 0; i < n; i++) store(c.recv, i, acc[i]);
}

template <typename T> void reduce_plain(const std::vector<call> &calls, ncclRedOp_t op) {
    reduce_typed<T>(
        calls, op, [](const void *p, size_t i) { return static_cast<const T *>(p)[i]; },
        [](void *p, size_t i, T v) { static_cast<T *>(p)[i] = v; });
}

void reduce_half(const std::vector<call> &calls, ncclRedOp_t op, bool bf16) {
    reduce_typed<float>(
        calls, op,
        [bf16](const void *p, size_t i) {
            uint16_t h = static_cast<const uint16_t *>(p)[i];
            return bf16 ? mt_bf16_to_f32(h) : mt_f16_to_f32(h);
        },
        [bf16](void *p, size_t i, float v) {
            static_cast<uint16_t *>(p)[i] = bf16 ? mt_f32_to_bf16(v) : mt_f32_to_f16(v);
        });
}

// The device work of one collective, run when the queue runs.
void run(const std::vector<call> &calls) {
    const call &c0 = calls[0];
    size_t bytes = c0.count * type_size(c0.type);
    if (c0.kind == k_broadcast) {
        std::vector<char> src(static_cast<const char *>(calls[c0.root].send),
                              static_cast<const char *>(calls[c0.root].send) + bytes);
        for (const call &c : calls) std::memcpy(c.recv, src.data(), bytes);
        return;
    }
    if (c0.kind == k_all_gather) {
        std::vector<char> all(bytes * calls.size());
        for (size_t r = 0; r < calls.size(); r++)
            std::memcpy(all.data() + r * bytes, calls[r].send, bytes);
        for (const call &c : calls) std::memcpy(c.recv, all.data(), all.size());
        return;
    }
    switch (c0.type) {
    case ncclInt8:
        return reduce_plain<int8_t>(calls, c0.op);
    case ncclUint8:
        return reduce_plain<uint8_t>(calls, c0.op);
    case ncclInt32:
        return reduce_plain<int32_t>(calls, c0.op);
    case ncclUint32:
        return reduce_plain<uint32_t>(calls, c0.op);
    case ncclInt64:
        return reduce_plain<int64_t>(calls, c0.op);
    case ncclUint64:
        return reduce_plain<uint64_t>(calls, c0.op);
    case ncclFloat32:
        return reduce_plain<float>(calls, c0.op);
    case ncclFloat64:
        return reduce_plain<double>(calls, c0.op);
    case ncclFloat16:
        return reduce_half(calls, c0.op, false);
    default:
        return reduce_half(calls, c0.op, true);
    }
}

const char *kind_name(int k) {
    return k == k_all_reduce  ? "ncclAllReduce"
           : k == k_broadcast ? "ncclBroadcast"
                              : "ncclAllGather";
}

// Local checks of one rank's call (the comm is live: checked under the lock by the caller).
ncclResult_t check_call(const char *fn, const call &c, ncclComm_t comm, cudaStream_t stream) {
    size_t es = type_size(c.type);
    if (es == 0) return fail(ncclInvalidArgument, "%s: datatype %d is not supported", fn, c.type);
    if (c.kind == k_all_reduce && (c.op < ncclSum || c.op >= ncclNumOps))
        return fail(ncclInvalidArgument, "%s: reduction op %d is not a built-in op", fn, c.op);
    if (c.kind == k_broadcast && (c.root < 0 || c.root >= comm->g->nranks))
        return fail(ncclInvalidArgument, "%s: root %d is not a rank of %d", fn, c.root,
                    comm->g->nranks);
    if (c.count == 0) return ncclSuccess;
    if (!c.send || !c.recv)
        return fail(ncclInvalidArgument, "%s: %s buffer is NULL", fn, c.send ? "recv" : "send");
    size_t recv_bytes = c.count * es * (c.kind == k_all_gather ? comm->g->nranks : 1);
    if (!mtemu::device_range(c.send, c.count * es) || !mtemu::device_range(c.recv, recv_bytes))
        return fail(ncclInvalidArgument,
                    "%s: a buffer of %zu elements is not inside one device "
                    "allocation",
                    fn, c.count);
    (void)stream;
    return ncclSuccess;
}

bool same(const call &a, const call &b) {
    return a.kind == b.kind && a.count == b.count && a.type == b.type &&
           (a.kind != k_all_reduce || a.op == b.op) && (a.kind != k_broadcast || a.root == b.root);
}

// Joins the current collective of comm's group: waits for every rank, compares the calls,
// and the last to arrive queues the work on its stream.
ncclResult_t collective(const char *fn, call c, ncclComm_t comm, cudaStream_t stream) {
    std::unique_lock<std::mutex> g(lock);
    if (!comms.count(comm))
        return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator", fn,
                    static_cast<void *>(comm));
    ncclResult_t r = check_call(fn, c, comm, stream);
    if (r != ncclSuccess) return r; // the other ranks time out, as with the real library
    std::shared_ptr<group> grp = comm->g;
    uint64_t gen = grp->gen;
    grp->calls[comm->rank] = c;
    if (++grp->arrived == grp->nranks) {
        grp->outcome = ncclSuccess;
        grp->why.clear();
        for (int k = 1; k < grp->nranks && grp->outcome == ncclSuccess; k++)
            if (!same(grp->calls[0], grp->calls[k])) {
                char why[256];
                std::snprintf(why, sizeof why,
                              "%s: the ranks disagree: rank 0 called %s of %zu elements of type "
                              "%d, rank %d %s of %zu elements of type %d",
                              fn, kind_name(grp->calls[0].kind), grp->calls[0].count,
                              grp->calls[0].type, k, kind_name(grp->calls[k].kind),
                              grp->calls[k].count, grp->calls[k].type);
                grp->outcome = ncclInvalidUsage;
                grp->why = why;
            }
        if (grp->outcome == ncclSuccess && c.count > 0)
            mtemu::enqueue(stream, [calls = grp->calls] { run(calls); });
        grp->arrived = 0;
        grp->gen++;
        changed.notify_all();
    } else {
        auto deadline =
            std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
        while (grp->gen == gen)
            if (changed.wait_until(g, deadline) == std::cv_status::timeout && grp->gen == gen) {
                grp->arrived--;
                return fail(ncclSystemError,
                            "%s: rank %d waited %g s for the other ranks of the collective", fn,
                            comm->rank, timeout_s());
            }
    }
    if (grp->outcome != ncclSuccess) return fail(grp->outcome, "%s", grp->why.c_str());
    return ncclSuccess;
}

ncclComm_t new_comm(std::shared_ptr<group> g, int rank) {
    ncclComm_t c = new ncclComm{std::move(g), rank};
    comms.insert(c);
    c->g->alive++;
    return c;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
    std::lock_guard<std::mutex> g(lock);
    std::memset(uniqueId, 0, sizeof *uniqueId);
    std::snprintf(uniqueId->internal, sizeof uniqueId->internal, "%s:%llu", id_magic,
                  static_cast<unsigned long long>(next_id++));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    const char *fn = "ncclCommInitRank";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d of %d", fn, rank, nranks);
    std::string key(commId.internal, strnlen(commId.internal, sizeof commId.internal));
    if (key.compare(0, sizeof id_magic - 1, id_magic) != 0)
        return fail(ncclInvalidArgument, "%s: the id was not made by ncclGetUniqueId", fn);
    std::unique_lock<std::mutex> g(lock);
    std::shared_ptr<group> &slot = pending_ids[key];
    if (!slot) {
        slot = std::make_shared<group>();
        slot->nranks = nranks;
        slot->calls.resize(static_cast<size_t>(nranks));
    }
    std::shared_ptr<group> grp = slot;
    if (grp->nranks != nranks)
        return fail(ncclInvalidUsage, "%s: rank %d says %d ranks, another rank said %d", fn, rank,
                    nranks, grp->nranks);
    grp->joined++;
    if (grp->joined == nranks) {
        pending_ids.erase(key);
        changed.notify_all();
    } else {
        auto deadline =
            std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
        while (grp->joined < nranks)
            if (changed.wait_until(g, deadline) == std::cv_status::timeout &&
                grp->joined < nranks) {
                grp->joined--;
                return fail(ncclSystemError, "%s: rank %d of %d: the other ranks never joined", fn,
                            rank, nranks);
            }
    }
    *comm = new_comm(grp, rank);
    return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (!comm || ndev < 1)
        return fail(ncclInvalidArgument, "ncclCommInitAll: comm %p, ndev %d",
                    static_cast<void *>(comm), ndev);
    (void)devlist; // the emulator has one device, shared by the ranks
    std::lock_guard<std::mutex> g(lock);
    auto grp = std::make_shared<group>();
    grp->nranks = grp->joined = ndev;
    grp->calls.resize(static_cast<size_t>(ndev));
    for (int r = 0; r < ndev; r++) comm[r] = new_comm(grp, r);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    std::lock_guard<std::mutex> g(lock);
    if (!comms.erase(comm))
        return fail(ncclInvalidArgument, "ncclCommDestroy: %p is not a live communicator",
                    static_cast<void *>(comm));
    comm->g->alive--;
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    std::lock_guard<std::mutex> g(lock);
    if (!comms.count(comm) || !count) return fail(ncclInvalidArgument, "ncclCommCount");
    *count = comm->g->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    std::lock_guard<std::mutex> g(lock);
    if (!comms.count(comm) || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    std::lock_guard<std::mutex> g(lock);
    if (!comms.count(comm) || !asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
    *asyncError = ncclSuccess; // every failure of the fake is returned at the call
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error.c_str();
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    call c;
    c.kind = k_all_reduce, c.send = sendbuff, c.recv = recvbuff, c.count = count;
    c.type = datatype, c.op = op;
    return collective("ncclAllReduce", c, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    call c;
    c.kind = k_broadcast, c.send = sendbuff, c.recv = recvbuff, c.count = count;
    c.type = datatype, c.root = root;
    return collective("ncclBroadcast", c, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    call c;
    c.kind = k_all_gather, c.send = sendbuff, c.recv = recvbuff, c.count = sendcount;
    c.type = datatype;
    return collective("ncclAllGather", c, comm, stream);
}

} // extern "C"

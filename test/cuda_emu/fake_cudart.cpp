// The CUDA runtime functions mixtape calls, for the emulated device: MTEMU_DEVICES devices
// (default 1), queued streams, guarded device memory (mtemu_arena.h). Compiled against the
// toolkit's cuda_runtime_api.h, so the compiler checks every signature against the real one.
//
// What it models, and where it is stricter than the real runtime:
// - Device memory is one mmap arena (size MTEMU_MEM_BYTES, default 8 GiB; "64M", "2G" work),
//   with a first-fit allocator; fresh blocks are filled with 0xFF (NaN). The arena is
//   PROT_NONE except while queued work runs, so a host dereference of device memory faults.
//   Under ASan the slack after each block and freed blocks are poisoned as well.
// - Work (kernels, copies, memsets, cuBLAS calls) is queued and runs in order, all streams
//   in one FIFO, only when the host synchronises: a host read without a sync sees stale data.
// - cudaMemcpyAsync checks that each pointer is where its kind says. H2D from pageable memory
//   is staged at the call (as the real runtime does); from pinned memory it reads the source
//   when it runs. D2H writes the destination when it runs.
// - Mapped pinned memory (cudaHostAllocMapped) is device-accessible at the host address;
//   other pinned memory is not (the real runtime maps it too, with unified addressing).
// Every error goes through mtemu::report: the thread's last error, and one line on stderr.
#include "mtemu.h"
#include "mtemu_internal.h"
#include "mtemu_arena.h"
#include "mtemu_coalesce.h"
#include "mtemu_census.h"
#include "mtemu_cudart_counts.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

struct CUstream_st {
    unsigned flags;
    int device; // the current device when it was created
};

struct event_state {
    bool recorded = false, done = false;
    std::chrono::steady_clock::time_point at;
};
struct CUevent_st {
    unsigned flags;
    std::shared_ptr<event_state> state; // shared with the queued record, which may outlive it
};

namespace {

using namespace mtemu::memory;

constexpr int runtime_version = 13000;

cudaError_t reportf(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t reportf(cudaError_t e, const char *fmt, ...) {
    MTEMU_FORMAT(what, fmt);
    return mtemu::report(e, what);
}

// MTEMU_DEVICES: how many devices the emulator shows (1 to 8, default 1). They share one
// memory arena (MTEMU_MEM_BYTES in all) and one queue of work; each allocation and stream
// belongs to the device current when it was made, and the runtime checks that pointers and
// streams are used on their own device, where the real runtime would fail.
int device_count_from_env() {
    const char *v = std::getenv("MTEMU_DEVICES");
    if (!v || !*v) return 1;
    char *end;
    long n = std::strtol(v, &end, 10);
    if (*end || n < 1 || n > 8) {
        std::fprintf(stderr, "mtemu: MTEMU_DEVICES=%s is not 1 to 8; using 1\n", v);
        return 1;
    }
    return static_cast<int>(n);
}
int device_count() {
    static const int n = device_count_from_env();
    return n;
}
thread_local int current_device = 0; // per host thread, like the real runtime's

struct pinned_block {
    size_t bytes;
    bool mapped;
};

// One lock for all the runtime's state. Recursive: queued work runs under it, and a cuBLAS
// closure asks device_range.
std::recursive_mutex state_lock;
arena device;
std::map<const char *, pinned_block> pinned; // by start address
std::set<cudaStream_t> streams;
std::set<cudaEvent_t> events;
std::deque<std::function<void()>> queue;
bool flushing = false;
thread_local cudaError_t last_error = cudaSuccess;

const pinned_block *find_pinned(const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    auto it = pinned.upper_bound(c);
    if (it == pinned.begin()) return nullptr;
    --it;
    size_t off = static_cast<size_t>(c - it->first);
    return off < it->second.bytes && n <= it->second.bytes - off ? &it->second : nullptr;
}

bool stream_valid(cudaStream_t s) {
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || streams.count(s);
}

// Runs everything queued, with device memory accessible. Queued work that synchronises
// (nothing should) runs inside the outer flush.
void flush() {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (flushing) return;
    flushing = true;
    device.open();
    while (!queue.empty()) {
        std::function<void()> work = std::move(queue.front());
        queue.pop_front();
        work();
    }
    device.close();
    flushing = false;
}

enum class side { host, device, invalid };
// Where [p, p + n) is: inside one device allocation, outside the arena, or neither.
side where(const void *p, size_t n) {
    if (!device.contains(p)) return side::host;
    return mtemu::device_range(p, n) ? side::device : side::invalid;
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost:
        return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
        return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
        return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
        return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
        return "cudaMemcpyDefault";
    }
    return "?";
}

struct error_text {
    cudaError_t code;
    const char *name, *text;
};
#define MTEMU_ERROR(e, text)                                                                       \
    { e, #e, text }
// The errors this fake can return or a caller may ask about; texts as the real runtime's.
const error_text error_texts[] = {
    MTEMU_ERROR(cudaSuccess, "no error"),
    MTEMU_ERROR(cudaErrorInvalidValue, "invalid argument"),
    MTEMU_ERROR(cudaErrorMemoryAllocation, "out of memory"),
    MTEMU_ERROR(cudaErrorInitializationError, "initialization error"),
    MTEMU_ERROR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    MTEMU_ERROR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    MTEMU_ERROR(cudaErrorInsufficientDriver,
                "CUDA driver version is insufficient for CUDA runtime version"),
    MTEMU_ERROR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    MTEMU_ERROR(cudaErrorInvalidDevice, "invalid device ordinal"),
    MTEMU_ERROR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    MTEMU_ERROR(cudaErrorNotReady, "device not ready"),
    MTEMU_ERROR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    MTEMU_ERROR(cudaErrorLaunchFailure, "unspecified launch failure"),
    MTEMU_ERROR(cudaErrorNotSupported, "operation not supported"),
    MTEMU_ERROR(cudaErrorUnknown, "unknown error"),
};
#undef MTEMU_ERROR

const error_text *find_error(cudaError_t e) {
    for (const error_text &t : error_texts)
        if (t.code == e) return &t;
    return nullptr;
}

cudaError_t check_device(int device_index) {
    if (device_index >= 0 && device_index < device_count()) return cudaSuccess;
    return reportf(cudaErrorInvalidDevice,
                   "device %d: the emulator has %d device(s) (MTEMU_DEVICES sets the count)",
                   device_index, device_count());
}

// The device of the allocation holding [p, p + n), or -1.
int allocation_device(const void *p, size_t n) {
    size_t off;
    const arena::block *b = device.find(p, &off);
    return b && n <= b->bytes - off ? b->device : -1;
}

// The device a stream belongs to: its creator's, or the caller's for the default streams.
int stream_device(cudaStream_t s) {
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread ? current_device
                                                                             : s->device;
}

} // namespace

// ---- mtemu_internal.h
namespace mtemu {

void enqueue(cudaStream_t s, std::function<void()> fn) {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!stream_valid(s)) {
        reportf(cudaErrorInvalidResourceHandle, "work queued on stream %p, which does not exist",
                static_cast<void *>(s));
        return;
    }
    // A kernel or library call goes to a stream of the current device (the real runtime
    // fails the launch otherwise).
    if (stream_device(s) != current_device) {
        reportf(cudaErrorInvalidResourceHandle,
                "work queued on stream %p of device %d while device %d is current",
                static_cast<void *>(s), stream_device(s), current_device);
        return;
    }
    queue.push_back(std::move(fn));
}

bool device_range(const void *p, size_t n) {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    size_t off;
    const arena::block *b = device.find(p, &off);
    return b && n <= b->bytes - off;
}

bool device_accessible(const void *p, size_t n) {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (device_range(p, n)) return true;
    const pinned_block *b = find_pinned(p, n);
    return b && b->mapped;
}

cudaError_t report(cudaError_t e, const char *what) {
    last_error = e;
    const error_text *t = find_error(e);
    std::fprintf(stderr, "mtemu: %s: %s\n", what, t ? t->name : "cudaError");
    return e;
}

} // namespace mtemu

using mtemu::report;

namespace {

// cudaStreamCreateWithFlags, cudaEventCreateWithFlags: the result pointer and the flags
// (within `allowed`) checked, then a copy of obj made and registered in `live`.
template <class T>
cudaError_t create(const char *api, T **out, unsigned flags, unsigned allowed, std::set<T *> &live,
                   T obj) {
    if (!out) return reportf(cudaErrorInvalidValue, "%s: null result pointer", api);
    if (flags & ~allowed) return reportf(cudaErrorInvalidValue, "%s: flags 0x%x", api, flags);
    std::lock_guard<std::recursive_mutex> g(state_lock);
    *out = new T(std::move(obj));
    live.insert(*out);
    return cudaSuccess;
}

// cudaStreamDestroy, cudaEventDestroy: p must be in `live`. Queued work keeps running (it does
// not refer to the stream or event).
template <class T> cudaError_t destroy(const char *api, T *p, std::set<T *> &live) {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!live.erase(p))
        return reportf(cudaErrorInvalidResourceHandle, "%s(%p): not live", api,
                       static_cast<void *>(p));
    delete p;
    return cudaSuccess;
}

} // namespace

// ---- call counters (mtemu_cudart_counts.h)
namespace {
struct call_counts {
    std::atomic<int64_t> launches{0}, runtime_calls{0}, allocs{0}, frees{0}, syncs{0}, copies{0},
        memsets{0};
} counts;

thread_local int uncounted; // mtemu_cudart_uncounted_begin depth

// One more runtime call, and one more of each kind named.
template <typename... K> void count_call(K *...kinds) {
    if (uncounted) return;
    counts.runtime_calls.fetch_add(1, std::memory_order_relaxed);
    (kinds->fetch_add(1, std::memory_order_relaxed), ...);
}
} // namespace

// MTEMU_LAUNCH_CENSUS=PATH ("-": stderr): at exit, one line per kernel as MT_LAUNCH names it,
// "launches threads name", the most launched first: which kernels a program (a training
// step, say) queues and how often, to find launches a GPU would pay for in host time.
namespace {
struct census_entry {
    int64_t launches = 0, threads = 0;
};
std::mutex census_lock;
std::map<std::string, census_entry> *census; // NULL: off
const char *census_path;

void census_write() {
    std::lock_guard<std::mutex> g(census_lock);
    mtemu_census_write(
        "MTEMU_LAUNCH_CENSUS", census_path, *census,
        [](const census_entry &e) { return e.launches; },
        [](std::FILE *f, const std::string &name, const census_entry &e) {
            std::fprintf(f, "%lld %lld %s\n", (long long)e.launches, (long long)e.threads,
                         name.c_str());
        });
}

void census_count(const char *kernel, uint64_t threads) {
    static std::once_flag once;
    std::call_once(once, [] {
        census_path = std::getenv("MTEMU_LAUNCH_CENSUS");
        if (!census_path || !*census_path) return;
        census = new std::map<std::string, census_entry>;
        std::atexit(census_write);
    });
    if (!census) return;
    std::lock_guard<std::mutex> g(census_lock);
    census_entry &e = (*census)[kernel];
    e.launches++;
    e.threads += (int64_t)threads;
}
} // namespace

bool mtemu::device_arena_bounds(uintptr_t *lo, uintptr_t *hi) {
    std::lock_guard<std::recursive_mutex> g(state_lock);
    return device.bounds(lo, hi);
}

void mtemu::detail::count_launch(const launch_config &cfg) {
    if (uncounted) return;
    counts.launches.fetch_add(1, std::memory_order_relaxed);
    census_count(cfg.kernel, uint64_t{cfg.grid.x} * cfg.grid.y * cfg.grid.z * cfg.block.x *
                                 cfg.block.y * cfg.block.z);
}

extern "C" void mtemu_cudart_uncounted_begin(void) {
    uncounted++;
}
extern "C" void mtemu_cudart_uncounted_end(void) {
    uncounted--;
}

extern "C" void mtemu_cudart_counts_get(mtemu_cudart_counts *out) {
    *out = mtemu_cudart_counts{counts.launches.load(), counts.runtime_calls.load(),
                               counts.allocs.load(),   counts.frees.load(),
                               counts.syncs.load(),    counts.copies.load(),
                               counts.memsets.load()};
}

// ---- the runtime API
extern "C" {

// -- errors and versions
cudaError_t cudaGetLastError(void) {
    count_call();
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    count_call();
    return last_error;
}

const char *cudaGetErrorName(cudaError_t error) {
    count_call();
    const error_text *t = find_error(error);
    return t ? t->name : "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t error) {
    count_call();
    const error_text *t = find_error(error);
    return t ? t->text : "unrecognized error code";
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    count_call();
    if (!runtimeVersion) return report(cudaErrorInvalidValue, "cudaRuntimeGetVersion: null");
    *runtimeVersion = runtime_version;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *driverVersion) {
    count_call();
    if (!driverVersion) return report(cudaErrorInvalidValue, "cudaDriverGetVersion: null");
    *driverVersion = runtime_version;
    return cudaSuccess;
}

// -- the device
cudaError_t cudaGetDeviceCount(int *count) {
    count_call();
    if (!count) return report(cudaErrorInvalidValue, "cudaGetDeviceCount: null");
    *count = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    count_call();
    if (cudaError_t e = check_device(device)) return e;
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    count_call();
    if (!device) return report(cudaErrorInvalidValue, "cudaGetDevice: null");
    *device = current_device;
    return cudaSuccess;
}
// Every pair of distinct emulated devices can reach each other's memory.
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
    count_call();
    if (!canAccessPeer) return report(cudaErrorInvalidValue, "cudaDeviceCanAccessPeer: null");
    if (cudaError_t e = check_device(device)) return e;
    if (cudaError_t e = check_device(peerDevice)) return e;
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device_index) {
    count_call();
    if (!prop) return report(cudaErrorInvalidValue, "cudaGetDeviceProperties: null");
    if (cudaError_t e = check_device(device_index)) return e;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "mtemu (emulated device %d)", device_index);
    prop->totalGlobalMem = device.capacity();
    prop->sharedMemPerBlock = mtemu::max_shared_per_block;
    prop->sharedMemPerBlockOptin = mtemu::max_shared_per_block;
    prop->sharedMemPerMultiprocessor = 4 * mtemu::max_shared_per_block;
    prop->regsPerBlock = prop->regsPerMultiprocessor = 65536;
    prop->warpSize = warpSize;
    prop->memPitch = SIZE_MAX;
    prop->maxThreadsPerBlock = static_cast<int>(mtemu::max_threads_per_block);
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = static_cast<int>(mtemu::max_block_dim_xy);
    prop->maxThreadsDim[2] = static_cast<int>(mtemu::max_block_dim_z);
    prop->maxGridSize[0] = static_cast<int>(mtemu::max_grid_dim_x);
    prop->maxGridSize[1] = prop->maxGridSize[2] = static_cast<int>(mtemu::max_grid_dim_yz);
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = mtemu::multiprocessor_count;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->canMapHostMemory = 1;
    prop->unifiedAddressing = 1;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device_index) {
    count_call();
    if (!value) return report(cudaErrorInvalidValue, "cudaDeviceGetAttribute: null");
    if (cudaError_t e = check_device(device_index)) return e;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount:
        *value = mtemu::multiprocessor_count;
        break;
    case cudaDevAttrMaxThreadsPerBlock:
        *value = mtemu::max_threads_per_block;
        break;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
        *value = mtemu::max_block_dim_xy;
        break;
    case cudaDevAttrMaxBlockDimZ:
        *value = mtemu::max_block_dim_z;
        break;
    case cudaDevAttrMaxGridDimX:
        *value = static_cast<int>(mtemu::max_grid_dim_x);
        break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ:
        *value = mtemu::max_grid_dim_yz;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = static_cast<int>(mtemu::max_shared_per_block);
        break;
    case cudaDevAttrWarpSize:
        *value = warpSize;
        break;
    case cudaDevAttrComputeCapabilityMajor:
        *value = 9;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = 0;
        break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
        *value = 2048;
        break;
    case cudaDevAttrMaxRegistersPerBlock:
        *value = 65536;
        break;
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentKernels:
        *value = 1;
        break;
    case cudaDevAttrIntegrated:
        *value = 0;
        break;
    default:
        return reportf(cudaErrorInvalidValue,
                       "cudaDeviceGetAttribute: attribute %d is not emulated",
                       static_cast<int>(attr));
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute, int) {
    count_call();
    return cudaSuccess;
}

// -- device memory
cudaError_t cudaMalloc(void **devPtr, size_t size) {
    count_call(&counts.allocs);
    if (!devPtr) return report(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
    *devPtr = nullptr;
    if (size == 0) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    *devPtr = device.alloc(size, current_device);
    if (!*devPtr)
        return reportf(cudaErrorMemoryAllocation,
                       "cudaMalloc of %zu bytes: out of emulated device memory (%zu of %zu bytes "
                       "in use; MTEMU_MEM_BYTES sets the size)",
                       size, device.in_use(), device.capacity());
    return cudaSuccess;
}

// Like the real one, waits for the device first.
cudaError_t cudaFree(void *devPtr) {
    count_call(&counts.frees, &counts.syncs);
    flush();
    if (!devPtr) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!device.release(devPtr))
        return reportf(cudaErrorInvalidValue, "cudaFree(%p): not a device allocation", devPtr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    count_call();
    if (!free || !total) return report(cudaErrorInvalidValue, "cudaMemGetInfo: null");
    std::lock_guard<std::recursive_mutex> g(state_lock);
    *total = device.capacity();
    *free = *total - device.in_use();
    return cudaSuccess;
}

// -- pinned host memory
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    count_call(&counts.allocs);
    if (!pHost) return report(cudaErrorInvalidValue, "cudaHostAlloc: null result pointer");
    *pHost = nullptr;
    if (flags & ~unsigned{cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined})
        return reportf(cudaErrorInvalidValue, "cudaHostAlloc: unknown flags 0x%x", flags);
    if (size == 0) return cudaSuccess;
    void *p = nullptr;
    if (posix_memalign(&p, device_alignment, size) != 0)
        return reportf(cudaErrorMemoryAllocation, "cudaHostAlloc of %zu bytes", size);
    std::lock_guard<std::recursive_mutex> g(state_lock);
    pinned[static_cast<char *>(p)] = pinned_block{size, (flags & cudaHostAllocMapped) != 0};
    *pHost = p;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **ptr, size_t size) {
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

// Like the real one, waits for the device first (queued copies may use the block).
cudaError_t cudaFreeHost(void *ptr) {
    count_call(&counts.frees, &counts.syncs);
    flush();
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!pinned.erase(static_cast<char *>(ptr)))
        return reportf(cudaErrorInvalidValue, "cudaFreeHost(%p): not pinned host memory", ptr);
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags) {
    count_call();
    if (!pDevice || flags != 0)
        return report(cudaErrorInvalidValue, "cudaHostGetDevicePointer: null result or flags");
    std::lock_guard<std::recursive_mutex> g(state_lock);
    const pinned_block *b = find_pinned(pHost, 1);
    if (!b || !b->mapped)
        return reportf(cudaErrorInvalidValue,
                       "cudaHostGetDevicePointer(%p): not pinned memory allocated with "
                       "cudaHostAllocMapped",
                       pHost);
    *pDevice = pHost;
    return cudaSuccess;
}

// -- copies and memsets
namespace {
// Queues a copy after checking that each pointer is where the kind says.
cudaError_t queue_copy(const char *api, void *dst, const void *src, size_t count,
                       cudaMemcpyKind kind, cudaStream_t stream, bool *device_to_device) {
    *device_to_device = false;
    if (count == 0) return cudaSuccess;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return reportf(cudaErrorInvalidMemcpyDirection, "%s: kind %d", api, static_cast<int>(kind));
    if (!dst || !src) return reportf(cudaErrorInvalidValue, "%s: null pointer", api);
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!stream_valid(stream))
        return reportf(cudaErrorInvalidResourceHandle, "%s: stream %p does not exist", api,
                       static_cast<void *>(stream));
    side d = where(dst, count), s = where(src, count);
    bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) {
        to_device = d == side::device;
        from_device = s == side::device;
    }
    bool dst_ok = d == (to_device ? side::device : side::host);
    bool src_ok = s == (from_device ? side::device : side::host);
    if (!dst_ok || !src_ok) {
        bool should_be_device = dst_ok ? from_device : to_device;
        return reportf(cudaErrorInvalidValue, "%s(%p <- %p, %zu bytes, %s): %s is not %s", api, dst,
                       src, count, kind_name(kind), dst_ok ? "the source" : "the destination",
                       should_be_device ? "inside one device allocation" : "host memory");
    }
    *device_to_device = to_device && from_device;
    if (!from_device && !find_pinned(src, count)) {
        // Pageable source: staged now, so that the caller may reuse it at once.
        const char *c = static_cast<const char *>(src);
        queue.push_back([dst, staged = std::vector<char>(c, c + count)] {
            std::memcpy(dst, staged.data(), staged.size());
        });
    } else {
        queue.push_back([dst, src, count] { std::memmove(dst, src, count); });
    }
    return cudaSuccess;
}
} // namespace

// Device to device between two devices, queued on a stream of the current device (the
// copy engine of either side may run it; the queue is one, so stream order holds).
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                size_t count, cudaStream_t stream) {
    count_call(&counts.copies);
    if (count == 0) return cudaSuccess;
    if (cudaError_t e = check_device(dstDevice)) return e;
    if (cudaError_t e = check_device(srcDevice)) return e;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!stream_valid(stream))
        return reportf(cudaErrorInvalidResourceHandle,
                       "cudaMemcpyPeerAsync: stream %p does not exist",
                       static_cast<void *>(stream));
    int dd = allocation_device(dst, count), sd = allocation_device(src, count);
    if (dd != dstDevice || sd != srcDevice)
        return reportf(cudaErrorInvalidValue,
                       "cudaMemcpyPeerAsync(%p on %d <- %p on %d, %zu bytes): the %s is %s", dst,
                       dstDevice, src, srcDevice, count, dd != dstDevice ? "destination" : "source",
                       (dd != dstDevice ? dd : sd) < 0 ? "not inside one device allocation"
                                                       : "an allocation of another device");
    queue.push_back([dst, src, count] { std::memmove(dst, src, count); });
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    count_call(&counts.copies);
    bool device_to_device;
    return queue_copy("cudaMemcpyAsync", dst, src, count, kind, stream, &device_to_device);
}

// Synchronous, except device to device, as the real one.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    count_call(&counts.copies);
    bool device_to_device;
    cudaError_t e = queue_copy("cudaMemcpy", dst, src, count, kind, nullptr, &device_to_device);
    if (e == cudaSuccess && !device_to_device) {
        counts.syncs.fetch_add(1, std::memory_order_relaxed);
        flush();
    }
    return e;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    count_call(&counts.memsets);
    if (count == 0) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!stream_valid(stream))
        return reportf(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream %p does not exist",
                       static_cast<void *>(stream));
    if (!mtemu::device_range(devPtr, count))
        return reportf(cudaErrorInvalidValue,
                       "cudaMemsetAsync(%p, %zu bytes): not inside one device allocation", devPtr,
                       count);
    queue.push_back([devPtr, value, count] { std::memset(devPtr, value, count); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    return cudaMemsetAsync(devPtr, value, count, nullptr);
}

// -- streams
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    count_call();
    return create("cudaStreamCreateWithFlags", pStream, flags, cudaStreamNonBlocking, streams,
                  CUstream_st{flags, current_device});
}
cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    count_call();
    return destroy("cudaStreamDestroy", stream, streams);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    count_call(&counts.syncs);
    {
        std::lock_guard<std::recursive_mutex> g(state_lock);
        if (!stream_valid(stream))
            return reportf(cudaErrorInvalidResourceHandle,
                           "cudaStreamSynchronize(%p): not a stream", static_cast<void *>(stream));
    }
    flush();
    return cudaSuccess;
}

// With work pending: lets the device run it and answers "not ready" this time, so that code
// polling until ready terminates and code assuming completion does not pass by chance.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    count_call();
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!stream_valid(stream))
        return reportf(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p): not a stream",
                       static_cast<void *>(stream));
    if (queue.empty()) return cudaSuccess;
    flush();
    return cudaErrorNotReady; // not an error: not recorded as the last error
}

cudaError_t cudaDeviceSynchronize(void) {
    count_call(&counts.syncs);
    flush();
    return cudaSuccess;
}

// -- events
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    count_call();
    return create("cudaEventCreateWithFlags", event, flags,
                  cudaEventBlockingSync | cudaEventDisableTiming, events,
                  CUevent_st{flags, std::make_shared<event_state>()});
}
cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    count_call();
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!events.count(event) || !stream_valid(stream))
        return report(cudaErrorInvalidResourceHandle, "cudaEventRecord: not an event or stream");
    event->state->recorded = true;
    event->state->done = false;
    queue.push_back([state = event->state] {
        state->at = std::chrono::steady_clock::now();
        state->done = true;
    });
    return cudaSuccess;
}

// Unlike cudaStreamQuery it does not run the queue: work queued before the event stays
// pending until something waits, so a caller's "still in flight" path runs in tests.
cudaError_t cudaEventQuery(cudaEvent_t event) {
    count_call();
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!events.count(event))
        return report(cudaErrorInvalidResourceHandle, "cudaEventQuery: not an event");
    if (!event->state->recorded || event->state->done) return cudaSuccess;
    return cudaErrorNotReady; // not an error: not recorded as the last error
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    count_call(&counts.syncs);
    {
        std::lock_guard<std::recursive_mutex> g(state_lock);
        if (!events.count(event))
            return report(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not an event");
        if (!event->state->recorded || event->state->done) return cudaSuccess;
    }
    flush();
    return cudaSuccess;
}

// The queue is one, in order: work queued after the wait already runs after the event.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    count_call();
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!events.count(event) || !stream_valid(stream))
        return report(cudaErrorInvalidResourceHandle,
                      "cudaStreamWaitEvent: not an event or stream");
    if (flags & ~unsigned{cudaEventWaitExternal})
        return reportf(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    count_call();
    if (!ms) return report(cudaErrorInvalidValue, "cudaEventElapsedTime: null result pointer");
    std::lock_guard<std::recursive_mutex> g(state_lock);
    if (!events.count(start) || !events.count(end))
        return report(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not an event");
    if (((start->flags | end->flags) & cudaEventDisableTiming) || !start->state->recorded ||
        !end->state->recorded)
        return report(cudaErrorInvalidResourceHandle,
                      "cudaEventElapsedTime: an event was never recorded or has timing disabled");
    if (!start->state->done || !end->state->done) return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(end->state->at - start->state->at).count();
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    count_call();
    return destroy("cudaEventDestroy", event, events);
}

} // extern "C"

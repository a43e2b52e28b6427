// The emulated CUDA device, as kernel code sees it. A .cu file compiled by g++ with
// -DMT_CUDA_EMU includes this through src/cuda/cuda_compat.h; the kernels then run on the CPU,
// one fiber per CUDA thread (mtemu_runtime.cpp), against the fake runtime of fake_cudart.cpp.
//
// The device-side API is exactly the set cuda_compat.h allows: threadIdx, blockIdx, blockDim,
// gridDim, warpSize, __syncthreads, __syncwarp, the __shfl*_sync family, __ballot_sync,
// __any_sync, __all_sync, atomicAdd/CAS/Exch/Max/Or, __threadfence; plus the three macros
// MT_LAUNCH, MT_SHARED and MT_DYN_SHARED. Anything else CUDA-only fails to compile, on purpose.
//
// The emulator is stricter than a GPU: a barrier or warp collective used outside what the
// CUDA programming guide defines stops the program with a message naming the kernel, block
// and thread (see mtemu_runtime.cpp for the list).
#ifndef MTEMU_H
#define MTEMU_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h> // dim3, uint3, cudaStream_t, cudaError_t

// crt/host_defines.h gives host compilers its own spellings of these; kernels need them plain.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A bare __shared__ array would silently become a per-thread local: make it a compile error
// that names the fix. Constant memory is not part of the contract.
#define __shared__   mtemu_error_use_MT_SHARED_or_MT_DYN_SHARED_instead_of___shared__
#define __constant__ mtemu_error_constant_memory_is_not_emulated

namespace mtemu {

// The emulated device's limits (also what cudaGetDeviceProperties/cudaDeviceGetAttribute say).
constexpr unsigned max_threads_per_block = 1024;
constexpr unsigned max_block_dim_xy = 1024;
constexpr unsigned max_block_dim_z = 64;
constexpr unsigned max_grid_dim_x = 2147483647u;
constexpr unsigned max_grid_dim_yz = 65535;
constexpr size_t max_shared_per_block = 48 * 1024; // static (MT_SHARED) + dynamic
constexpr int multiprocessor_count = 4;

namespace detail {

// What threadIdx & co. read: the running fiber's context, through pointers the scheduler
// sets on every switch. (__thread, not thread_local: no C++ init wrapper on each access.)
struct block_view {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
extern __thread const uint3 *t_thread_idx;
extern __thread const block_view *t_block;
// Set while an atomic (below) touches memory: the race checker (mtemu_racecheck.h) skips those
// accesses, as atomics never race with each other.
extern __thread bool t_in_atomic;
// An atomic on an address that is not a multiple of its size: a GPU stops with "misaligned
// address". The kernel code's -fsanitize=alignment does not see it (the __atomic builtins and
// the compare-exchange loops take the address as it is), so every atomic checks here.
[[noreturn]] void atomic_misaligned(const char *op, const void *address, size_t bytes);
struct atomic_scope {
    template <class T> atomic_scope(const char *op, const T *address) {
        if (reinterpret_cast<uintptr_t>(address) % sizeof(T) != 0)
            atomic_misaligned(op, address, sizeof(T));
        t_in_atomic = true;
    }
    ~atomic_scope() { t_in_atomic = false; }
    atomic_scope(const atomic_scope &) = delete;
    atomic_scope &operator=(const atomic_scope &) = delete;
};

enum class warp_op : unsigned char { sync, shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all };

// The calling thread's part of a warp collective: waits until every lane in mask has arrived
// (or exited), then returns this lane's result. value and the result carry the operand's bits.
uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int param, int width,
                         const char *file, int line);
void syncthreads(const char *file, int line);

// The block's shared memory: one array per key (a function-local static's address), poisoned
// (0xFF) at each block start; and the launch's dynamic shared memory (16-byte aligned).
void *static_shared(const void *key, size_t bytes, size_t align, const char *name);
void *dynamic_shared();

template <class T>
T shuffle(warp_op op, unsigned mask, T var, int param, int width, const char *file, int line) {
    static_assert(std::is_arithmetic<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                  "warp shuffles take 32- or 64-bit integers and floating-point values");
    uint64_t bits = 0;
    std::memcpy(&bits, &var, sizeof var);
    bits = warp_collective(op, mask, bits, param, width, file, line);
    T out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

template <class T> T atomic_cas(T *address, T compare, T val) {
    __atomic_compare_exchange_n(address, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare; // the old value, whether or not it was swapped
}

// A read-modify-write for what the _n builtins refuse (float, double) or lack (max).
template <class T> T atomic_update(T *address, T (*update)(T old, T val), T val) {
    T old, next;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    do {
        next = update(old, val);
    } while (!__atomic_compare_exchange(address, &old, &next, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED));
    return old;
}

// ---- launches
struct launch_config {
    const char *kernel; // MT_LAUNCH's first argument, as written
    dim3 grid, block;
    size_t dynamic_shared;
    cudaStream_t stream;
};

// A launch dimension as written: a dim3, or an integer that must fit in 32 bits (a negative
// block count computed in int64 would otherwise wrap to a huge grid).
struct dim_arg {
    dim3 dims;
    bool fits;
};
inline dim_arg to_dim(const dim3 &d) {
    return {d, true};
}
template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0> dim_arg to_dim(I n) {
    // a negative n converts to a value past 2^32 too
    return {dim3(static_cast<unsigned>(n)), static_cast<uint64_t>(n) <= 0xffffffffu};
}

// Checks the configuration against the device limits. On a violation records
// cudaErrorInvalidConfiguration as the last error (what the launch's cudaGetLastError()
// returns) and returns false: the arguments are then not evaluated, as with <<< >>>.
bool configure(launch_config &cfg, const char *kernel, dim_arg grid, dim_arg block,
               size_t dynamic_shared, cudaStream_t stream);
// Queues the grid on cfg.stream; thread_body runs the kernel for the current CUDA thread.
void launch(const launch_config &cfg, std::function<void()> thread_body);

// CUDA copies kernel parameters bytewise at the launch.
template <class... A> std::tuple<std::decay_t<A>...> copy_args(A &&...args) {
    static_assert((std::is_trivially_copyable<std::decay_t<A>>::value && ...),
                  "kernel arguments must be trivially copyable (CUDA copies them bytewise)");
    return std::tuple<std::decay_t<A>...>(std::forward<A>(args)...);
}

} // namespace detail
} // namespace mtemu

// ---- built-in variables. Macros: no member or variable of these names in a .cu file.
#define threadIdx (*::mtemu::detail::t_thread_idx)
#define blockIdx  (::mtemu::detail::t_block->block_idx)
#define blockDim  (::mtemu::detail::t_block->block_dim)
#define gridDim   (::mtemu::detail::t_block->grid_dim)
constexpr int warpSize = 32;

// ---- barriers and warp collectives. The trailing file/line default to the call site (for
// the emulator's messages); kernels never pass them.
inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    ::mtemu::detail::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    ::mtemu::detail::warp_collective(::mtemu::detail::warp_op::sync, mask, 0, 0, warpSize, file,
                                     line);
}
template <class T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,
              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::mtemu::detail::shuffle(::mtemu::detail::warp_op::shfl, mask, var, srcLane, width, file,
                                    line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::mtemu::detail::shuffle(::mtemu::detail::warp_op::shfl_up, mask, var,
                                    static_cast<int>(delta > 32 ? 32 : delta), width, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::mtemu::detail::shuffle(::mtemu::detail::warp_op::shfl_down, mask, var,
                                    static_cast<int>(delta > 32 ? 32 : delta), width, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                  const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::mtemu::detail::shuffle(::mtemu::detail::warp_op::shfl_xor, mask, var, laneMask, width,
                                    file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    return static_cast<unsigned>(::mtemu::detail::warp_collective(
        ::mtemu::detail::warp_op::ballot, mask, predicate != 0, 0, warpSize, file, line));
}
inline int __any_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return static_cast<int>(::mtemu::detail::warp_collective(
        ::mtemu::detail::warp_op::any, mask, predicate != 0, 0, warpSize, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return static_cast<int>(::mtemu::detail::warp_collective(
        ::mtemu::detail::warp_op::all, mask, predicate != 0, 0, warpSize, file, line));
}

// ---- atomics and fences. One block runs at a time on one OS thread, so plain
// read-modify-writes would do; the __atomic builtins keep the intent visible.
inline int atomicAdd(int *a, int v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicAdd", a);
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicAdd(unsigned *a, unsigned v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicAdd", a);
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicAdd", a);
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float *a, float v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicAdd", a);
    return ::mtemu::detail::atomic_update<float>(
        a, [](float o, float x) { return o + x; }, v);
}
inline double atomicAdd(double *a, double v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicAdd", a);
    return ::mtemu::detail::atomic_update<double>(
        a, [](double o, double x) { return o + x; }, v);
}
inline int atomicCAS(int *a, int c, int v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicCAS", a);
    return ::mtemu::detail::atomic_cas(a, c, v);
}
inline unsigned atomicCAS(unsigned *a, unsigned c, unsigned v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicCAS", a);
    return ::mtemu::detail::atomic_cas(a, c, v);
}
inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long c,
                                    unsigned long long v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicCAS", a);
    return ::mtemu::detail::atomic_cas(a, c, v);
}
inline int atomicExch(int *a, int v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicExch", a);
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicExch(unsigned *a, unsigned v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicExch", a);
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
inline float atomicExch(float *a, float v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicExch", a);
    return ::mtemu::detail::atomic_update<float>(
        a, [](float, float x) { return x; }, v);
}
inline int atomicMax(int *a, int v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicMax", a);
    return ::mtemu::detail::atomic_update<int>(
        a, [](int o, int x) { return o > x ? o : x; }, v);
}
inline unsigned atomicMax(unsigned *a, unsigned v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicMax", a);
    return ::mtemu::detail::atomic_update<unsigned>(
        a, [](unsigned o, unsigned x) { return o > x ? o : x; }, v);
}
inline int atomicOr(int *a, int v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicOr", a);
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicOr(unsigned *a, unsigned v) {
    ::mtemu::detail::atomic_scope mtemu_atomic_("atomicOr", a);
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// ---- the cuda_compat.h macros
// MT_LAUNCH(kernel, grid, block, shared_bytes, stream, args...): a statement. A template
// kernel whose name has a comma needs an alias without one.
#define MT_LAUNCH(k, grid, block, smem, stream, ...)                                               \
    do {                                                                                           \
        ::mtemu::detail::launch_config mtemu_cfg_;                                                 \
        if (::mtemu::detail::configure(mtemu_cfg_, #k, ::mtemu::detail::to_dim(grid),              \
                                       ::mtemu::detail::to_dim(block), (smem), (stream)))          \
            ::mtemu::detail::launch(                                                               \
                mtemu_cfg_,                                                                        \
                [mtemu_kernel_ = (k), mtemu_args_ = ::mtemu::detail::copy_args(__VA_ARGS__)] {     \
                    std::apply(mtemu_kernel_, mtemu_args_);                                        \
                });                                                                                \
    } while (0)

// The key's address identifies the array (one per kernel, per template instantiation).
#define MT_SHARED(T, name, n)                                                                      \
    static char mtemu_key_##name;                                                                  \
    T *const name = static_cast<T *>(                                                              \
        ::mtemu::detail::static_shared(&mtemu_key_##name, sizeof(T) * (n), alignof(T), #name))

#define MT_DYN_SHARED(T, name) T *const name = static_cast<T *>(::mtemu::detail::dynamic_shared())

#endif

// The emulated device's coalescing census (MTEMU_COALESCE_CENSUS=PATH, "-" for stderr): how
// many 32-byte sectors each kernel's warps touch in device memory per access, against the
// fewest that the same bytes could take, as ncu's "sectors per request" on a GPU. A model, not
// a measurement: it counts what the accesses of a warp would cost if the warp issued them
// together, and says nothing of caches or timing. It finds kernels whose lanes read or write
// scattered addresses (a channels-last tensor walked in NCHW order, say).
//
// Kernel code built with the race checker's instrumentation (-DMTEMU_RACECHECK, a callback
// before every memory access: mtemu_racecheck.cpp) hands each access to device memory (the
// arena of fake_cudart.cpp) to the running block's census. The scheduler runs the lanes of a
// warp one after another between synchronisation points; at each point (a __syncthreads, a
// warp collective of that warp, the block's end) the census lines up the k-th access of every
// lane of the warp (adjacent parts of one aligned 16-byte chunk joined: see access) as one
// warp-wide request, and counts the distinct sectors it touches. Lanes that made fewer
// accesses sit it out: a model of divergence that is exact for uniform control flow. Per
// kernel, at exit: requests, sectors, the ideal sectors (ceil(bytes / 32) per request) and
// their ratio.
#ifndef MTEMU_COALESCE_H
#define MTEMU_COALESCE_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mtemu {
namespace detail {

class coalesce {
  public:
    // Whether MTEMU_COALESCE_CENSUS asks for a census (read once).
    static bool enabled();

    // A block of nthreads threads of `kernel` starts on this OS thread; from now on its
    // accesses to device memory in [lo, hi) are recorded.
    void begin_block(const char *kernel, unsigned nthreads, uintptr_t lo, uintptr_t hi);
    // Counts what is left and stops recording.
    void end_block();
    void set_thread(unsigned t) { thread_ = t; }
    // A __syncthreads completed (every warp), or a collective of warp w.
    void barrier();
    void warp_sync(unsigned w);

    // Kernel code of the current thread touched n bytes at p in device memory. An access that
    // continues the thread's previous one within one aligned 16-byte chunk joins it: a vector
    // access (a 16-byte ew_vec, say) reaches the instrumentation as its parts once the
    // compiler has split the aggregate, where nvcc issues one ld.global.v4.
    void access(uintptr_t p, size_t n) {
        std::vector<access_rec> &t = trace_[thread_];
        if (!t.empty()) {
            access_rec &last = t.back();
            if (last.p + last.n == p && last.p / 16 == (p + n - 1) / 16) {
                last.n += n;
                return;
            }
        }
        t.push_back(access_rec{p, n});
    }

  private:
    struct access_rec {
        uintptr_t p;
        size_t n;
    };
    void flush_warp(unsigned w);

    const char *kernel_ = nullptr;
    unsigned nthreads_ = 0, thread_ = 0;
    std::vector<std::vector<access_rec>> trace_;           // per thread, since its warp's last sync
    std::vector<uintptr_t> sectors_;                       // scratch of flush_warp
    int64_t requests_ = 0, sectors_total_ = 0, ideal_ = 0; // this block's
};

// The running block's census and the device memory it records (hi == 0: none), read by the
// access callbacks; initial-exec, as the race checker's range.
struct coalesce_range {
    uintptr_t lo, hi;
    coalesce *census;
};
extern __thread coalesce_range t_coalesce __attribute__((tls_model("initial-exec")));

} // namespace detail

// [lo, hi) of the emulated device memory (fake_cudart.cpp's arena); false before it exists.
bool device_arena_bounds(uintptr_t *lo, uintptr_t *hi);

} // namespace mtemu
#endif

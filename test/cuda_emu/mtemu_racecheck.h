// The emulated device's shared-memory race checker (compute-sanitizer's racecheck, for the
// emulator): the scheduler's side. Kernel code built with -DMTEMU_RACECHECK and
// -fsanitize=kernel-address (cuda_emu/meson.build) calls __asan_{load,store}*_noabort before
// every memory access; mtemu_racecheck.cpp defines those and hands the accesses that fall in
// the running block's shared memory to the block's racecheck, which the scheduler
// (mtemu_runtime.cpp) keeps informed of block starts, barriers, warp collectives and the
// running CUDA thread.
//
// A hazard: two CUDA threads touch the same shared byte in one barrier interval (between two
// __syncthreads, or the block's start and its first), at least one writing, and, when both are
// lanes of one warp, no warp collective that both took part in completed between the two
// accesses. Reads after a write (RAW), writes after a read (WAR) and writes after a write
// (WAW) are told apart. Atomics (mtemu.h) never race with each other and are not recorded.
//
// Shadow state, per shared byte: the last writer and the readers since, tagged with the
// barrier interval they belong to, so that a new interval needs no clearing. Clocks are 32-bit
// counts of barriers and warp collectives on one OS thread (4 billion before they would wrap).
#ifndef MTEMU_RACECHECK_H
#define MTEMU_RACECHECK_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h> // dim3

namespace mtemu {
namespace detail {

class racecheck {
  public:
    // Stops the program: "thread t: what" (the scheduler's fatal report).
    using fail_fn = void (*)(void *ctx, unsigned t, const char *what);

    racecheck(fail_fn fail, void *ctx) : fail_(fail), fail_ctx_(ctx) {}
    ~racecheck();
    racecheck(const racecheck &) = delete;
    racecheck &operator=(const racecheck &) = delete;

    // A block starts on this OS thread with shared memory [base, base + capacity), of which
    // the first dynamic_bytes are the launch's dynamic shared memory.
    void begin_block(unsigned char *base, size_t capacity, size_t dynamic_bytes,
                     const dim3 &block_dim);
    void end_block();
    // An MT_SHARED array placed at p, for the messages.
    void add_array(const void *p, size_t bytes, const char *name);
    // The CUDA thread (linear id) whose code runs from now on.
    void set_thread(unsigned t) { thread_ = t; }
    // A __syncthreads completed: every access before it is ordered before every one after.
    void barrier() { interval_++; }
    // A warp collective completed with the lanes `arrived` of warp w, whose existing lanes
    // (threads of the block) are `lanes`.
    void warp_sync(unsigned w, unsigned arrived, unsigned lanes);

    // Kernel code on this OS thread touched n bytes at p inside the block's shared memory.
    void access(uintptr_t p, size_t n, bool write);

  private:
    // Who touched one shared byte in barrier interval `interval`; an entry of an older interval
    // is empty.
    struct shadow {
        uint32_t interval;
        uint32_t write_clock; // clock_ at the last write
        uint32_t read_clock;  // clock_ at the latest read since
        uint32_t read_lanes;  // the readers' lanes in first_reader's warp
        uint16_t writer;      // the last writer, or no_thread
        // Since the last write: the first reader (no_thread: none), and the first reader of
        // another warp than the first's (no_thread: all in one warp).
        uint16_t first_reader, cross_reader;
    };
    struct array_name {
        size_t offset, bytes;
        const char *name;
    };
    enum class hazard { raw, war, waw };

    void check_byte(size_t offset, bool write);
    bool ordered(unsigned u, unsigned t, uint32_t clock) const;
    unsigned unordered_reader(const shadow &e, unsigned t) const;
    [[noreturn]] void report(hazard h, size_t offset, unsigned other) const;

    fail_fn fail_;
    void *fail_ctx_;
    std::unique_ptr<shadow[]> shadow_;
    size_t capacity_ = 0;
    uintptr_t base_ = 0;
    dim3 block_dim_{};
    std::vector<array_name> arrays_;
    size_t dynamic_bytes_ = 0;
    unsigned thread_ = 0;
    uint32_t interval_ = 0; // the current barrier interval (0: none yet)
    uint32_t clock_ = 0;    // warp collectives completed so far
    // Per warp: the clock of the last collective of all its lanes, and of the last one of
    // each pair of lanes (only collectives of part of the warp update it).
    std::vector<uint32_t> full_;
    std::vector<std::array<uint32_t, 32 * 32>> pair_;
};

} // namespace detail
} // namespace mtemu
#endif

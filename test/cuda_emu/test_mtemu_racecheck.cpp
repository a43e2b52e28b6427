// Self-test of the emulated device's shared-memory race checker (mtemu_racecheck.h): racy
// kernels stop the program with a message naming the hazard, the byte and both threads (run in
// a forked child, as test_mtemu.cpp's other kernel bugs); the same kernels with their barrier
// or warp collective, shared atomics and a reduction as the library writes them run through.
// Without the checker (an ASan build: cuda_emu/meson.build) the racy cases are reported
// skipped and the others still run.
#include <cstdlib>
#include <vector>

#include "cuda_compat.h"
#include "mtemu_test_util.h"

// ---- kernels, each racy without its barrier (or warp collective)

// Every thread publishes t*10 through dynamic shared memory and reads its left neighbour's.
__global__ void dyn_rotate(int *out, bool with_barrier) {
    MT_DYN_SHARED(int, buf);
    unsigned t = threadIdx.x, n = blockDim.x;
    buf[t] = int(t) * 10;
    if (with_barrier) __syncthreads();
    out[t] = buf[(t + n - 1) % n];
}
// An in-place rotation: each thread reads its right neighbour, then overwrites its own slot.
__global__ void rotate_in_place(int *out, bool with_barrier) {
    MT_SHARED(int, s, 128);
    unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = int(t);
    __syncthreads();
    int v = s[(t + 1) % n];
    if (with_barrier) __syncthreads(); // every read before any overwrite
    s[t] = v * 2;
    __syncthreads();
    out[t] = s[t];
}
// Two writes of each slot by different threads.
__global__ void write_twice(int *out, bool with_barrier) {
    MT_SHARED(int, s, 128);
    unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = int(t);
    if (with_barrier) __syncthreads();
    s[(t + 1) % n] = -int(t);
    __syncthreads();
    out[t] = s[t];
}
// Lanes swap values through shared memory: mode 0 with no ordering, 1 with a __syncwarp of
// the whole warp, 2 with half-warp __syncwarps and partners in the same half, 3 with half-warp
// __syncwarps and partners in the other half (not ordered: a race).
__global__ void warp_exchange(int *out, int mode) {
    MT_SHARED(int, s, 64);
    unsigned t = threadIdx.x, lane = t % 32;
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    s[t] = int(t) * 3;
    if (mode == 1) __syncwarp();
    if (mode >= 2) __syncwarp(half);
    out[t] = s[t ^ (mode == 3 ? 16u : 1u)];
}
// Lane 1 overwrites a value that lane 0 and the other warps read: a __syncwarp orders lane 0's
// read, only a __syncthreads the other warps'.
__global__ void overwrite_after_reads(int *out, bool with_barrier) {
    MT_SHARED(int, flag, 1);
    unsigned t = threadIdx.x;
    if (t == 0) flag[0] = 7;
    __syncthreads();
    int v = t == 0 || t >= 32 ? flag[0] : 0;
    if (with_barrier) {
        __syncthreads();
    } else if (t < 32) {
        __syncwarp();
    }
    if (t == 1) flag[0] = 8;
    out[t] = v;
}
// A histogram in shared memory by atomics from every thread of the block.
__global__ void shared_histogram(const int *x, int *out) {
    MT_SHARED(unsigned, bins, 8);
    unsigned t = threadIdx.x;
    if (t < 8) bins[t] = 0;
    __syncthreads();
    atomicAdd(&bins[unsigned(x[blockIdx.x * blockDim.x + t]) % 8], 1u);
    __syncthreads();
    if (t < 8) out[blockIdx.x * 8 + t] = int(bins[t]);
}
// Row sums as the library's reductions do them: warp shuffles, one partial per warp in shared
// memory, the first warp sums the partials; blocks loop over rows, so the partials are
// rewritten for the next row, which needs the barrier at the end of the loop.
__global__ void row_sums(const float *x, float *out, int rows, int cols, bool trailing_barrier) {
    MT_SHARED(float, warp_part, 32);
    const unsigned full = 0xffffffffu;
    unsigned t = threadIdx.x, lane = t % 32, warp = t / 32, nwarps = blockDim.x / 32;
    for (int r = int(blockIdx.x); r < rows; r += int(gridDim.x)) {
        float v = 0;
        for (int c = int(t); c < cols; c += int(blockDim.x)) v += x[r * cols + c];
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(full, v, o);
        if (lane == 0) warp_part[warp] = v;
        __syncthreads();
        if (warp == 0) {
            v = lane < nwarps ? warp_part[lane] : 0.0f;
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(full, v, o);
            if (lane == 0) out[r] = v;
        }
        if (trailing_barrier) __syncthreads();
    }
}

namespace {

// Runs kernel(out, args...) on one block of `threads` and stores its int outputs in result (a
// macro: the emulator's messages name the kernel as MT_LAUNCH's argument is written).
#define RUN_BLOCK_OF(result, kernel, threads, shared, ...)                                         \
    do {                                                                                           \
        int *d_ = device_alloc<int>(threads);                                                      \
        MT_LAUNCH(kernel, 1, threads, shared, 0, d_, __VA_ARGS__);                                 \
        assert_cuda(cudaGetLastError());                                                           \
        result = download(d_, threads);                                                            \
        assert_cuda(cudaFree(d_));                                                                 \
    } while (0)

// ---- tests

// The racy kernels' fixed versions run through, with the right answers, in both orders.
void test_ordered_shared_accesses_pass(void **) {
    std::vector<int> out;
    for (int reversed = 0; reversed < 2; reversed++) {
        if (reversed) setenv("MTEMU_REVERSE", "1", 1);
        RUN_BLOCK_OF(out, dyn_rotate, 64, 64 * sizeof(int), true);
        for (unsigned t = 0; t < 64; t++) assert_int_equal(out[t], int((t + 63) % 64) * 10);
        RUN_BLOCK_OF(out, rotate_in_place, 128, 0, true);
        for (unsigned t = 0; t < 128; t++) assert_int_equal(out[t], int((t + 1) % 128) * 2);
        RUN_BLOCK_OF(out, write_twice, 128, 0, true);
        for (unsigned t = 0; t < 128; t++) assert_int_equal(out[t], -int((t + 127) % 128));
        RUN_BLOCK_OF(out, overwrite_after_reads, 64, 0, true);
        for (unsigned t = 0; t < 64; t++) assert_int_equal(out[t], t == 0 || t >= 32 ? 7 : 0);
        for (int mode = 1; mode <= 2; mode++) { // the whole warp, and each half with its partners
            RUN_BLOCK_OF(out, warp_exchange, 64, 0, mode);
            for (unsigned t = 0; t < 64; t++) assert_int_equal(out[t], int(t ^ 1) * 3);
        }
    }
    unsetenv("MTEMU_REVERSE");
}

void test_shared_atomics_pass(void **) {
    const unsigned blocks = 3, threads = 256;
    std::vector<int> x(blocks * threads);
    for (unsigned i = 0; i < x.size(); i++) x[i] = int((i * 7) % 13);
    int *dx = device_alloc<int>(x.size()), *dout = device_alloc<int>(blocks * 8);
    upload(dx, x);
    MT_LAUNCH(shared_histogram, blocks, threads, 0, 0, dx, dout);
    assert_cuda(cudaGetLastError());
    std::vector<int> out = download(dout, blocks * 8);
    for (unsigned b = 0; b < blocks; b++) {
        int want[8] = {0};
        for (unsigned t = 0; t < threads; t++) want[x[b * threads + t] % 8]++;
        for (unsigned k = 0; k < 8; k++) assert_int_equal(out[b * 8 + k], want[k]);
    }
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dout));
}

void launch_row_sums(bool trailing_barrier) {
    const int rows = 5, cols = 300;
    std::vector<float> x(size_t(rows) * cols);
    for (size_t i = 0; i < x.size(); i++) x[i] = float(i % 11);
    float *dx = device_alloc<float>(x.size()), *dout = device_alloc<float>(rows);
    upload(dx, x);
    MT_LAUNCH(row_sums, 2, 128, 0, 0, dx, dout, rows, cols, trailing_barrier);
    std::vector<float> sums = download(dout, rows);
    for (int r = 0; r < rows; r++) {
        float want = 0;
        for (int c = 0; c < cols; c++) want += x[size_t(r) * cols + size_t(c)];
        assert_true(sums[size_t(r)] == want); // small integers: exact in any order
    }
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dout));
}

void test_block_reduction_over_rows_passes(void **) {
    for (int reversed = 0; reversed < 2; reversed++) {
        if (reversed) setenv("MTEMU_REVERSE", "1", 1);
        launch_row_sums(true);
    }
    unsetenv("MTEMU_REVERSE");
}

#if defined(MTEMU_RACECHECK)
void run_raw_race() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, dyn_rotate, 64, 64 * sizeof(int), false);
}
void run_war_race() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, rotate_in_place, 128, 0, false);
}
void run_waw_race() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, write_twice, 128, 0, false);
}
void run_raw_race_reversed() {
    setenv("MTEMU_REVERSE", "1", 1);
    run_raw_race();
}
void run_warp_race() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, warp_exchange, 64, 0, 0);
}
void run_cross_half_race() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, warp_exchange, 64, 0, 3);
}
void run_warp_sync_is_not_a_barrier() {
    std::vector<int> out;
    RUN_BLOCK_OF(out, overwrite_after_reads, 64, 0, false);
}
void run_reduction_race() {
    launch_row_sums(false);
}

// Each kind of hazard stops the program, naming both threads and the byte.
void test_shared_races_stop_the_program(void **) {
    expect_death(run_raw_race, SIGABRT,
                 "mtemu: dyn_rotate block (0,0,0) thread (1,0,0): shared-memory race (RAW) on "
                 "dynamic shared[0] with thread (0,0,0), no __syncthreads between");
    expect_death(run_war_race, SIGABRT,
                 "mtemu: rotate_in_place block (0,0,0) thread (1,0,0): shared-memory race (WAR) "
                 "on s[4] with thread (0,0,0), no __syncthreads between");
    expect_death(run_waw_race, SIGABRT,
                 "mtemu: write_twice block (0,0,0) thread (1,0,0): shared-memory race (WAW) on "
                 "s[4] with thread (0,0,0), no __syncthreads between");
    // reversed, the same missing barrier is a write after the neighbour's read
    expect_death(run_raw_race_reversed, SIGABRT,
                 "dyn_rotate block (0,0,0) thread (62,0,0): shared-memory race (WAR) on dynamic "
                 "shared[248] with thread (63,0,0)");
    expect_death(run_warp_race, SIGABRT,
                 "warp_exchange block (0,0,0) thread (1,0,0): shared-memory race (WAR) on s[4] "
                 "with thread (0,0,0), no __syncthreads between (nor a warp collective of both "
                 "lanes)");
    expect_death(run_cross_half_race, SIGABRT,
                 "thread (16,0,0): shared-memory race (WAR) on s[64] with thread (0,0,0)");
    expect_death(run_warp_sync_is_not_a_barrier, SIGABRT,
                 "overwrite_after_reads block (0,0,0) thread (1,0,0): shared-memory race (WAR) on "
                 "flag[0] with thread (32,0,0), no __syncthreads between\n");
    expect_death(run_reduction_race, SIGABRT,
                 "mtemu: row_sums block (0,0,0) thread (32,0,0): shared-memory race (WAR) on "
                 "warp_part[4] with thread (1,0,0), no __syncthreads between");
}
#else
void test_not_run(void **) {}
#endif

} // namespace

int main(void) {
    setenv("MTEMU_MEM_BYTES", "64M", 1);
    unsetenv("MTEMU_REVERSE"); // the tests choose the order themselves
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ordered_shared_accesses_pass),
        cmocka_unit_test(test_shared_atomics_pass),
        cmocka_unit_test(test_block_reduction_over_rows_passes),
#if defined(MTEMU_RACECHECK)
        cmocka_unit_test(test_shared_races_stop_the_program),
#else
        // reported skipped, as test/test_util.h's MT_TEST_SKIPPED does (cmocka's skip() reads
        // as a failure to meson)
        {"test_shared_races_stop_the_program # SKIP no race checker in this build (it needs "
         "b_sanitize=none: cuda_emu/meson.build)",
         test_not_run, nullptr, nullptr, nullptr},
#endif
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

// Self-test of the emulated CUDA device: kernels written as .cu code (through cuda_compat.h),
// the fake runtime's queue and memory rules, and the checks that stop a wrong kernel (run in
// a forked child that must die with the expected signal and message).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_compat.h"
#include "mtemu_test_util.h"

// ---- kernels, as they would be written in a .cu file

// A tree reduction in shared memory: one partial sum per block.
__global__ void block_sum(const float *x, float *out, int n) {
    MT_SHARED(float, partial, 256);
    unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    partial[t] = i < unsigned(n) ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

struct warp_results {
    int down_sum, xor_sum, up_scan, bcast, seg8_sum;
    unsigned ballot;
    int any_big, all_small;
    double dsum;
    long long llmax_lane;
};

__global__ void warp_ops(const int *x, warp_results *r) {
    const unsigned full = 0xffffffffu;
    unsigned t = threadIdx.x, lane = t % warpSize;
    int v = x[t], down = v, xr = v, up = v, seg = v;
    for (int o = 16; o > 0; o /= 2) down += __shfl_down_sync(full, down, o);
    for (int o = 16; o > 0; o /= 2) xr += __shfl_xor_sync(full, xr, o);
    for (int o = 1; o < 32; o *= 2) {
        int y = __shfl_up_sync(full, up, o);
        if (int(lane) >= o) up += y;
    }
    for (int o = 4; o > 0; o /= 2) seg += __shfl_xor_sync(full, seg, o, 8);
    double d = v * 0.5;
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(full, d, o);
    r[t].down_sum = __shfl_sync(full, down, 0); // only lane 0's sum is the warp's
    r[t].xor_sum = xr;
    r[t].up_scan = up;
    r[t].bcast = __shfl_sync(full, v, 5);
    r[t].seg8_sum = seg;
    r[t].ballot = __ballot_sync(full, v % 2);
    r[t].any_big = __any_sync(full, v > 60);
    r[t].all_small = __all_sync(full, v < 100);
    r[t].dsum = d;
    r[t].llmax_lane = __shfl_sync(full, (long long)lane << 40, 31);
    __syncwarp();
}

__global__ void atomics(const int *x, int n, int *isum, float *fsum, unsigned long long *usum,
                        int *imax, unsigned *bits, int *cas_winner, int *exch) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(isum, x[i]);
    atomicAdd(fsum, 1.0f);
    atomicAdd(usum, (unsigned long long)x[i] << 20);
    atomicMax(imax, x[i]);
    atomicOr(bits, 1u << (x[i] % 32));
    atomicCAS(cas_winner, -1, i); // the first thread to get here wins
    atomicExch(exch, 7);
}

// Warps that diverge: warp 0 runs no collective before its last lanes leave, the other
// warps shuffle in two independent half-warp groups; exited lanes are excused from a mask.
__global__ void divergent_warps(int *out) {
    unsigned t = threadIdx.x, lane = t % warpSize;
    int v = int(t);
    if (t >= 32) v = __shfl_xor_sync(lane < 16 ? 0x0000ffffu : 0xffff0000u, v, 8);
    if (lane >= 24) return;
    unsigned voters = __ballot_sync(0xffffffffu, 1);
    __syncwarp(voters);
    out[t] = voters == 0x00ffffffu ? v : -1;
}

// Each thread of a 3-D grid of 3-D blocks writes its own coordinates.
struct coords {
    unsigned bx, by, bz, tx, ty, tz, gdx, gdy, gdz, bdx, bdy, bdz;
};
__global__ void where_am_i(coords *out) {
    unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[bx * nt + tx] =
        coords{blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
               gridDim.x,  gridDim.y,  gridDim.z,  blockDim.x,  blockDim.y,  blockDim.z};
}

// Reverses each block's slice through dynamic shared memory; also reports what the shared
// memory held before the block wrote it.
__global__ void reverse_slices(const float *x, float *y, unsigned *first_bits) {
    MT_DYN_SHARED(float, buf);
    unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    unsigned bits;
    std::memcpy(&bits, &buf[t], sizeof bits);
    first_bits[base + t] = bits;
    __syncthreads();
    buf[t] = x[base + t];
    __syncthreads();
    y[base + t] = buf[n - 1 - t];
}

// Reads its left neighbour's value from shared memory, with or without the barrier.
__global__ void left_neighbour(int *out, bool with_barrier) {
    MT_SHARED(int, s, 128);
    unsigned t = threadIdx.x;
    s[t] = int(t) * 10;
    if (with_barrier) __syncthreads();
    out[t] = t > 0 ? s[t - 1] : 0;
}

__global__ void count_threads(int *n) {
    atomicAdd(n, 1);
}
__global__ void write_index(int *out) {
    out[threadIdx.x] = int(threadIdx.x);
}
__global__ void copy_param(int *out, warp_results r) {
    out[threadIdx.x] = r.bcast;
}

// Planted bugs, each stopped by the emulator.
__global__ void early_exit_then_barrier(int *out, int n) {
    unsigned t = threadIdx.x;
    if (t >= unsigned(n)) return; // skips the barrier
    __syncthreads();
    out[t] = 1;
}
__global__ void barriers_at_two_sites(int *out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}
__global__ void lane_outside_mask(int *out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0); // lanes 16..31 are not in the mask
}
__global__ void masks_disagree(int *out) {
    unsigned mask = threadIdx.x == 3 ? 0x0000000fu : 0xffffffffu;
    out[threadIdx.x] = __shfl_sync(mask, 1, 0);
}
__global__ void read_exited_lane(int *out) {
    if (threadIdx.x == 1) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, int(threadIdx.x), 1);
}
__global__ void warp_waits_for_barrier(int *out) {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    }
}
// (the race checker's kernel-address instrumentation defines __SANITIZE_ADDRESS__ as well)
#if defined(__SANITIZE_ADDRESS__) && !defined(MTEMU_RACECHECK)
__global__ void shared_overrun(int *out) {
    MT_SHARED(int, a, 32);
    a[threadIdx.x + 1] = 1; // lane 31 writes past the end
    out[threadIdx.x] = 0;
}
__global__ void device_overrun(int *out) {
    out[threadIdx.x + 1] = 1;
}
#endif
__global__ void too_much_shared(float *out) {
    MT_SHARED(float, big, 8192); // 32 KiB, plus the launch's dynamic 24 KiB
    big[threadIdx.x] = 1;
    out[threadIdx.x] = big[threadIdx.x];
}

// A 16-byte vector load from an address 4 bytes past alignment (a view of an offset tensor
// taking the vector path): a GPU stops with "misaligned address".
struct alignas(16) vec4f {
    float v[4];
};
__global__ void misaligned_vector_load(int *out) {
    const vec4f *p = reinterpret_cast<const vec4f *>(out + 1);
    vec4f x = *p;
    out[threadIdx.x] = static_cast<int>(x.v[0]);
}

// An atomicAdd on an int 2 bytes past alignment (a flag inside a packed buffer).
__global__ void misaligned_atomic(int *out) {
    int *p = reinterpret_cast<int *>(reinterpret_cast<char *>(out) + 2);
    atomicAdd(p, 1);
}

// ---- helpers
namespace {

// The coalescing census's probes (check_coalesce.sh): lane i reads element i (a warp's 32
// floats are 4 sectors), or element 8 i (32 sectors for the same 128 bytes); both write
// element i.
__global__ void copy_coalesced(const float *x, float *y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i];
}
__global__ void copy_strided(const float *x, float *y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[8 * i];
}

#if defined(MTEMU_RACECHECK)
constexpr bool racecheck_on = true;
#else
constexpr bool racecheck_on = false;
#endif

// Runs kernel on one block of `threads` with a scratch output (a macro: the emulator's
// messages name the kernel as MT_LAUNCH's argument is written).
#define RUN_ONE_BLOCK(kernel, threads, ...)                                                        \
    do {                                                                                           \
        int *out = device_alloc<int>(threads);                                                     \
        MT_LAUNCH(kernel, 1, threads, 0, 0, out, ##__VA_ARGS__);                                   \
        cudaDeviceSynchronize();                                                                   \
    } while (0)

// ---- tests

void test_block_reduction(void **) {
    const int blocks = 64, threads = 256, n = blocks * threads - 100; // a ragged last block
    std::vector<float> x(size_t(blocks) * threads);
    for (int i = 0; i < n; i++) x[size_t(i)] = float(i % 7);
    float *dx = device_alloc<float>(x.size()), *dout = device_alloc<float>(blocks);
    upload(dx, x);
    MT_LAUNCH(block_sum, blocks, threads, 0, 0, dx, dout, n);
    assert_cuda(cudaGetLastError());
    std::vector<float> out = download(dout, blocks);
    for (int b = 0; b < blocks; b++) {
        float want = 0;
        for (int i = b * threads; i < (b + 1) * threads && i < n; i++) want += x[size_t(i)];
        assert_true(out[size_t(b)] == want);
    }
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dout));
}

void test_coalescing_probes(void **) {
    const unsigned blocks = 4, threads = 256, n = blocks * threads;
    std::vector<float> x(8 * size_t(n));
    for (size_t i = 0; i < x.size(); i++) x[i] = float(i);
    float *dx = device_alloc<float>(x.size()), *dy = device_alloc<float>(n);
    upload(dx, x);
    MT_LAUNCH(copy_coalesced, blocks, threads, 0, 0, dx, dy);
    std::vector<float> y = download(dy, n);
    for (unsigned i = 0; i < n; i++) assert_true(y[i] == float(i));
    MT_LAUNCH(copy_strided, blocks, threads, 0, 0, dx, dy);
    y = download(dy, n);
    for (unsigned i = 0; i < n; i++) assert_true(y[i] == float(8 * i));
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dy));
}

void test_warp_shuffles(void **) {
    const unsigned threads = 64; // two warps
    std::vector<int> x(threads);
    for (unsigned i = 0; i < threads; i++) x[i] = int((i * 37) % 64);
    int *dx = device_alloc<int>(threads);
    warp_results *dr = device_alloc<warp_results>(threads);
    upload(dx, x);
    MT_LAUNCH(warp_ops, 1, threads, 0, 0, dx, dr);
    assert_cuda(cudaGetLastError());
    std::vector<warp_results> r = download(dr, threads);
    for (unsigned t = 0; t < threads; t++) {
        unsigned w = t / 32 * 32, lane = t % 32, s8 = t / 8 * 8;
        int sum = 0, scan = 0, seg = 0, any_big = 0;
        unsigned ballot = 0;
        for (unsigned j = 0; j < 32; j++) sum += x[w + j];
        for (unsigned j = 0; j <= lane; j++) scan += x[w + j];
        for (unsigned j = 0; j < 8; j++) seg += x[s8 + j];
        for (unsigned j = 0; j < 32; j++) ballot |= unsigned(x[w + j] % 2) << j;
        for (unsigned j = 0; j < 32; j++) any_big |= x[w + j] > 60;
        assert_int_equal(r[t].down_sum, sum);
        assert_int_equal(r[t].xor_sum, sum);
        assert_int_equal(r[t].up_scan, scan);
        assert_int_equal(r[t].bcast, x[w + 5]);
        assert_int_equal(r[t].seg8_sum, seg);
        assert_int_equal(r[t].ballot, ballot);
        assert_int_equal(r[t].any_big, any_big);
        assert_int_equal(r[t].all_small, 1);
        assert_true(r[t].dsum == sum * 0.5);
        assert_true(r[t].llmax_lane == 31ll << 40);
    }
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dr));
}

void test_divergent_warps(void **) {
    const unsigned threads = 96;
    int *d = device_alloc<int>(threads);
    for (int reversed = 0; reversed < 2; reversed++) {
        if (reversed) setenv("MTEMU_REVERSE", "1", 1);
        assert_cuda(cudaMemset(d, 0, threads * sizeof(int)));
        MT_LAUNCH(divergent_warps, 1, threads, 0, 0, d);
        assert_cuda(cudaGetLastError());
        std::vector<int> out = download(d, threads);
        for (unsigned t = 0; t < threads; t++) {
            int want = t % 32 >= 24 ? 0 : t < 32 ? int(t) : int(t ^ 8);
            assert_int_equal(out[t], want);
        }
    }
    unsetenv("MTEMU_REVERSE");
    assert_cuda(cudaFree(d));
}

void test_atomics(void **) {
    const int n = 100000;
    std::vector<int> x(n);
    long long want_sum = 0;
    for (int i = 0; i < n; i++) want_sum += x[size_t(i)] = (i * 7919) % 1000;
    int *dx = device_alloc<int>(n), *isum = device_alloc<int>(1), *imax = device_alloc<int>(1);
    int *cas = device_alloc<int>(1), *exch = device_alloc<int>(1);
    float *fsum = device_alloc<float>(1);
    unsigned long long *usum = device_alloc<unsigned long long>(1);
    unsigned *bits = device_alloc<unsigned>(1);
    upload(dx, x);
    upload(isum, std::vector<int>{0});
    upload(imax, std::vector<int>{-1});
    upload(cas, std::vector<int>{-1});
    upload(fsum, std::vector<float>{0});
    upload(usum, std::vector<unsigned long long>{0});
    upload(bits, std::vector<unsigned>{0});
    MT_LAUNCH(atomics, (n + 255) / 256, 256, 0, 0, dx, n, isum, fsum, usum, imax, bits, cas, exch);
    assert_cuda(cudaGetLastError());
    assert_int_equal(download(isum, 1)[0], want_sum);
    assert_true(download(fsum, 1)[0] == float(n));
    assert_true(download(usum, 1)[0] == (unsigned long long)want_sum << 20);
    assert_int_equal(download(imax, 1)[0], 999);
    assert_int_equal(download(bits, 1)[0], 0xffffffffu);
    assert_int_equal(download(cas, 1)[0], 0); // thread 0 runs first in forward order
    assert_int_equal(download(exch, 1)[0], 7);
    for (void *p : std::vector<void *>{dx, isum, imax, cas, exch, fsum, usum, bits})
        assert_cuda(cudaFree(p));
}

void test_3d_grid_and_blocks(void **) {
    const dim3 grid(3, 2, 2), block(8, 4, 2);
    const unsigned nb = 12, nt = 64;
    coords *d = device_alloc<coords>(nb * nt);
    MT_LAUNCH(where_am_i, grid, block, 0, 0, d);
    assert_cuda(cudaGetLastError());
    std::vector<coords> c = download(d, nb * nt);
    for (unsigned b = 0; b < nb; b++) {
        for (unsigned t = 0; t < nt; t++) {
            const coords &e = c[b * nt + t];
            assert_int_equal(e.bx + 3 * (e.by + 2 * e.bz), b);
            assert_int_equal(e.tx + 8 * (e.ty + 4 * e.tz), t);
            assert_true(e.bx < 3 && e.by < 2 && e.bz < 2 && e.tx < 8 && e.ty < 4 && e.tz < 2);
            assert_true(e.gdx == 3 && e.gdy == 2 && e.gdz == 2);
            assert_true(e.bdx == 8 && e.bdy == 4 && e.bdz == 2);
        }
    }
    assert_cuda(cudaFree(d));
}

void test_dynamic_shared_memory(void **) {
    const unsigned blocks = 3, threads = 96, n = blocks * threads;
    std::vector<float> x(n);
    for (unsigned i = 0; i < n; i++) x[i] = float(i);
    float *dx = device_alloc<float>(n), *dy = device_alloc<float>(n);
    unsigned *dbits = device_alloc<unsigned>(n);
    upload(dx, x);
    MT_LAUNCH(reverse_slices, blocks, threads, threads * sizeof(float), 0, dx, dy, dbits);
    assert_cuda(cudaGetLastError());
    std::vector<float> y = download(dy, n);
    std::vector<unsigned> bits = download(dbits, n);
    for (unsigned b = 0; b < blocks; b++) {
        for (unsigned t = 0; t < threads; t++) {
            assert_true(y[b * threads + t] == x[b * threads + threads - 1 - t]);
            assert_int_equal(bits[b * threads + t], 0xffffffffu); // poisoned at every block
        }
    }
    assert_cuda(cudaFree(dx));
    assert_cuda(cudaFree(dy));
    assert_cuda(cudaFree(dbits));
}

// A D2H copy lands only when the host synchronises; an H2D copy from pageable memory is
// staged at the call; from pinned memory it reads the source when it runs; kernel arguments
// are copied at the launch.
void test_queue_semantics(void **) {
    cudaStream_t s;
    assert_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d = device_alloc<int>(4);
    std::vector<int> src{1, 2, 3, 4}, dst(4, -5);
    assert_cuda(cudaMemcpyAsync(d, src.data(), 16, cudaMemcpyHostToDevice, s));
    src[0] = 100; // staged already: the device gets 1
    assert_cuda(cudaMemcpyAsync(dst.data(), d, 16, cudaMemcpyDeviceToHost, s));
    assert_int_equal(dst[0], -5);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady); // and lets the device run it
    assert_cuda(cudaStreamQuery(s));
    assert_int_equal(dst[0], 1);
    assert_int_equal(dst[3], 4);

    int *pinned = nullptr;
    assert_cuda(cudaMallocHost((void **)&pinned, 16));
    pinned[0] = 7;
    assert_cuda(cudaMemcpyAsync(d, pinned, 4, cudaMemcpyHostToDevice, s));
    pinned[0] = 8; // read when the copy runs
    assert_cuda(cudaMemcpyAsync(dst.data(), d, 4, cudaMemcpyDeviceToHost, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(dst[0], 8);

    warp_results r{};
    r.bcast = 11;
    MT_LAUNCH(copy_param, 1, 4, 0, s, d, r);
    r.bcast = 12;
    assert_cuda(cudaMemcpyAsync(dst.data(), d, 16, cudaMemcpyDeviceToHost, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(dst[3], 11);

    cudaEvent_t a, b;
    float ms = -1;
    assert_cuda(cudaEventCreate(&a));
    assert_cuda(cudaEventCreate(&b));
    assert_cuda(cudaEventRecord(a, s));
    MT_LAUNCH(write_index, 1, 4, 0, s, d);
    assert_cuda(cudaEventRecord(b, s));
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaErrorNotReady);
    assert_cuda(cudaEventSynchronize(b));
    assert_cuda(cudaEventElapsedTime(&ms, a, b));
    assert_true(ms >= 0);
    assert_cuda(cudaEventDestroy(a));
    assert_cuda(cudaEventDestroy(b));

    assert_cuda(cudaFreeHost(pinned));
    assert_cuda(cudaFree(d));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaGetLastError());
}

void test_mapped_pinned_memory(void **) {
    int *host = nullptr, *dev = nullptr;
    assert_cuda(cudaHostAlloc((void **)&host, 32 * sizeof(int), cudaHostAllocMapped));
    assert_cuda(cudaHostGetDevicePointer((void **)&dev, host, 0));
    assert_ptr_equal(dev, host);
    MT_LAUNCH(write_index, 1, 32, 0, 0, dev);
    assert_cuda(cudaDeviceSynchronize());
    for (int i = 0; i < 32; i++) assert_int_equal(host[i], i);
    int *unmapped = nullptr;
    assert_cuda(cudaMallocHost((void **)&unmapped, 4));
    assert_int_equal(cudaHostGetDevicePointer((void **)&dev, unmapped, 0), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_cuda(cudaFreeHost(unmapped));
    assert_cuda(cudaFreeHost(host));
}

void test_copy_checks(void **) {
    char *d = device_alloc<char>(100);
    char h[200] = {0};
    assert_int_equal(cudaMemcpy(h, d, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d, h, 10, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(h, h + 50, 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d + 200, h, 1, cudaMemcpyDefault), cudaErrorInvalidValue);
    assert_int_equal(cudaMemsetAsync(h, 0, 1, 0), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_cuda(cudaGetLastError()); // reading it cleared it
    assert_cuda(cudaMemset(d, 0x01, 100));
    assert_cuda(cudaMemcpy(h, d, 100, cudaMemcpyDefault)); // inferred D2H
    assert_int_equal(h[99], 1);
    assert_int_equal(cudaFree(h), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_cuda(cudaFree(d));
}

void read_device_memory() {
    float *d = device_alloc<float>(4);
    cudaDeviceSynchronize();
    std::printf("%f\n", double(*static_cast<volatile float *>(d))); // faults
}
void test_host_read_of_device_memory_faults(void **) {
    expect_death(read_device_memory, SIGSEGV, "");
}

void test_missing_barrier_shows_in_reverse_order(void **) {
    int *d = device_alloc<int>(128);
    for (int reversed = 0; reversed < 2; reversed++) {
        if (reversed) setenv("MTEMU_REVERSE", "1", 1);
        for (int with_barrier = 0; with_barrier < 2; with_barrier++) {
            // the race checker stops the run without it (test_mtemu_racecheck.cpp)
            if (racecheck_on && !with_barrier) continue;
            MT_LAUNCH(left_neighbour, 1, 128, 0, 0, d, with_barrier != 0);
            std::vector<int> out = download(d, 128);
            int wrong = 0;
            for (int t = 1; t < 128; t++) wrong += out[size_t(t)] != (t - 1) * 10;
            // Forward order hides the race; reversed, every read sees poison.
            assert_int_equal(wrong, with_barrier || !reversed ? 0 : 127);
        }
    }
    unsetenv("MTEMU_REVERSE");
    assert_cuda(cudaFree(d));
}

void run_early_exit() {
    RUN_ONE_BLOCK(early_exit_then_barrier, 64, 40);
}
void run_two_sites() {
    RUN_ONE_BLOCK(barriers_at_two_sites, 32);
}
void run_lane_outside_mask() {
    RUN_ONE_BLOCK(lane_outside_mask, 32);
}
void run_masks_disagree() {
    RUN_ONE_BLOCK(masks_disagree, 32);
}
void run_read_exited_lane() {
    RUN_ONE_BLOCK(read_exited_lane, 32);
}
void run_deadlock() {
    RUN_ONE_BLOCK(warp_waits_for_barrier, 32);
}
void run_too_much_shared() {
    float *out = device_alloc<float>(32);
    MT_LAUNCH(too_much_shared, 1, 32, 24 * 1024, 0, out);
    cudaDeviceSynchronize();
}

void run_misaligned_vector_load() {
    RUN_ONE_BLOCK(misaligned_vector_load, 32);
}

void run_misaligned_atomic() {
    RUN_ONE_BLOCK(misaligned_atomic, 32);
}

void test_kernel_bugs_stop_the_program(void **) {
    expect_death(run_early_exit, SIGABRT,
                 "mtemu: early_exit_then_barrier block (0,0,0) thread (40,0,0): exited "
                 "without reaching the __syncthreads");
    expect_death(run_two_sites, SIGABRT, "while 16 other threads wait at the one at");
    expect_death(run_lane_outside_mask, SIGABRT, "which does not include the calling lane 16");
    expect_death(run_masks_disagree, SIGABRT,
                 "lanes disagree: __shfl_sync(mask 0x0000000f, width 32)");
    expect_death(run_read_exited_lane, SIGABRT, "reads lane 1, which has exited");
    expect_death(run_deadlock, SIGABRT, "deadlock: __shfl_sync(mask 0xffffffff)");
    expect_death(run_too_much_shared, SIGABRT, "over the 49152 bytes");
    // kernel code is built with -fsanitize=alignment, not recoverable (cuda_emu/meson.build)
    expect_death(run_misaligned_vector_load, 0, "which requires 16 byte alignment");
    expect_death(run_misaligned_atomic, SIGABRT, "atomicAdd on 0x");
    expect_death(run_misaligned_atomic, SIGABRT,
                 "which is not 4-byte aligned (misaligned address)");
}

#if defined(__SANITIZE_ADDRESS__) && !defined(MTEMU_RACECHECK)
void run_shared_overrun() {
    RUN_ONE_BLOCK(shared_overrun, 32);
}
void run_device_overrun() {
    RUN_ONE_BLOCK(device_overrun, 32);
}
// Under ASan the emulator poisons what lies around shared arrays and device blocks.
void test_overruns_reported_by_asan(void **) {
    expect_death(run_shared_overrun, 0, "AddressSanitizer: use-after-poison");
    expect_death(run_device_overrun, 0, "AddressSanitizer: use-after-poison");
}
#endif

void test_launch_config_errors(void **) {
    int *n = device_alloc<int>(1);
    int evaluated = 0;
    MT_LAUNCH(count_threads, 1, 1025, 0, 0, (evaluated++, n));
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_cuda(cudaGetLastError());
    assert_int_equal(evaluated, 0); // as with <<< >>>: no arguments on a failed launch
    const dim3 bad_grids[] = {dim3(1, 65536, 1), dim3(1, 1, 65536), dim3(0, 1, 1)};
    for (const dim3 &g : bad_grids) {
        MT_LAUNCH(count_threads, g, 32, 0, 0, n);
        assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    }
    MT_LAUNCH(count_threads, 1, dim3(1, 1, 65), 0, 0, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MT_LAUNCH(count_threads, 1, dim3(2048, 1, 1), 0, 0, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MT_LAUNCH(count_threads, 1, 32, 48 * 1024 + 1, 0, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MT_LAUNCH(count_threads, int64_t(-1), 32, 0, 0, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MT_LAUNCH(count_threads, int64_t(1) << 32, 32, 0, 0, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);

    cudaStream_t gone;
    assert_cuda(cudaStreamCreate(&gone));
    assert_cuda(cudaStreamDestroy(gone));
    MT_LAUNCH(count_threads, 1, 32, 0, gone, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);

    // the limits themselves are fine: 1024 threads, 48 KiB, z 64
    upload(n, std::vector<int>{0});
    MT_LAUNCH(count_threads, dim3(2, 1, 1), dim3(16, 1, 64), 48 * 1024, 0, n);
    assert_cuda(cudaGetLastError());
    assert_int_equal(download(n, 1)[0], 2048);
    assert_cuda(cudaFree(n));
}

void test_out_of_memory(void **) {
    size_t free_bytes, total;
    assert_cuda(cudaMemGetInfo(&free_bytes, &total));
    assert_int_equal(total, 64 << 20); // MTEMU_MEM_BYTES, set by main
    void *a = nullptr, *b = nullptr;
    assert_int_equal(cudaMalloc(&a, total + 1), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_cuda(cudaMalloc(&a, 40 << 20));
    assert_int_equal(cudaMalloc(&b, 40 << 20), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_null(b);
    assert_cuda(cudaFree(a));
    assert_cuda(cudaMalloc(&b, 40 << 20)); // the freed space is reused
    assert_cuda(cudaFree(b));
    assert_cuda(cudaMemGetInfo(&free_bytes, &total));
    assert_int_equal(free_bytes, total);
    assert_cuda(cudaGetLastError());
}

void test_device_queries(void **) {
    int count = 0, value = 0, version = 0;
    assert_cuda(cudaGetDeviceCount(&count));
    assert_int_equal(count, 1);
    assert_cuda(cudaSetDevice(0));
    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
    assert_int_equal(value, 4);
    assert_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, 0));
    assert_int_equal(value, 9);
    cudaDeviceProp prop;
    assert_cuda(cudaGetDeviceProperties(&prop, 0));
    assert_int_equal(prop.warpSize, 32);
    assert_int_equal(prop.sharedMemPerBlock, 48 * 1024);
    assert_cuda(cudaRuntimeGetVersion(&version));
    assert_int_equal(version, 13000);
    assert_string_equal(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidConfiguration),
                        "invalid configuration argument");
    assert_cuda(cudaGetLastError());
}

} // namespace

int main(void) {
    setenv("MTEMU_MEM_BYTES", "64M", 1);
    unsetenv("MTEMU_REVERSE"); // the tests choose the order themselves
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_reduction),
        cmocka_unit_test(test_warp_shuffles),
        cmocka_unit_test(test_coalescing_probes),
        cmocka_unit_test(test_divergent_warps),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_3d_grid_and_blocks),
        cmocka_unit_test(test_dynamic_shared_memory),
        cmocka_unit_test(test_queue_semantics),
        cmocka_unit_test(test_mapped_pinned_memory),
        cmocka_unit_test(test_copy_checks),
        cmocka_unit_test(test_host_read_of_device_memory_faults),
        cmocka_unit_test(test_missing_barrier_shows_in_reverse_order),
        cmocka_unit_test(test_kernel_bugs_stop_the_program),
#if defined(__SANITIZE_ADDRESS__) && !defined(MTEMU_RACECHECK)
        cmocka_unit_test(test_overruns_reported_by_asan),
#endif
        cmocka_unit_test(test_launch_config_errors),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_device_queries),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

// The shared-memory race checker (mtemu_racecheck.h): the shadow state, the hazard rules, and
// the callbacks that GCC's -fsanitize=kernel-address instrumentation calls before every memory
// access of kernel code (defined only with -DMTEMU_RACECHECK: in a build with the real
// AddressSanitizer, libasan defines them).
#include "mtemu_racecheck.h"
#include "mtemu_coalesce.h"
#include "mtemu.h"

#include <cstdio>

namespace mtemu {
namespace detail {

__thread bool t_in_atomic; // mtemu.h's atomics set it around their access

namespace {

// The running block's shared memory on this OS thread; hi == 0 when no block runs, so the
// callbacks' fast path is the two compares of the range check. initial-exec: the kernels'
// library is loaded at start-up, and a plain TLS access is far cheaper than __tls_get_addr.
struct active_range {
    uintptr_t lo, hi;
    racecheck *rc;
};
__thread active_range t_range __attribute__((tls_model("initial-exec")));

constexpr uint16_t no_thread = 0xFFFF; // threads are < 1024

} // namespace

racecheck::~racecheck() {
    if (t_range.rc == this) t_range = active_range{0, 0, nullptr};
}

void racecheck::begin_block(unsigned char *base, size_t capacity, size_t dynamic_bytes,
                            const dim3 &block_dim) {
    if (capacity_ < capacity) {
        shadow_.reset(new shadow[capacity]()); // interval 0: empty
        capacity_ = capacity;
    }
    base_ = reinterpret_cast<uintptr_t>(base);
    block_dim_ = block_dim;
    dynamic_bytes_ = dynamic_bytes;
    arrays_.clear();
    unsigned warps = (block_dim.x * block_dim.y * block_dim.z + 31) / 32;
    if (full_.size() < warps) { // clocks only grow: old entries are older than any access
        full_.resize(warps);
        pair_.resize(warps);
    }
    interval_++;
    t_range = active_range{base_, base_ + capacity, this};
}

void racecheck::end_block() {
    t_range = active_range{0, 0, nullptr};
}

void racecheck::add_array(const void *p, size_t bytes, const char *name) {
    arrays_.push_back({reinterpret_cast<uintptr_t>(p) - base_, bytes, name});
}

void racecheck::warp_sync(unsigned w, unsigned arrived, unsigned lanes) {
    uint32_t now = ++clock_;
    if (arrived == lanes) {
        full_[w] = now;
        return;
    }
    std::array<uint32_t, 32 * 32> &pair = pair_[w];
    for (unsigned a = arrived; a; a &= a - 1) {
        unsigned i = static_cast<unsigned>(__builtin_ctz(a));
        for (unsigned b = arrived; b; b &= b - 1)
            pair[i * 32 + static_cast<unsigned>(__builtin_ctz(b))] = now;
    }
}

// Whether thread u's access at `clock` (this interval) is ordered before thread t's now:
// both in one warp, with a collective of both lanes completed since.
bool racecheck::ordered(unsigned u, unsigned t, uint32_t clock) const {
    unsigned w = t / 32;
    if (u / 32 != w) return false;
    return full_[w] > clock || pair_[w][t % 32 * 32 + u % 32] > clock;
}

// A reader of e other than t whose read is not ordered before t's write, or no_thread.
unsigned racecheck::unordered_reader(const shadow &e, unsigned t) const {
    unsigned first = e.first_reader, w = first / 32;
    if (first == no_thread) return no_thread;
    if (w != t / 32) return first;
    if (e.cross_reader != no_thread) return e.cross_reader; // in another warp than first and t
    for (unsigned m = e.read_lanes; m; m &= m - 1) {
        unsigned u = w * 32 + static_cast<unsigned>(__builtin_ctz(m));
        if (u != t && !ordered(u, t, e.read_clock)) return u;
    }
    return no_thread;
}

void racecheck::check_byte(size_t offset, bool write) {
    shadow &e = shadow_[offset];
    unsigned t = thread_;
    if (e.interval != interval_) e = shadow{interval_, 0, 0, 0, no_thread, no_thread, no_thread};
    if (e.writer != no_thread && e.writer != t && !ordered(e.writer, t, e.write_clock))
        report(write ? hazard::waw : hazard::raw, offset, e.writer);
    if (write) {
        unsigned u = unordered_reader(e, t);
        if (u != no_thread) report(hazard::war, offset, u);
        // what is ordered after this write is ordered after those reads too
        e.writer = static_cast<uint16_t>(t);
        e.write_clock = clock_;
        e.read_lanes = 0;
        e.first_reader = e.cross_reader = no_thread;
        return;
    }
    if (e.first_reader == no_thread) {
        e.first_reader = static_cast<uint16_t>(t);
    } else if (e.first_reader / 32 != t / 32 && e.cross_reader == no_thread) {
        e.cross_reader = static_cast<uint16_t>(t);
    }
    if (e.first_reader / 32 == t / 32) e.read_lanes |= 1u << t % 32;
    e.read_clock = clock_;
}

void racecheck::access(uintptr_t p, size_t n, bool write) {
    if (t_in_atomic) return;
    uintptr_t lo = p < base_ ? base_ : p,
              hi = p + n > base_ + capacity_ ? base_ + capacity_ : p + n;
    for (uintptr_t a = lo; a < hi; a++) check_byte(a - base_, write);
}

void racecheck::report(hazard h, size_t offset, unsigned other) const {
    const char *name = "shared memory outside every array";
    size_t at = offset;
    if (offset < dynamic_bytes_) {
        name = "dynamic shared";
    } else {
        for (const array_name &a : arrays_) {
            if (offset >= a.offset && offset < a.offset + a.bytes) {
                name = a.name;
                at = offset - a.offset;
                break;
            }
        }
    }
    const dim3 &d = block_dim_;
    unsigned x = other % d.x, y = other / d.x % d.y, z = other / (d.x * d.y);
    const char *kind = h == hazard::raw ? "RAW" : h == hazard::war ? "WAR" : "WAW";
    char what[400];
    std::snprintf(what, sizeof what,
                  "shared-memory race (%s) on %s[%zu] with thread (%u,%u,%u), no "
                  "__syncthreads between%s",
                  kind, name, at, x, y, z,
                  other / 32 == thread_ / 32 ? " (nor a warp collective of both lanes)" : "");
    fail_(fail_ctx_, thread_, what);
    __builtin_unreachable(); // fail_ does not return
}

} // namespace detail
} // namespace mtemu

#if defined(MTEMU_RACECHECK)
namespace {

// The fast path, inlined in every callback: an access outside the running block's shared
// memory (or with no block running) returns after the range check, and one compare more when
// no coalescing census records device memory (mtemu_coalesce.h).
__attribute__((always_inline)) inline void on_access(const void *p, size_t n, bool write) {
    using mtemu::detail::t_coalesce;
    using mtemu::detail::t_range;
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (__builtin_expect(a >= t_range.hi || a + n <= t_range.lo, 1)) {
        if (__builtin_expect(a < t_coalesce.hi, 0) && a >= t_coalesce.lo)
            t_coalesce.census->access(a, n);
        return;
    }
    t_range.rc->access(a, n, write);
}

} // namespace

// GCC's -fsanitize=kernel-address callbacks, with
// --param asan-instrumentation-with-call-threshold=0 (a call per access, no inline shadow).
// Hidden: the kernels' library calls its own copy directly, not through the PLT.
#define MTEMU_CALLBACK extern "C" __attribute__((visibility("hidden"), hot))
#define MTEMU_ACCESS_CALLBACKS(n)                                                                  \
    MTEMU_CALLBACK void __asan_load##n##_noabort(void *p) {                                        \
        on_access(p, n, false);                                                                    \
    }                                                                                              \
    MTEMU_CALLBACK void __asan_store##n##_noabort(void *p) {                                       \
        on_access(p, n, true);                                                                     \
    }
MTEMU_ACCESS_CALLBACKS(1)
MTEMU_ACCESS_CALLBACKS(2)
MTEMU_ACCESS_CALLBACKS(4)
MTEMU_ACCESS_CALLBACKS(8)
MTEMU_ACCESS_CALLBACKS(16)
// Called before a noreturn call (a throw, abort) to clean the stack's shadow: none here.
MTEMU_CALLBACK void __asan_handle_no_return() {}
MTEMU_CALLBACK void __asan_loadN_noabort(void *p, size_t n) {
    on_access(p, n, false);
}
MTEMU_CALLBACK void __asan_storeN_noabort(void *p, size_t n) {
    on_access(p, n, true);
}
#endif

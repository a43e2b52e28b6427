// The emulated device's memory: one mmap'd arena with a first-fit allocator, readable and
// writable by the host only while queued work runs (PROT_NONE otherwise), fresh blocks filled
// with 0xFF, and under ASan the slack after each block and freed blocks poisoned. Each block
// remembers the device it was allocated on. Used by fake_cudart.cpp alone, under its lock.
#ifndef MTEMU_ARENA_H
#define MTEMU_ARENA_H
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace mtemu {
namespace memory {

#if defined(__SANITIZE_ADDRESS__)
inline void asan_poison(const void *p, size_t n) {
    ASAN_POISON_MEMORY_REGION(p, n);
}
inline void asan_unpoison(const void *p, size_t n) {
    ASAN_UNPOISON_MEMORY_REGION(p, n);
}
#else
inline void asan_poison(const void *, size_t) {}
inline void asan_unpoison(const void *, size_t) {}
#endif

constexpr size_t device_alignment = 256; // what cudaMalloc guarantees
constexpr size_t block_gap = 256;        // after each block, so an overrun leaves the block

inline size_t page_size() {
    static const size_t n = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return n;
}
inline size_t round_up(size_t n, size_t to) {
    return (n + to - 1) / to * to;
}

// "8589934592", "8G", "512M", "64K"
inline size_t capacity_from_env() {
    const size_t fallback = size_t{8} << 30;
    const char *v = std::getenv("MTEMU_MEM_BYTES");
    if (!v || !*v) return fallback;
    char *end;
    unsigned long long n = std::strtoull(v, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift) end++;
    if (*end || n == 0) {
        std::fprintf(stderr, "mtemu: MTEMU_MEM_BYTES=%s is not a size; using 8G\n", v);
        return fallback;
    }
    return static_cast<size_t>(n) << shift;
}

// The device memory arena. Guarded by fake_cudart.cpp's state_lock.
class arena {
  public:
    struct block {
        size_t bytes; // requested
        size_t span;  // taken from the arena: rounded up, plus the gap
        int device;   // the device it was allocated on
    };

    size_t capacity() {
        init();
        return capacity_;
    }
    size_t in_use() const { return in_use_; }

    void *alloc(size_t bytes, int on_device) {
        if (!init()) return nullptr;
        size_t span = round_up(bytes, device_alignment) + block_gap;
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second < span) continue;
            size_t off = it->first, left = it->second - span;
            free_.erase(it);
            if (left) free_[off + span] = left;
            live_[off] = block{bytes, span, on_device};
            in_use_ += span;
            if (off + span > high_water_) high_water_ = off + span;
            char *p = base_ + off;
            set_access(off, span, true);
            asan_unpoison(p, bytes);
            std::memset(p, 0xFF, bytes);
            asan_poison(p + bytes, span - bytes);
            if (!open_) set_access(off, span, false);
            return p;
        }
        return nullptr;
    }

    bool release(void *p) {
        if (!contains(p)) return false;
        auto it = live_.find(static_cast<size_t>(static_cast<char *>(p) - base_));
        if (it == live_.end()) return false;
        size_t off = it->first, span = it->second.span;
        live_.erase(it);
        in_use_ -= span;
        asan_poison(p, span);
        // Give the pages back (they are filled again at the next allocation).
        size_t lo = round_up(off, page_size()), hi = (off + span) / page_size() * page_size();
        if (hi > lo) madvise(base_ + lo, hi - lo, MADV_DONTNEED);
        auto next = free_.lower_bound(off);
        if (next != free_.end() && off + span == next->first) {
            span += next->second;
            free_.erase(next);
        }
        auto prev = free_.lower_bound(off);
        if (prev != free_.begin() && (--prev, prev->first + prev->second == off)) {
            prev->second += span;
        } else {
            free_[off] = span;
        }
        return true;
    }

    // The live block holding p, or null.
    const block *find(const void *p, size_t *offset_in_block) const {
        const char *c = static_cast<const char *>(p);
        if (!contains(p)) return nullptr;
        size_t off = static_cast<size_t>(c - base_);
        auto it = live_.upper_bound(off);
        if (it == live_.begin()) return nullptr;
        --it;
        if (off - it->first >= it->second.bytes) return nullptr;
        *offset_in_block = off - it->first;
        return &it->second;
    }
    // [lo, hi) of the whole arena; false before the first allocation reserved it.
    bool bounds(uintptr_t *lo, uintptr_t *hi) const {
        if (!base_) return false;
        *lo = reinterpret_cast<uintptr_t>(base_);
        *hi = *lo + capacity_;
        return true;
    }
    bool contains(const void *p) const {
        const char *c = static_cast<const char *>(p);
        return base_ && c >= base_ && c < base_ + capacity_;
    }

    // Device memory is host-accessible only between open() and close(): while queued work runs.
    void open() {
        open_ = true;
        if (high_water_) set_access(0, high_water_, true);
    }
    void close() {
        open_ = false;
        if (high_water_) set_access(0, high_water_, false);
    }

  private:
    bool init() {
        if (base_) return true;
        if (init_failed_) return false;
        capacity_ = round_up(capacity_from_env(), page_size());
        void *p =
            mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            std::fprintf(stderr, "mtemu: cannot reserve %zu bytes of device memory\n", capacity_);
            init_failed_ = true;
            return false;
        }
        base_ = static_cast<char *>(p);
        free_[0] = capacity_;
        return true;
    }
    void set_access(size_t off, size_t n, bool rw) {
        size_t lo = off / page_size() * page_size(), hi = round_up(off + n, page_size());
        if (mprotect(base_ + lo, hi - lo, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
            std::perror("mtemu: mprotect of device memory");
            std::abort();
        }
    }

    char *base_ = nullptr;
    bool init_failed_ = false, open_ = false;
    size_t capacity_ = 0, in_use_ = 0, high_water_ = 0;
    std::map<size_t, size_t> free_; // offset -> length
    std::map<size_t, block> live_;  // offset -> block
};

} // namespace memory
} // namespace mtemu
#endif

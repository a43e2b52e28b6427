// The coalescing census (mtemu_coalesce.h): per warp, the k-th accesses of its lanes as one
// request; per kernel, the totals, written at exit.
#include "mtemu_coalesce.h"
#include "mtemu_census.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace mtemu {
namespace detail {

__thread coalesce_range t_coalesce __attribute__((tls_model("initial-exec")));

namespace {

constexpr uintptr_t sector_bytes = 32;

struct totals {
    int64_t requests = 0, sectors = 0, ideal = 0;
};
std::mutex lock;
std::map<std::string, totals> *by_kernel; // NULL: no census
const char *path;

// Most sectors first: where the memory traffic goes.
void write_census() {
    std::lock_guard<std::mutex> g(lock);
    mtemu_census_write(
        "MTEMU_COALESCE_CENSUS", path, *by_kernel, [](const totals &t) { return t.sectors; },
        [](std::FILE *f, const std::string &name, const totals &t) {
            std::fprintf(f, "%lld %lld %lld %.3f %s\n", (long long)t.requests, (long long)t.sectors,
                         (long long)t.ideal, t.sectors ? (double)t.ideal / (double)t.sectors : 1.0,
                         name.c_str());
        });
}

} // namespace

bool coalesce::enabled() {
    static std::once_flag once;
    std::call_once(once, [] {
        path = std::getenv("MTEMU_COALESCE_CENSUS");
        if (!path || !*path) return;
#if !defined(MTEMU_RACECHECK)
        std::fprintf(stderr, "mtemu: MTEMU_COALESCE_CENSUS needs kernels built with the race "
                             "checker's instrumentation (an emulated build without ASan)\n");
        return;
#endif
        by_kernel = new std::map<std::string, totals>;
        std::atexit(write_census);
    });
    return by_kernel != nullptr;
}

void coalesce::begin_block(const char *kernel, unsigned nthreads, uintptr_t lo, uintptr_t hi) {
    kernel_ = kernel;
    nthreads_ = nthreads;
    if (trace_.size() < nthreads) trace_.resize(nthreads);
    for (unsigned t = 0; t < nthreads; t++) trace_[t].clear();
    requests_ = sectors_total_ = ideal_ = 0;
    t_coalesce = coalesce_range{lo, hi, this};
}

void coalesce::end_block() {
    t_coalesce = coalesce_range{0, 0, nullptr};
    barrier();
    std::lock_guard<std::mutex> g(lock);
    totals &t = (*by_kernel)[kernel_];
    t.requests += requests_;
    t.sectors += sectors_total_;
    t.ideal += ideal_;
}

void coalesce::barrier() {
    for (unsigned w = 0; w * 32 < nthreads_; w++) flush_warp(w);
}

void coalesce::warp_sync(unsigned w) {
    flush_warp(w);
}

void coalesce::flush_warp(unsigned w) {
    unsigned lo = w * 32, hi = std::min(nthreads_, lo + 32);
    size_t longest = 0;
    for (unsigned t = lo; t < hi; t++) longest = std::max(longest, trace_[t].size());
    for (size_t k = 0; k < longest; k++) {
        sectors_.clear();
        size_t bytes = 0;
        for (unsigned t = lo; t < hi; t++) {
            if (k >= trace_[t].size()) continue;
            const access_rec &a = trace_[t][k];
            for (uintptr_t s = a.p / sector_bytes; s <= (a.p + a.n - 1) / sector_bytes; s++)
                sectors_.push_back(s);
            bytes += a.n;
        }
        std::sort(sectors_.begin(), sectors_.end());
        requests_++;
        sectors_total_ += std::unique(sectors_.begin(), sectors_.end()) - sectors_.begin();
        ideal_ += static_cast<int64_t>((bytes + sector_bytes - 1) / sector_bytes);
    }
    for (unsigned t = lo; t < hi; t++) trace_[t].clear();
}

} // namespace detail
} // namespace mtemu

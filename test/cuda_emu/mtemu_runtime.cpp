// The emulated device's scheduler: runs a grid's blocks one after another on the OS thread
// that synchronises (inside the fake runtime's queue flush), each CUDA thread on a fiber.
//
// Fibers. A block's threads are taken in linear order (reversed with MTEMU_REVERSE=1) by
// "runner" fibers: a runner runs one thread after another as plain calls until its current
// thread waits (a barrier or a warp collective); the scheduler then starts a new runner for
// the next thread, and the waiting runner resumes that thread once the wait is over. A kernel
// without barriers thus costs one fiber per block (HIP-CPU's fast path, without its
// limitation: a warp collective in a later thread, which is legal in a warp that thread 0
// is not in, simply gets a fiber of its own); a kernel with a __syncthreads one per thread.
// Stacks are 64 KiB with a PROT_NONE guard page below, pooled per OS thread.
//
// Checks, stricter than a GPU; each prints "mtemu: <kernel> block (x,y,z) thread (x,y,z):
// <what>" and aborts (a kernel bug must stop the test):
// - a __syncthreads that a thread skips by exiting, or threads waiting at different ones;
// - lanes that disagree on a warp collective: lane L reaches one while a lane of its mask waits
//   for L at another (a different mask, operation or width);
// - a lane outside its own mask; a shuffle reading a lane that exited, does not exist or is
//   not in the mask; a width that is not a power of two;
// - deadlock: nothing can run (e.g. lanes wait at a warp collective for a lane that waits at
//   a __syncthreads);
// - more than 48 KiB of static + dynamic shared memory;
// - a misaligned access in kernel code (built with -fsanitize=alignment, cuda_emu/meson.build):
//   UBSan's report, made fatal below also where ASan's runtime would let it go on;
// - a shared-memory data race (where kernel code is built with the race checker, -DMTEMU_RACECHECK
//   in cuda_emu/meson.build; not in ASan builds): two threads touch one shared byte between two
//   barriers, one of them writing, and, lanes of one warp, with no warp collective of both in
//   between: "shared-memory race (RAW|WAR|WAW) on <array>[<byte>] with thread (x,y,z), no
//   __syncthreads between" (mtemu_racecheck.h).
// Lanes of a warp need not be converged (independent thread scheduling): a collective is the
// rendezvous of exactly the lanes of its mask, others may be elsewhere. Exited lanes are
// excused from a mask (as the programming guide says); only reading their value is an error.
#include "mtemu.h"
#include "mtemu_internal.h"
#include "mtemu_sanitizer_hooks.h"
#include "mtemu_coalesce.h"
#include "mtemu_racecheck.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

// x86-64 switches stacks with a few instructions; other machines (or -DMTEMU_UCONTEXT, to
// compare) use swapcontext, ten times slower: it saves the signal mask with two syscalls.
#if !defined(__x86_64__) || defined(MTEMU_UCONTEXT)
#define MTEMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

namespace mtemu {
namespace detail {
__thread const uint3 *t_thread_idx;
__thread const block_view *t_block;
} // namespace detail

namespace {

using detail::warp_op;

constexpr size_t stack_bytes = 64 * 1024;
constexpr size_t entry_frames_bytes = 4096; // more than fiber_main and the switch take
constexpr unsigned char poison_byte = 0xFF; // NaN in every float format, -1 in integers

// ---- machine contexts
#if defined(MTEMU_USE_UCONTEXT)
struct machine_context {
    ucontext_t uc;
};
void make_context(machine_context &c, char *stack_lo, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack_lo;
    c.uc.uc_stack.ss_size = stack_bytes;
    c.uc.uc_link = nullptr; // entry never returns
    makecontext(&c.uc, entry, 0);
}
void switch_context(machine_context &from, machine_context &to) {
    swapcontext(&from.uc, &to.uc);
}
#else
struct machine_context {
    void *sp;
};
// Saves the callee-saved registers on the current stack, stores rsp to *save_sp, loads
// load_sp and pops the registers saved there. The FP control words (MXCSR, x87) are not
// switched: every fiber runs with the same ones.
extern "C" void mtemu_swap_stacks(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl mtemu_swap_stacks
    .hidden mtemu_swap_stacks
    .type mtemu_swap_stacks, @function
    .p2align 4
mtemu_swap_stacks:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mtemu_swap_stacks, .-mtemu_swap_stacks
)");
// A new stack holds what mtemu_swap_stacks pops: six zeroed registers, then entry as the
// return address, then a null fake return address for entry itself, so that entry starts
// with rsp = 8 (mod 16) as after a call.
void make_context(machine_context &c, char *stack_lo, void (*entry)()) {
    void **top = reinterpret_cast<void **>(stack_lo + stack_bytes);
    top[-1] = nullptr;
    top[-2] = reinterpret_cast<void *>(entry);
    for (int i = 3; i <= 8; i++) top[-i] = nullptr;
    c.sp = top - 8;
}
void switch_context(machine_context &from, machine_context &to) {
    mtemu_swap_stacks(&from.sp, to.sp);
}
#endif

struct fiber {
    machine_context ctx;
    char *stack_lo; // lowest usable byte, just above the guard page
    void *asan_fake_stack = nullptr;
    void *tsan_fiber = nullptr; // TSan's view of this stack
    int thread = -1;            // linear id of the CUDA thread it runs
    bool finished = false;
};

// Stacks are mapped once per OS thread and reused by every block after.
class fiber_pool {
  public:
    fiber_pool() = default;
    fiber_pool(const fiber_pool &) = delete;
    fiber_pool &operator=(const fiber_pool &) = delete;
    ~fiber_pool() {
        for (auto &f : all_) {
            tsan_drop_fiber(f->tsan_fiber);
            munmap(f->stack_lo - page_bytes(), map_bytes());
        }
    }

    fiber *acquire() {
        if (idle_.empty()) grow();
        fiber *f = idle_.back();
        idle_.pop_back();
        f->thread = -1;
        f->finished = false;
        f->asan_fake_stack = nullptr;
        return f;
    }
    void release(fiber *f) { idle_.push_back(f); }

  private:
    static size_t page_bytes() {
        static const size_t n = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        return n;
    }
    static size_t map_bytes() { return page_bytes() + stack_bytes; } // guard page and stack
    void grow() {
        void *p = mmap(nullptr, map_bytes(), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED || mprotect(p, page_bytes(), PROT_NONE) != 0) {
            std::fprintf(stderr, "mtemu: cannot map a %zu KiB fiber stack\n", stack_bytes / 1024);
            std::abort();
        }
        auto f = std::make_unique<fiber>();
        f->stack_lo = static_cast<char *>(p) + page_bytes();
        f->tsan_fiber = tsan_new_fiber(); // reused with the stack: fiber_main leaves no frame
        idle_.push_back(f.get());
        all_.push_back(std::move(f));
    }

    std::vector<std::unique_ptr<fiber>> all_;
    std::vector<fiber *> idle_;
};

const char *op_name(warp_op op) {
    switch (op) {
    case warp_op::sync:
        return "__syncwarp";
    case warp_op::shfl:
        return "__shfl_sync";
    case warp_op::shfl_up:
        return "__shfl_up_sync";
    case warp_op::shfl_down:
        return "__shfl_down_sync";
    case warp_op::shfl_xor:
        return "__shfl_xor_sync";
    case warp_op::ballot:
        return "__ballot_sync";
    case warp_op::any:
        return "__any_sync";
    case warp_op::all:
        return "__all_sync";
    }
    return "?";
}

bool same_site(const char *file_a, int line_a, const char *file_b, int line_b) {
    return line_a == line_b && (file_a == file_b || std::strcmp(file_a, file_b) == 0);
}

bool reverse_order_requested() {
    const char *v = std::getenv("MTEMU_REVERSE");
    return v && *v && std::strcmp(v, "0") != 0;
}

enum class wait_kind : unsigned char { none, barrier, warp };

struct cuda_thread {
    uint3 idx;
    fiber *on; // the runner it started on; it stays there until it exits
    bool exited;
    wait_kind wait;
    const char *file; // where it waits
    int line;
    // its part of the warp collective it waits at: operands, then result
    int param;
    uint64_t value, result;
};

// A warp collective some lanes wait at; each waiting lane is in one, so a warp has at most 32.
struct warp_group {
    warp_op op;
    unsigned mask, arrived;
    int width;
};
struct warp_state {
    unsigned gone; // lanes that exited, and lanes past the end of the block
    unsigned ngroups;
    warp_group groups[32];
};

// Runs the blocks of one grid; one per OS thread, reused across launches.
class scheduler {
  public:
    scheduler() = default;
    scheduler(const scheduler &) = delete;
    scheduler &operator=(const scheduler &) = delete;
    void run_grid(const detail::launch_config &cfg, const std::function<void()> &body);

    // Called from kernel code, on a fiber.
    void syncthreads(const char *file, int line);
    uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int param, int width,
                             const char *file, int line);
    void *static_shared(const void *key, size_t bytes, size_t align, const char *name);
    void *dynamic_shared() { return shared_->bytes; }

    [[noreturn]] void fail(unsigned t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
    unsigned current_thread() const { return static_cast<unsigned>(current_->thread); }

  private:
    [[noreturn]] static void fiber_main();
    void run_block();
    void run_threads();
    void resume(fiber *f);
    void wait();
    void thread_exited(unsigned t);
    void try_complete(unsigned warp, unsigned group);
    void describe_wait(unsigned t, char *buf, size_t n) const;
    [[noreturn]] void report_deadlock();
    unsigned order(unsigned i) const { return reverse_ ? nthreads_ - 1 - i : i; }
    unsigned lanes_in_warp(unsigned base) const {
        return nthreads_ - base < 32 ? nthreads_ - base : 32;
    }

    const detail::launch_config *cfg_ = nullptr;
    const std::function<void()> *body_ = nullptr;
    detail::block_view view_{};
    bool reverse_ = false;
    unsigned nthreads_ = 0;

    // the running block
    std::vector<cuda_thread> threads_;
    std::vector<warp_state> warps_;
    std::deque<fiber *> ready_;
    unsigned started_ = 0, exited_ = 0, at_barrier_ = 0;
    int first_exited_ = -1;
    const char *barrier_file_ = nullptr;
    int barrier_line_ = 0;

    // fibers
    fiber_pool pool_;
    machine_context sched_ctx_{};
    fiber *current_ = nullptr;
    void *sched_fake_stack_ = nullptr;
    void *sched_tsan_fiber_ = nullptr; // the OS thread's own, where the scheduler runs
    const void *host_stack_bottom_ = nullptr;
    size_t host_stack_size_ = 0;

    // shared memory: dynamic first, then each MT_SHARED array followed by a redzone (poisoned
    // under ASan, so that an overrun is reported); 48 KiB of data at most, plus room for the
    // alignment and redzones of 128 arrays.
    struct shared_array {
        const void *key;
        void *p;
    };
    static constexpr size_t shared_redzone = 32;
    static constexpr size_t shared_capacity = max_shared_per_block + 128 * 2 * shared_redzone;
    struct alignas(64) shared_memory {
        unsigned char bytes[shared_capacity];
    };
    std::unique_ptr<shared_memory> shared_ = std::make_unique<shared_memory>();
    std::vector<shared_array> shared_arrays_;
    size_t shared_bytes_ = 0; // requested, static + dynamic
    size_t shared_top_ = 0;   // layout, with alignment and redzones

    static void fail_race(void *self, unsigned t, const char *what) {
        static_cast<scheduler *>(self)->fail(t, "%s", what);
    }
    detail::racecheck race_{fail_race, this};
    detail::coalesce coalesce_; // MTEMU_COALESCE_CENSUS
    bool coalescing_ = false;   // this block is recorded
};

__thread scheduler *t_sched; // the scheduler running a grid on this OS thread, if any

scheduler &running_scheduler(const char *what) {
    if (!t_sched) {
        std::fprintf(stderr, "mtemu: %s called outside a kernel\n", what);
        std::abort();
    }
    return *t_sched;
}

void scheduler::fail(unsigned t, const char *fmt, ...) {
    const uint3 &b = view_.block_idx, &i = threads_[t].idx;
    std::fprintf(stderr, "mtemu: %s block (%u,%u,%u) thread (%u,%u,%u): ", cfg_->kernel, b.x, b.y,
                 b.z, i.x, i.y, i.z);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::abort();
}

void scheduler::run_grid(const detail::launch_config &cfg, const std::function<void()> &body) {
    cfg_ = &cfg;
    body_ = &body;
    reverse_ = reverse_order_requested();
    const dim3 &bd = cfg.block, &gd = cfg.grid;
    view_.block_dim = bd;
    view_.grid_dim = gd;
    nthreads_ = bd.x * bd.y * bd.z;
    threads_.resize(nthreads_);
    warps_.resize((nthreads_ + 31) / 32);
    for (unsigned t = 0; t < nthreads_; t++)
        threads_[t].idx = uint3{t % bd.x, t / bd.x % bd.y, t / (bd.x * bd.y)};
    uint64_t nblocks = uint64_t{gd.x} * gd.y * gd.z;
    for (uint64_t i = 0; i < nblocks; i++) {
        uint64_t b = reverse_ ? nblocks - 1 - i : i;
        view_.block_idx =
            uint3{static_cast<unsigned>(b % gd.x), static_cast<unsigned>(b / gd.x % gd.y),
                  static_cast<unsigned>(b / (uint64_t{gd.x} * gd.y))};
        run_block();
    }
    cfg_ = nullptr;
    body_ = nullptr;
}

void scheduler::run_block() {
    for (cuda_thread &t : threads_) {
        t.on = nullptr;
        t.exited = false;
        t.wait = wait_kind::none;
    }
    for (unsigned w = 0; w < warps_.size(); w++) {
        unsigned lanes = lanes_in_warp(w * 32);
        warps_[w].gone = lanes == 32 ? 0 : ~0u << lanes;
        warps_[w].ngroups = 0;
    }
    started_ = exited_ = at_barrier_ = 0;
    first_exited_ = -1;
    ready_.clear();

    size_t dyn = cfg_->dynamic_shared;
    shared_arrays_.clear();
    shared_bytes_ = dyn;
    shared_top_ = (dyn + 15) / 16 * 16 + shared_redzone;
    asan_poison(shared_->bytes, shared_capacity);
    asan_unpoison(shared_->bytes, dyn);
    std::memset(shared_->bytes, poison_byte, dyn);
    race_.begin_block(shared_->bytes, shared_capacity, dyn, view_.block_dim);
    uintptr_t dev_lo, dev_hi;
    coalescing_ = detail::coalesce::enabled() && device_arena_bounds(&dev_lo, &dev_hi);
    if (coalescing_) coalesce_.begin_block(cfg_->kernel, nthreads_, dev_lo, dev_hi);

    detail::t_block = &view_;
    for (;;) {
        fiber *f;
        if (!ready_.empty()) {
            f = ready_.front();
            ready_.pop_front();
        } else if (started_ < nthreads_) {
            f = pool_.acquire();
            // ASan: a reused stack may still carry the redzones of frames that never returned.
            // Every frame returns (and unpoisons its redzones) except those live at the fiber's
            // last switch: fiber_main's and the switch's, at the top of the stack. Unpoisoning
            // only the top halves the cost of a barrier kernel under ASan.
            asan_unpoison(f->stack_lo + stack_bytes - entry_frames_bytes, entry_frames_bytes);
            make_context(f->ctx, f->stack_lo, fiber_main);
        } else if (exited_ == nthreads_) {
            break;
        } else {
            report_deadlock();
        }
        resume(f);
        if (f->finished) pool_.release(f);
    }
    race_.end_block();
    if (coalescing_) coalesce_.end_block();
    detail::t_block = nullptr;
    detail::t_thread_idx = nullptr;
}

void scheduler::resume(fiber *f) {
    current_ = f;
    detail::t_thread_idx = f->thread >= 0 ? &threads_[f->thread].idx : nullptr;
    if (f->thread >= 0) {
        race_.set_thread(static_cast<unsigned>(f->thread));
        coalesce_.set_thread(static_cast<unsigned>(f->thread));
    }
    sched_tsan_fiber_ = tsan_current_fiber();
    tsan_switch(f->tsan_fiber);
    asan_start_switch(&sched_fake_stack_, f->stack_lo, stack_bytes);
    switch_context(sched_ctx_, f->ctx);
    asan_finish_switch(sched_fake_stack_, nullptr, nullptr);
}

// The scheduler's side of a waiting thread: back to the scheduler until released.
void scheduler::wait() {
    fiber *self = current_;
    tsan_switch(sched_tsan_fiber_);
    asan_start_switch(&self->asan_fake_stack, host_stack_bottom_, host_stack_size_);
    switch_context(self->ctx, sched_ctx_);
    asan_finish_switch(self->asan_fake_stack, nullptr, nullptr);
}

// Not instrumented by TSan: it never returns, so its function-entry record would pile up on
// the TSan fiber each time the stack is reused.
__attribute__((no_sanitize_thread)) void scheduler::fiber_main() {
    scheduler &s = *t_sched;
    asan_finish_switch(nullptr, &s.host_stack_bottom_, &s.host_stack_size_);
    s.run_threads();
    fiber *self = s.current_;
    self->finished = true;
    tsan_switch(s.sched_tsan_fiber_);
    asan_start_switch(nullptr, s.host_stack_bottom_, s.host_stack_size_); // this stack is done
    switch_context(self->ctx, s.sched_ctx_);
    __builtin_unreachable(); // a finished fiber is never resumed
}

// A runner: takes the next thread not started yet, until there is none.
void scheduler::run_threads() {
    while (started_ < nthreads_) {
        unsigned t = order(started_++);
        current_->thread = static_cast<int>(t);
        threads_[t].on = current_;
        detail::t_thread_idx = &threads_[t].idx;
        race_.set_thread(t);
        coalesce_.set_thread(t);
        (*body_)();
        thread_exited(t);
    }
}

void scheduler::thread_exited(unsigned t) {
    threads_[t].exited = true;
    exited_++;
    if (first_exited_ < 0) first_exited_ = static_cast<int>(t);
    if (at_barrier_ > 0)
        fail(t, "exited without reaching the __syncthreads at %s:%d that %u other threads wait at",
             barrier_file_, barrier_line_, at_barrier_);
    // A collective waiting for this lane may be complete now: exited lanes are excused.
    warp_state &w = warps_[t / 32];
    w.gone |= 1u << t % 32;
    for (unsigned g = w.ngroups; g-- > 0;) // downwards: a completed group is swapped with the last
        if (w.groups[g].mask >> t % 32 & 1) try_complete(t / 32, g);
}

void scheduler::syncthreads(const char *file, int line) {
    unsigned t = static_cast<unsigned>(current_->thread);
    if (first_exited_ >= 0) {
        const uint3 &e = threads_[first_exited_].idx;
        fail(t, "__syncthreads at %s:%d is not reached by every thread: thread (%u,%u,%u) exited",
             file, line, e.x, e.y, e.z);
    }
    if (at_barrier_ > 0 && !same_site(file, line, barrier_file_, barrier_line_))
        fail(t, "reached __syncthreads at %s:%d while %u other threads wait at the one at %s:%d",
             file, line, at_barrier_, barrier_file_, barrier_line_);
    if (at_barrier_ == 0) {
        barrier_file_ = file;
        barrier_line_ = line;
    }
    cuda_thread &me = threads_[t];
    me.wait = wait_kind::barrier;
    me.file = file;
    me.line = line;
    if (++at_barrier_ == nthreads_) {
        at_barrier_ = 0;
        race_.barrier();
        if (coalescing_) coalesce_.barrier();
        for (unsigned i = 0; i < nthreads_; i++) {
            cuda_thread &o = threads_[order(i)];
            o.wait = wait_kind::none;
            ready_.push_back(o.on);
        }
    }
    wait();
}

uint64_t scheduler::warp_collective(warp_op op, unsigned mask, uint64_t value, int param, int width,
                                    const char *file, int line) {
    unsigned t = static_cast<unsigned>(current_->thread), lane = t % 32;
    if (!(mask >> lane & 1))
        fail(t, "%s at %s:%d with mask 0x%08x, which does not include the calling lane %u",
             op_name(op), file, line, mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(t, "%s at %s:%d: width %d is not a power of 2 in [1, 32]", op_name(op), file, line,
             width);
    warp_state &w = warps_[t / 32];
    unsigned base = t / 32 * 32, g = w.ngroups;
    for (unsigned i = 0; i < w.ngroups; i++) {
        const warp_group &o = w.groups[i];
        if (o.op == op && o.mask == mask && o.width == width) {
            g = i;
        } else if ((o.mask >> lane & 1) && (o.arrived & mask)) {
            // o waits for this lane, and this collective for lanes waiting at o: neither can
            // ever complete.
            unsigned j = static_cast<unsigned>(__builtin_ctz(o.arrived & mask));
            const cuda_thread &other = threads_[base + j];
            fail(t,
                 "lanes disagree: %s(mask 0x%08x, width %d) at %s:%d needs lane %u, which "
                 "waits for this lane at %s(mask 0x%08x, width %d) at %s:%d",
                 op_name(op), mask, width, file, line, j, op_name(o.op), o.mask, o.width,
                 other.file, other.line);
        }
    }
    if (g == w.ngroups) w.groups[w.ngroups++] = warp_group{op, mask, 0, width};
    w.groups[g].arrived |= 1u << lane;
    cuda_thread &me = threads_[t];
    me.wait = wait_kind::warp;
    me.file = file;
    me.line = line;
    me.param = param;
    me.value = value;
    try_complete(t / 32, g);
    wait();
    return me.result;
}

// Completes a collective once every lane of its mask has arrived or is gone: computes each
// lane's result and makes them runnable.
void scheduler::try_complete(unsigned warp, unsigned group) {
    warp_state &ws = warps_[warp];
    const warp_group g = ws.groups[group];
    if (g.mask & ~g.arrived & ~ws.gone) return; // still to arrive
    ws.groups[group] = ws.groups[--ws.ngroups];
    unsigned base = warp * 32, lanes = lanes_in_warp(base), ballot = 0;
    race_.warp_sync(warp, g.arrived, lanes == 32 ? ~0u : ~(~0u << lanes));
    if (coalescing_) coalesce_.warp_sync(warp);
    for (unsigned j = 0; j < 32; j++)
        if ((g.arrived >> j & 1) && threads_[base + j].value) ballot |= 1u << j;
    unsigned w = static_cast<unsigned>(g.width);
    for (unsigned j = 0; j < 32; j++) {
        if (!(g.arrived >> j & 1)) continue;
        cuda_thread &me = threads_[base + j];
        unsigned seg = j & ~(w - 1), pos = j - seg, d = static_cast<unsigned>(me.param), src = j;
        switch (g.op) {
        case warp_op::sync:
            me.result = 0;
            continue;
        case warp_op::ballot:
            me.result = ballot;
            continue;
        case warp_op::any:
            me.result = ballot != 0;
            continue;
        case warp_op::all:
            me.result = ballot == g.arrived;
            continue;
        case warp_op::shfl:
            src = seg + (d & (w - 1));
            break;
        case warp_op::shfl_up:
            src = pos >= d ? j - d : j;
            break;
        case warp_op::shfl_down:
            src = d < w - pos ? j + d : j;
            break;
        case warp_op::shfl_xor:
            src = (j ^ (d & 31)) < seg + w ? j ^ (d & 31) : j;
            break;
        }
        if (src >= lanes)
            fail(base + j,
                 "%s at %s:%d reads lane %u, which does not exist (the block has %u "
                 "threads)",
                 op_name(g.op), me.file, me.line, src, nthreads_);
        if (threads_[base + src].exited)
            fail(base + j, "%s at %s:%d reads lane %u, which has exited", op_name(g.op), me.file,
                 me.line, src);
        if (!(g.mask >> src & 1))
            fail(base + j, "%s at %s:%d reads lane %u, which is not in the mask 0x%08x",
                 op_name(g.op), me.file, me.line, src, g.mask);
        me.result = threads_[base + src].value;
    }
    for (unsigned i = 0; i < 32; i++) {
        unsigned j = reverse_ ? 31 - i : i;
        if (!(g.arrived >> j & 1)) continue;
        threads_[base + j].wait = wait_kind::none;
        ready_.push_back(threads_[base + j].on);
    }
}

// What thread t waits at, for a message.
void scheduler::describe_wait(unsigned t, char *buf, size_t n) const {
    const cuda_thread &me = threads_[t];
    if (me.wait == wait_kind::barrier) {
        std::snprintf(buf, n, "__syncthreads at %s:%d", me.file, me.line);
        return;
    }
    const warp_state &w = warps_[t / 32];
    for (unsigned g = 0; g < w.ngroups; g++) {
        if (w.groups[g].arrived >> t % 32 & 1) {
            std::snprintf(buf, n, "%s(mask 0x%08x) at %s:%d", op_name(w.groups[g].op),
                          w.groups[g].mask, me.file, me.line);
            return;
        }
    }
    std::snprintf(buf, n, "nothing");
}

// Nothing can run. Waits at barriers alone never get here (a barrier releases when all
// threads reach it, and fails when one exits), so some lanes wait at a warp collective for a
// lane that waits elsewhere.
void scheduler::report_deadlock() {
    for (unsigned w = 0; w < warps_.size(); w++) {
        if (warps_[w].ngroups == 0) continue;
        const warp_group &g = warps_[w].groups[0];
        unsigned missing = g.mask & ~g.arrived & ~warps_[w].gone;
        unsigned t = w * 32 + static_cast<unsigned>(__builtin_ctz(g.arrived));
        unsigned j = static_cast<unsigned>(__builtin_ctz(missing));
        char elsewhere[300];
        describe_wait(w * 32 + j, elsewhere, sizeof elsewhere);
        fail(t, "deadlock: %s(mask 0x%08x) at %s:%d waits for lane %u, which waits at %s",
             op_name(g.op), g.mask, threads_[t].file, threads_[t].line, j, elsewhere);
    }
    fail(order(0), "deadlock: no thread can run");
}

void *scheduler::static_shared(const void *key, size_t bytes, size_t align, const char *name) {
    for (const shared_array &a : shared_arrays_)
        if (a.key == key) return a.p;
    unsigned t = static_cast<unsigned>(current_->thread);
    if (shared_bytes_ + bytes > max_shared_per_block)
        fail(t,
             "MT_SHARED %s (%zu bytes) takes the block's shared memory to %zu bytes, over the "
             "%zu bytes of the device (dynamic: %zu)",
             name, bytes, shared_bytes_ + bytes, max_shared_per_block, cfg_->dynamic_shared);
    size_t a = align < 16 ? 16 : align;
    size_t at = (shared_top_ + a - 1) / a * a;
    if (at + bytes + shared_redzone > shared_capacity)
        fail(t, "MT_SHARED %s: too many shared arrays for the emulator's layout", name);
    unsigned char *p = shared_->bytes + at;
    asan_unpoison(p, bytes);
    std::memset(p, poison_byte, bytes);
    shared_top_ = at + bytes + shared_redzone;
    shared_bytes_ += bytes;
    shared_arrays_.push_back({key, p});
    race_.add_array(p, bytes, name);
    return p;
}

} // namespace

// ---- the entry points of mtemu.h
namespace detail {

void syncthreads(const char *file, int line) {
    running_scheduler("__syncthreads").syncthreads(file, line);
}

uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int param, int width,
                         const char *file, int line) {
    return running_scheduler(op_name(op))
        .warp_collective(op, mask, value, param, width, file, line);
}

void *static_shared(const void *key, size_t bytes, size_t align, const char *name) {
    return running_scheduler("MT_SHARED").static_shared(key, bytes, align, name);
}

void atomic_misaligned(const char *op, const void *address, size_t bytes) {
    scheduler &s = running_scheduler(op);
    s.fail(s.current_thread(), "%s on %p, which is not %zu-byte aligned (misaligned address)", op,
           address, bytes);
}

void *dynamic_shared() {
    return running_scheduler("MT_DYN_SHARED").dynamic_shared();
}

bool configure(launch_config &cfg, const char *kernel, dim_arg grid, dim_arg block,
               size_t dynamic_shared, cudaStream_t stream) {
    cfg = launch_config{kernel, grid.dims, block.dims, dynamic_shared, stream};
    const dim3 &g = grid.dims, &b = block.dims;
    uint64_t threads = uint64_t{b.x} * b.y * b.z;
    char why[160];
    if (!grid.fits || !block.fits)
        std::snprintf(why, sizeof why, "%s does not fit in 32 bits", grid.fits ? "block" : "grid");
    else if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0)
        std::snprintf(why, sizeof why, "grid (%u,%u,%u) or block (%u,%u,%u) has a zero dimension",
                      g.x, g.y, g.z, b.x, b.y, b.z);
    else if (threads > max_threads_per_block || b.x > max_block_dim_xy || b.y > max_block_dim_xy ||
             b.z > max_block_dim_z)
        std::snprintf(why, sizeof why, "block (%u,%u,%u) is over the limits (%u threads, z %u)",
                      b.x, b.y, b.z, max_threads_per_block, max_block_dim_z);
    else if (g.x > max_grid_dim_x || g.y > max_grid_dim_yz || g.z > max_grid_dim_yz)
        std::snprintf(why, sizeof why, "grid (%u,%u,%u) is over the limits (y and z %u)", g.x, g.y,
                      g.z, max_grid_dim_yz);
    else if (dynamic_shared > max_shared_per_block)
        std::snprintf(why, sizeof why, "%zu bytes of dynamic shared memory, over %zu",
                      dynamic_shared, max_shared_per_block);
    else
        return true;
    char what[400];
    std::snprintf(what, sizeof what, "launch of %s: %s", kernel, why);
    report(cudaErrorInvalidConfiguration, what);
    return false;
}

void launch(const launch_config &cfg, std::function<void()> thread_body) {
    count_launch(cfg);
    enqueue(cfg.stream, [cfg, body = std::move(thread_body)] {
        static thread_local std::unique_ptr<scheduler> sched; // freed at thread exit
        if (!sched) sched = std::make_unique<scheduler>();
        t_sched = sched.get();
        sched->run_grid(cfg, body);
        t_sched = nullptr;
    });
}

} // namespace detail
} // namespace mtemu

// UBSan's options when UBSAN_OPTIONS does not say: a report stops the program, as a fault
// stops a GPU kernel. (Under ASan, GCC's runtime goes on after a report even for checks built
// with -fno-sanitize-recover unless halt_on_error is set.)
extern "C" const char *__ubsan_default_options();
extern "C" const char *__ubsan_default_options() {
    return "halt_on_error=1:print_stacktrace=1";
}

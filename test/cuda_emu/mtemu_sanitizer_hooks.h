// What the emulator's fiber switches tell the sanitizers (mtemu_runtime.cpp): AddressSanitizer
// and ThreadSanitizer each keep per-stack state that must follow every switch. Each hook is a
// no-op in a build without that sanitizer.
#ifndef MTEMU_SANITIZER_HOOKS_H
#define MTEMU_SANITIZER_HOOKS_H

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace mtemu {

// ---- AddressSanitizer needs to know which stack is live. No-ops without ASan.
#if defined(__SANITIZE_ADDRESS__)
inline void asan_start_switch(void **fake_stack, const void *bottom, size_t size) {
    __sanitizer_start_switch_fiber(fake_stack, bottom, size);
}
inline void asan_finish_switch(void *fake_stack, const void **old_bottom, size_t *old_size) {
    __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
}
inline void asan_poison(const void *p, size_t n) {
    ASAN_POISON_MEMORY_REGION(p, n);
}
inline void asan_unpoison(const void *p, size_t n) {
    ASAN_UNPOISON_MEMORY_REGION(p, n);
}
#else
inline void asan_start_switch(void **, const void *, size_t) {}
inline void asan_finish_switch(void *, const void **, size_t *) {}
inline void asan_poison(const void *, size_t) {}
inline void asan_unpoison(const void *, size_t) {}
#endif

// ---- ThreadSanitizer must be told about every stack switch too (its shadow call stack is
// per fiber); it then checks the host side (fake runtime, library, threads of ranks) while
// the fibers of one block, which run one after another on one OS thread, synchronise at
// each switch. No-ops without TSan.
#if defined(__SANITIZE_THREAD__)
inline void *tsan_current_fiber() {
    return __tsan_get_current_fiber();
}
inline void *tsan_new_fiber() {
    return __tsan_create_fiber(0);
}
inline void tsan_drop_fiber(void *f) {
    if (f) __tsan_destroy_fiber(f);
}
inline void tsan_switch(void *to) {
    __tsan_switch_to_fiber(to, 0);
}
#else
inline void *tsan_current_fiber() {
    return nullptr;
}
inline void *tsan_new_fiber() {
    return nullptr;
}
inline void tsan_drop_fiber(void *) {}
inline void tsan_switch(void *) {}
#endif

} // namespace mtemu
#endif

// Helpers of the emulated device's self-tests (test_mtemu.cpp, test_mtemu_racecheck.cpp):
// device memory from the host, and running a function in a forked child that must die.
#ifndef MTEMU_TEST_UTIL_H
#define MTEMU_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" { // cmocka 1.1's header declares C functions without it
#include <cmocka.h>
}

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

namespace {

#define assert_cuda(call) assert_int_equal((call), cudaSuccess)

template <class T> T *device_alloc(size_t n) {
    void *p = nullptr;
    assert_cuda(cudaMalloc(&p, n * sizeof(T)));
    return static_cast<T *>(p);
}
template <class T> void upload(T *dst, const std::vector<T> &src) {
    assert_cuda(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T> std::vector<T> download(const T *src, size_t n) {
    std::vector<T> out(n);
    assert_cuda(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
}

// Runs fn in a forked child with stderr captured; expects the child to die of signal sig
// (0: to exit with a failure status, as after a sanitizer's report) with `text` in what it
// printed.
inline void expect_death(void (*fn)(), int sig, const char *text) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        std::signal(SIGSEGV, SIG_DFL); // ASan would report the fault and exit 1 instead
        fn();
        _exit(0); // survived: skip the exit handlers (LeakSanitizer)
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    bool died_as_expected = sig ? WIFSIGNALED(status) && WTERMSIG(status) == sig
                                : WIFEXITED(status) && WEXITSTATUS(status) != 0;
    if (!died_as_expected || err.find(text) == std::string::npos)
        fail_msg("child: %s %d, expected signal %d and \"%s\"; its stderr:\n%s",
                 WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), sig, text,
                 err.c_str());
}

} // namespace
#endif

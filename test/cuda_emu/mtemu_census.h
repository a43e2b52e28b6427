// What the emulator's two censuses share (MTEMU_LAUNCH_CENSUS in fake_cudart.cpp,
// MTEMU_COALESCE_CENSUS in mtemu_coalesce.cpp): their per-kernel rows, largest `key` first
// (ties by name), written one line each by `line` to `path`, or to stderr for "-". A path that
// cannot be opened is reported on stderr under the variable's name `var`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

template <class T, class Key, class Line>
void mtemu_census_write(const char *var, const char *path,
                        const std::map<std::string, T> &by_kernel, Key key, Line line) {
    std::vector<std::pair<std::string, T>> rows(by_kernel.begin(), by_kernel.end());
    std::sort(rows.begin(), rows.end(), [&](const auto &x, const auto &y) {
        int64_t kx = key(x.second), ky = key(y.second);
        return kx != ky ? kx > ky : x.first < y.first;
    });
    bool to_stderr = std::strcmp(path, "-") == 0;
    std::FILE *f = to_stderr ? stderr : std::fopen(path, "w");
    if (!f) {
        std::fprintf(stderr, "mtemu: %s: cannot write %s\n", var, path);
        return;
    }
    for (const auto &r : rows) line(f, r.first, r.second);
    if (!to_stderr) std::fclose(f);
}

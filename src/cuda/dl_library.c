#include "dl_library.h"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

void *mt_dl_open(const char *const *names, size_t n, char *err, size_t cap) {
    void *lib = NULL;
    for (size_t i = 0; i < n && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib && !err[0]) {
        const char *why = dlerror();
        snprintf(err, cap, "cannot load %s: %s", n ? names[0] : "(nothing)",
                 why ? why : "not found");
    }
    return lib;
}

void mt_dl_symbol(void *lib, const char *libname, const char *name, void *fn, size_t fn_size,
                  char *err, size_t cap) {
    void *p = dlsym(lib, name);
    if (!p && !err[0]) snprintf(err, cap, "%s lacks %s", libname, name);
    memset(fn, 0, fn_size);
    memcpy(fn, &p, sizeof p < fn_size ? sizeof p : fn_size);
}

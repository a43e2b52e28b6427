/* Loading a CUDA library on first use (dlopen), the way cuBLAS, cuBLASLt, cuDNN and NCCL are
   loaded: a build made where the toolkit exists still loads and runs on the CPU on a machine
   without them. Errors are written into a caller's buffer once (the first one wins), so that
   a later call can report why the library is unavailable. */
#ifndef MT_DL_LIBRARY_H
#define MT_DL_LIBRARY_H
#include <stdbool.h>
#include <stddef.h>

#define MT_DL_STR_(x) #x
#define MT_DL_STR(x)  MT_DL_STR_(x)

/* The first of names[0 .. n) that loads (RTLD_NOW | RTLD_LOCAL; it stays loaded for the life
   of the process), or NULL with "cannot load names[0]: why" in err. */
void *mt_dl_open(const char *const *names, size_t n, char *err, size_t cap);

/* Copies the address of symbol `name` in lib into the function pointer at fn (fn_size bytes:
   ISO C has no cast from an object pointer to a function pointer, so the bytes are copied).
   A missing symbol leaves NULL there and, when err is still empty, "libname lacks name". */
void mt_dl_symbol(void *lib, const char *libname, const char *name, void *fn, size_t fn_size,
                  char *err, size_t cap);

/* MT_DL_LOAD(lib, "libcudnn", api.create, "cudnnCreate", err) */
#define MT_DL_LOAD(lib, libname, field, name, err)                                                 \
    mt_dl_symbol((lib), (libname), (name), &(field), sizeof(field), (err), sizeof(err))

#endif

/* cuBLAS is loaded on first use (dlopen), not linked: a CPU-only user of a build made where
   the CUDA toolkit exists loads libmixtape with no CUDA library present (cudart is linked
   statically and loads the driver only when a device is asked for). The entry points keep
   their header's exact types through __typeof__. The emulated device links its fake cuBLAS
   into the program, so there the table points at those functions directly. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <threads.h>
#include "cuda_impl.h"

#define MT_STR_(x) #x
#define MT_STR(x)  MT_STR_(x)

static mt_cublas_api api;
static const char *load_error; /* NULL once loaded */
static once_flag load_once = ONCE_FLAG_INIT;

#if defined(MT_CUDA_EMU)
static void load(void) {
    api.create = cublasCreate_v2;
    api.destroy = cublasDestroy_v2;
    api.set_stream = cublasSetStream_v2;
    api.gemm_ex = cublasGemmEx;
    api.gemm_strided_batched_ex = cublasGemmStridedBatchedEx;
    api.status_name = cublasGetStatusName;
    api.status_string = cublasGetStatusString;
    api.lt_create = cublasLtCreate;
    api.lt_destroy = cublasLtDestroy;
    api.lt_desc_create = cublasLtMatmulDescCreate;
    api.lt_desc_destroy = cublasLtMatmulDescDestroy;
    api.lt_desc_set = cublasLtMatmulDescSetAttribute;
    api.lt_layout_create = cublasLtMatrixLayoutCreate;
    api.lt_layout_destroy = cublasLtMatrixLayoutDestroy;
    api.lt_matmul = cublasLtMatmul;
}
#else
static char load_error_buf[256];

static void *symbol(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p && !load_error) {
        snprintf(load_error_buf, sizeof load_error_buf, "%s lacks %s",
                 strncmp(name, "cublasLt", 8) == 0 ? "libcublasLt" : "libcublas", name);
        load_error = load_error_buf;
    }
    return p;
}

static void load(void) {
    static const char *const names[] = {"libcublas.so." MT_STR(CUBLAS_VER_MAJOR), "libcublas.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_error_buf, sizeof load_error_buf, "cannot load %s: %s", names[0],
                 why ? why : "not found");
        load_error = load_error_buf;
        return;
    }
    /* object-to-function pointer conversion through memcpy: ISO C has no cast for it */
#define MT_LOAD(field, name)                                                                       \
    do {                                                                                           \
        void *p = symbol(lib, name);                                                               \
        memcpy(&api.field, &p, sizeof p);                                                          \
    } while (0)
    MT_LOAD(create, "cublasCreate_v2");
    MT_LOAD(destroy, "cublasDestroy_v2");
    MT_LOAD(set_stream, "cublasSetStream_v2");
    MT_LOAD(gemm_ex, "cublasGemmEx");
    MT_LOAD(gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
    MT_LOAD(status_name, "cublasGetStatusName");
    MT_LOAD(status_string, "cublasGetStatusString");
    /* libcublas depends on libcublasLt, so it is there whenever cuBLAS is */
    static const char *const lt_names[] = {"libcublasLt.so." MT_STR(CUBLAS_VER_MAJOR),
                                           "libcublasLt.so"};
    lib = NULL;
    for (size_t i = 0; i < sizeof lt_names / sizeof *lt_names && !lib; i++)
        lib = dlopen(lt_names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_error_buf, sizeof load_error_buf, "cannot load %s: %s", lt_names[0],
                 why ? why : "not found");
        load_error = load_error_buf;
        return;
    }
    MT_LOAD(lt_create, "cublasLtCreate");
    MT_LOAD(lt_destroy, "cublasLtDestroy");
    MT_LOAD(lt_desc_create, "cublasLtMatmulDescCreate");
    MT_LOAD(lt_desc_destroy, "cublasLtMatmulDescDestroy");
    MT_LOAD(lt_desc_set, "cublasLtMatmulDescSetAttribute");
    MT_LOAD(lt_layout_create, "cublasLtMatrixLayoutCreate");
    MT_LOAD(lt_layout_destroy, "cublasLtMatrixLayoutDestroy");
    MT_LOAD(lt_matmul, "cublasLtMatmul");
#undef MT_LOAD
    /* the library stays loaded for the life of the process (handles may outlive any caller) */
}
#endif

const mt_cublas_api *mt_cublas_load(const char *op) {
    call_once(&load_once, load);
    if (load_error) {
        mt_error_set(MT_ERR_DEVICE, "%s: cuBLAS is unavailable (%s)", op, load_error);
        return NULL;
    }
    return &api;
}

const mt_cublas_api *mt_cublas(void) {
    return &api;
}

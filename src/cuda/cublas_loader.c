/* cuBLAS is loaded on first use (dlopen), not linked: a CPU-only user of a build made where
   the CUDA toolkit exists loads libmixtape with no CUDA library present (cudart is linked
   statically and loads the driver only when a device is asked for). The entry points keep
   their header's exact types through __typeof__. The emulated device links its fake cuBLAS
   into the program, so there the table points at those functions directly. */
#include <threads.h>
#include "cuda_impl.h"
#include "dl_library.h"

static mt_cublas_api api;
static const char *load_error; /* NULL once loaded */
static once_flag load_once = ONCE_FLAG_INIT;

#if defined(MT_CUDA_EMU)
static void load(void) {
    api.create = cublasCreate_v2;
    api.destroy = cublasDestroy_v2;
    api.set_stream = cublasSetStream_v2;
    api.set_math_mode = cublasSetMathMode;
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
    api.lt_pref_create = cublasLtMatmulPreferenceCreate;
    api.lt_pref_destroy = cublasLtMatmulPreferenceDestroy;
    api.lt_pref_set = cublasLtMatmulPreferenceSetAttribute;
    api.lt_heuristic = cublasLtMatmulAlgoGetHeuristic;
}
#else
static char load_error_buf[256];

static void load(void) {
    static const char *const names[] = {"libcublas.so." MT_DL_STR(CUBLAS_VER_MAJOR),
                                        "libcublas.so"};
    void *lib = mt_dl_open(names, 2, load_error_buf, sizeof load_error_buf);
    if (lib) {
        MT_DL_LOAD(lib, "libcublas", api.create, "cublasCreate_v2", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.destroy, "cublasDestroy_v2", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.set_stream, "cublasSetStream_v2", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.set_math_mode, "cublasSetMathMode", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.gemm_ex, "cublasGemmEx", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.status_name, "cublasGetStatusName", load_error_buf);
        MT_DL_LOAD(lib, "libcublas", api.status_string, "cublasGetStatusString", load_error_buf);
        /* libcublas depends on libcublasLt, so it is there whenever cuBLAS is */
        static const char *const lt_names[] = {"libcublasLt.so." MT_DL_STR(CUBLAS_VER_MAJOR),
                                               "libcublasLt.so"};
        lib = mt_dl_open(lt_names, 2, load_error_buf, sizeof load_error_buf);
    }
    if (lib) {
        MT_DL_LOAD(lib, "libcublasLt", api.lt_create, "cublasLtCreate", load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_destroy, "cublasLtDestroy", load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_desc_create, "cublasLtMatmulDescCreate",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_desc_destroy, "cublasLtMatmulDescDestroy",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_desc_set, "cublasLtMatmulDescSetAttribute",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_layout_create, "cublasLtMatrixLayoutCreate",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_layout_destroy, "cublasLtMatrixLayoutDestroy",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_matmul, "cublasLtMatmul", load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_pref_create, "cublasLtMatmulPreferenceCreate",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_pref_destroy, "cublasLtMatmulPreferenceDestroy",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_pref_set, "cublasLtMatmulPreferenceSetAttribute",
                   load_error_buf);
        MT_DL_LOAD(lib, "libcublasLt", api.lt_heuristic, "cublasLtMatmulAlgoGetHeuristic",
                   load_error_buf);
    }
    if (load_error_buf[0]) load_error = load_error_buf;
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

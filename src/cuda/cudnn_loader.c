/* cuDNN is loaded on first use (dlopen), not linked, like cuBLAS (cublas_loader.c): a program
   that never convolves on a GPU never needs the library, and a machine without it still runs
   everything else; a convolution there fails with MT_ERR_UNSUPPORTED saying cuDNN is missing.
   The entry points keep the header's exact types through __typeof__. The emulated device links
   its fake cuDNN (test/cuda_emu/fake_cudnn.cpp) into the program, so there the table points at
   those functions directly. */
#include <threads.h>
#include "cudnn_impl.h"
#include "dl_library.h"

static mt_cudnn_api api;
static const char *load_error; /* NULL once loaded */
static once_flag load_once = ONCE_FLAG_INIT;

/* The table, entry by entry: F(field, symbol). */
#define MT_CUDNN_ENTRIES(F)                                                                        \
    F(create, cudnnCreate)                                                                         \
    F(destroy, cudnnDestroy)                                                                       \
    F(set_stream, cudnnSetStream)                                                                  \
    F(error_string, cudnnGetErrorString)                                                           \
    F(create_tensor, cudnnCreateTensorDescriptor)                                                  \
    F(destroy_tensor, cudnnDestroyTensorDescriptor)                                                \
    F(set_tensor_nd, cudnnSetTensorNdDescriptor)                                                   \
    F(create_filter, cudnnCreateFilterDescriptor)                                                  \
    F(destroy_filter, cudnnDestroyFilterDescriptor)                                                \
    F(set_filter_4d, cudnnSetFilter4dDescriptor)                                                   \
    F(create_conv, cudnnCreateConvolutionDescriptor)                                               \
    F(destroy_conv, cudnnDestroyConvolutionDescriptor)                                             \
    F(set_conv_2d, cudnnSetConvolution2dDescriptor)                                                \
    F(set_conv_groups, cudnnSetConvolutionGroupCount)                                              \
    F(set_conv_math, cudnnSetConvolutionMathType)                                                  \
    F(fwd_algo_v7, cudnnGetConvolutionForwardAlgorithm_v7)                                         \
    F(bwd_data_algo_v7, cudnnGetConvolutionBackwardDataAlgorithm_v7)                               \
    F(bwd_filter_algo_v7, cudnnGetConvolutionBackwardFilterAlgorithm_v7)                           \
    F(fwd_find, cudnnFindConvolutionForwardAlgorithmEx)                                            \
    F(bwd_data_find, cudnnFindConvolutionBackwardDataAlgorithmEx)                                  \
    F(bwd_filter_find, cudnnFindConvolutionBackwardFilterAlgorithmEx)                              \
    F(fwd_workspace, cudnnGetConvolutionForwardWorkspaceSize)                                      \
    F(bwd_data_workspace, cudnnGetConvolutionBackwardDataWorkspaceSize)                            \
    F(bwd_filter_workspace, cudnnGetConvolutionBackwardFilterWorkspaceSize)                        \
    F(conv_fwd, cudnnConvolutionForward)                                                           \
    F(conv_bwd_data, cudnnConvolutionBackwardData)                                                 \
    F(conv_bwd_filter, cudnnConvolutionBackwardFilter)                                             \
    F(create_pool, cudnnCreatePoolingDescriptor)                                                   \
    F(destroy_pool, cudnnDestroyPoolingDescriptor)                                                 \
    F(set_pool_2d, cudnnSetPooling2dDescriptor)                                                    \
    F(pool_fwd, cudnnPoolingForward)                                                               \
    F(bn_fwd_train, cudnnBatchNormalizationForwardTraining)                                        \
    F(bn_bwd, cudnnBatchNormalizationBackward)                                                     \
    F(bn_fwd_infer, cudnnBatchNormalizationForwardInference)                                       \
    F(create_act, cudnnCreateActivationDescriptor)                                                 \
    F(destroy_act, cudnnDestroyActivationDescriptor)                                               \
    F(set_act, cudnnSetActivationDescriptor)                                                       \
    F(bn_fwd_ex_workspace, cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize)               \
    F(bn_bwd_ex_workspace, cudnnGetBatchNormalizationBackwardExWorkspaceSize)                      \
    F(bn_ex_reserve, cudnnGetBatchNormalizationTrainingExReserveSpaceSize)                         \
    F(bn_fwd_train_ex, cudnnBatchNormalizationForwardTrainingEx)                                   \
    F(bn_bwd_ex, cudnnBatchNormalizationBackwardEx)

#if defined(MT_CUDA_EMU)
static void load(void) {
#define MT_DIRECT(field, sym) api.field = sym;
    MT_CUDNN_ENTRIES(MT_DIRECT)
#undef MT_DIRECT
}
#else
static char load_error_buf[256];

static void load(void) {
    static const char *const names[] = {"libcudnn.so." MT_DL_STR(CUDNN_MAJOR), "libcudnn.so"};
    void *lib = mt_dl_open(names, 2, load_error_buf, sizeof load_error_buf);
    if (lib) {
#define MT_LOAD(field, sym) MT_DL_LOAD(lib, "libcudnn", api.field, #sym, load_error_buf);
        MT_CUDNN_ENTRIES(MT_LOAD)
#undef MT_LOAD
    }
    if (load_error_buf[0]) load_error = load_error_buf;
}
#endif

const mt_cudnn_api *mt_cudnn_load(const char *op, int device) {
    call_once(&load_once, load);
    if (load_error) {
        mt_error_set(MT_ERR_UNSUPPORTED, "%s: cuDNN not found, needed on cuda:%d (%s)", op, device,
                     load_error);
        return NULL;
    }
    return &api;
}

bool mt_cudnn_available(void) {
    call_once(&load_once, load);
    return load_error == NULL;
}

int mt_cudnn_check(const char *op, const char *what, cudnnStatus_t s) {
    if (s == CUDNN_STATUS_SUCCESS) return 0;
    int family = (int)s / 1000 * 1000; /* cuDNN 9 codes refine a family: 3002 is a 3000 */
    mt_status st = family == CUDNN_STATUS_NOT_SUPPORTED ? MT_ERR_UNSUPPORTED
                   : s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                           s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                       ? MT_ERR_OOM
                       : MT_ERR_DEVICE;
    const char *msg = api.error_string ? api.error_string(s) : NULL;
    return mt_error_set(st, "%s: cuDNN error in %s: %s (status %d)", op, what,
                        msg ? msg : "unknown status", (int)s);
}

/* cuDNN in the CUDA backend: the entry points (loaded on first use, cudnn_loader.c), the
   per-device cuDNN state (a handle bound to the device's stream and the convolution algorithm
   cache, cudnn_state.c) and the convolution families (conv_cudnn.c). The legacy descriptor API
   of cuDNN 9: tensors described with explicit strides, so NCHW and channels-last alike. */
#ifndef MT_CUDNN_IMPL_H
#define MT_CUDNN_IMPL_H
#include <cudnn.h>
#include "cuda_impl.h"

typedef struct {
    __typeof__(&cudnnCreate) create;
    __typeof__(&cudnnDestroy) destroy;
    __typeof__(&cudnnSetStream) set_stream;
    __typeof__(&cudnnGetErrorString) error_string;
    __typeof__(&cudnnCreateTensorDescriptor) create_tensor;
    __typeof__(&cudnnDestroyTensorDescriptor) destroy_tensor;
    __typeof__(&cudnnSetTensorNdDescriptor) set_tensor_nd;
    __typeof__(&cudnnCreateFilterDescriptor) create_filter;
    __typeof__(&cudnnDestroyFilterDescriptor) destroy_filter;
    __typeof__(&cudnnSetFilter4dDescriptor) set_filter_4d;
    __typeof__(&cudnnCreateConvolutionDescriptor) create_conv;
    __typeof__(&cudnnDestroyConvolutionDescriptor) destroy_conv;
    __typeof__(&cudnnSetConvolution2dDescriptor) set_conv_2d;
    __typeof__(&cudnnSetConvolutionGroupCount) set_conv_groups;
    __typeof__(&cudnnSetConvolutionMathType) set_conv_math;
    __typeof__(&cudnnGetConvolutionForwardAlgorithm_v7) fwd_algo_v7;
    __typeof__(&cudnnGetConvolutionBackwardDataAlgorithm_v7) bwd_data_algo_v7;
    __typeof__(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) bwd_filter_algo_v7;
    __typeof__(&cudnnFindConvolutionForwardAlgorithmEx) fwd_find;
    __typeof__(&cudnnFindConvolutionBackwardDataAlgorithmEx) bwd_data_find;
    __typeof__(&cudnnFindConvolutionBackwardFilterAlgorithmEx) bwd_filter_find;
    __typeof__(&cudnnGetConvolutionForwardWorkspaceSize) fwd_workspace;
    __typeof__(&cudnnGetConvolutionBackwardDataWorkspaceSize) bwd_data_workspace;
    __typeof__(&cudnnGetConvolutionBackwardFilterWorkspaceSize) bwd_filter_workspace;
    __typeof__(&cudnnConvolutionForward) conv_fwd;
    __typeof__(&cudnnConvolutionBackwardData) conv_bwd_data;
    __typeof__(&cudnnConvolutionBackwardFilter) conv_bwd_filter;
    __typeof__(&cudnnCreatePoolingDescriptor) create_pool;
    __typeof__(&cudnnDestroyPoolingDescriptor) destroy_pool;
    __typeof__(&cudnnSetPooling2dDescriptor) set_pool_2d;
    __typeof__(&cudnnPoolingForward) pool_fwd;
    __typeof__(&cudnnBatchNormalizationForwardTraining) bn_fwd_train;
    __typeof__(&cudnnBatchNormalizationBackward) bn_bwd;
} mt_cudnn_api;

/* Loads cuDNN once; NULL with MT_ERR_UNSUPPORTED naming op and device ("cuDNN not found")
   when the library or one of its entry points is missing. A CPU-only program never gets here. */
const mt_cudnn_api *mt_cudnn_load(const char *op, int device);

/* True when cuDNN can be loaded (sets no error): where an own kernel can stand in. */
bool mt_cudnn_available(void);

/* Maps a cuDNN status to an mt error naming op, what was called and cuDNN's message: 0 for
   success, MT_ERR_UNSUPPORTED for the NOT_SUPPORTED family, MT_ERR_OOM for allocation
   failures, MT_ERR_DEVICE otherwise. */
int mt_cudnn_check(const char *op, const char *what, cudnnStatus_t s);

/* A convolution algorithm choice, cached per problem. */
typedef enum { MT_CUDNN_FWD, MT_CUDNN_BWD_DATA, MT_CUDNN_BWD_FILTER } mt_cudnn_conv_kind;
typedef struct {
    int kind, dtype, channels_last, math; /* math: the cudnnMathType_t asked for */
    int64_t x[4], w[4], y[4];
    mt_conv2d_params p;
} mt_cudnn_conv_key; /* zeroed before filling: compared byte for byte */
typedef struct {
    int algo;             /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    cudnnMathType_t math; /* the math type the algorithm was chosen with */
    size_t workspace;     /* bytes */
} mt_cudnn_conv_algo;

/* The device's cuDNN handle (made on first use, bound to the device's stream); NULL with the
   error set. */
cudnnHandle_t mt_cudnn_handle(const char *op, mt_cuda_device_ctx *c);
/* The cached choice for key; false when none yet. */
bool mt_cudnn_algo_lookup(mt_cuda_device_ctx *c, const mt_cudnn_conv_key *key,
                          mt_cudnn_conv_algo *out);
/* Remembers a choice (a failure to remember only costs a new search later). */
void mt_cudnn_algo_store(mt_cuda_device_ctx *c, const mt_cudnn_conv_key *key,
                         const mt_cudnn_conv_algo *a);
/* Frees the device's cuDNN state (cuda_context.c's teardown). */
void mt_cudnn_state_free(mt_cudnn_state *s);

/* ---- the convolution families of the backend table (conv_cudnn.c) */
int mt_cuda_conv2d(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                   const mt_conv2d_params *p);
int mt_cuda_conv2d_backward_data(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                 const mt_conv2d_params *p);
int mt_cuda_conv2d_backward_weight(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                   const mt_conv2d_params *p);

/* ---- pooling forward (pool_cudnn.c) */
/* True when cuDNN computes this pooling exactly as torch: max and average windows whose
   output size is cuDNN's floor formula (no ceil_mode overhang, so the count_include_pad
   divisor is the whole kernel), and adaptive pooling with evenly dividing windows. */
bool mt_cudnn_pool_expressible(const mt_tensor *x, const mt_tensor *y, const mt_pool2d_params *p);
int mt_cudnn_pool2d(const char *op, mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p);

/* ---- batch norm in training (bn_cudnn.c): the plain batch norm (no residual, no ReLU) in
   training mode, forward and backward, through cuDNN's spatial batch norm; cuda_norm.c's own
   kernels run the rest (eval, the fused residual + ReLU). */
bool mt_cudnn_bn_applies(const mt_bn_args *a);
int mt_cudnn_batch_norm(const mt_bn_args *a);
bool mt_cudnn_bn_backward_applies(const mt_bn_backward_args *a);
int mt_cudnn_batch_norm_backward(const mt_bn_backward_args *a);
#endif

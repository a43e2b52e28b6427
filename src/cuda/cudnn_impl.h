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
    __typeof__(&cudnnBatchNormalizationForwardInference) bn_fwd_infer;
    __typeof__(&cudnnCreateActivationDescriptor) create_act;
    __typeof__(&cudnnDestroyActivationDescriptor) destroy_act;
    __typeof__(&cudnnSetActivationDescriptor) set_act;
    __typeof__(&cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize) bn_fwd_ex_workspace;
    __typeof__(&cudnnGetBatchNormalizationBackwardExWorkspaceSize) bn_bwd_ex_workspace;
    __typeof__(&cudnnGetBatchNormalizationTrainingExReserveSpaceSize) bn_ex_reserve;
    __typeof__(&cudnnBatchNormalizationForwardTrainingEx) bn_fwd_train_ex;
    __typeof__(&cudnnBatchNormalizationBackwardEx) bn_bwd_ex;
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

/* ---- batch norm through cuDNN. bn_cudnn.c: the plain batch norm (no residual, no ReLU)
   in training on F16 where the Ex calls do not take it, forward and backward
   (cudnnBatchNormalization{ForwardTraining,Backward}, spatial; F32 and F64 training run on the
   own kernels, whose statistics are the more exact), and in eval
   (cudnnBatchNormalizationForwardInference). bn_cudnn_ex.c: training on NHWC F16 with C a
   multiple of 4 (the Ex entry points, persistent spatial mode): the fused
   relu(bn(x) [+ residual]) and the plain bn(x) (bnOps BN), the reserve space kept in the
   tape node. cuda_norm.c's own kernels run the rest. */
bool mt_cudnn_bn_applies(const mt_bn_args *a);
int mt_cudnn_batch_norm(const mt_bn_args *a);
bool mt_cudnn_bn_backward_applies(const mt_bn_backward_args *a);
int mt_cudnn_batch_norm_backward(const mt_bn_backward_args *a);
bool mt_cudnn_bn_eval_applies(const mt_bn_args *a);
int mt_cudnn_batch_norm_eval(const mt_bn_args *a);
bool mt_cudnn_bn_ex_applies(const mt_bn_args *a);
/* On success a->state receives the reserve space (and epsilon) for the backward. Returns
   MT_CUDNN_BN_EX_DECLINED (no error set, nothing changed) where cuDNN's size queries say
   NOT_SUPPORTED for this configuration: the own kernels run it instead. */
#define MT_CUDNN_BN_EX_DECLINED 1
int mt_cudnn_batch_norm_ex(const mt_bn_args *a);
/* The backward of a forward that ran mt_cudnn_batch_norm_ex (a->state is its state): gy,
   and the gradients wanted, in x's dtype and layout (y saved under the ReLU only). */
bool mt_cudnn_bn_ex_backward_applies(const mt_bn_backward_args *a);
int mt_cudnn_batch_norm_ex_backward(const mt_bn_backward_args *a);

/* What the batch norm calls share: the descriptors of x ([N, C, S, 1], NCHW or NHWC
   strides) and of the parameters ([1, C, 1, 1] of the parameters' dtype), the handle and the
   temporaries standing in for absent parameters or unwanted results. */
typedef struct {
    const mt_cudnn_api *api;
    mt_cuda_device_ctx *ctx;
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, p;
    mt_dtype pdt; /* the parameters' dtype */
    mt_device dev;
    int64_t c;
    mt_tensor *tmp[6];
} mt_cudnn_bn_call;
/* True when x fits cuDNN's batch norm: [N, C, ...] with every count > 0, at most INT_MAX
   elements, contiguous or dense NHWC, and a batch N its spatial kernels take: at most 880,801
   in training, 65,535 in inference (the bounds within which PyTorch uses them; larger batches
   run on the own kernels). */
bool mt_cudnn_bn_fits(const mt_tensor *x, bool training);
int mt_cudnn_bn_begin(const char *op, mt_cudnn_bn_call *b, const mt_tensor *x, mt_dtype pdt);
void mt_cudnn_bn_end(mt_cudnn_bn_call *b);
/* t's data, or a temporary [C] of the parameters' dtype filled with fill (NAN: left
   uninitialised, for results nobody reads) held in slot i; NULL with *rc set on failure (a
   no-op once *rc is set). */
void *mt_cudnn_bn_param(const char *op, mt_cudnn_bn_call *b, const mt_tensor *t, int i, double fill,
                        int *rc);
/* t's data, or a temporary of x's shape, dtype and layout (uninitialised) in slot i. */
void *mt_cudnn_bn_activation(const char *op, mt_cudnn_bn_call *b, const mt_tensor *t,
                             const mt_tensor *x, int i, int *rc);
cudnnDataType_t mt_cudnn_dtype(mt_dtype dt);
/* dense channels-last 4-d activations (cuda_norm.c) */
bool mt_cuda_bn_nhwc(const mt_tensor *x);
#endif

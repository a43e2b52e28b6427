// Self-test of the fake cuDNN (fake_cudnn.cpp): a small convolution computed in each
// direction against loops written here, the TF32 rounding of FLOAT data without FMA math, a
// pooling forward, and the argument checks that make a wrong call fail as cuDNN would
// (wrong dtype combinations, bad strides and sizes, a workspace too small, NULL or host
// pointers, destroyed descriptors), and batch norm's statistics and descriptor checks.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" { // cmocka 1.1's header declares C functions without it
#include <cmocka.h>
}

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#define CHECK(call) assert_int_equal((call), CUDNN_STATUS_SUCCESS)

namespace {

// x [1, 2, 4, 4], w [3, 2, 3, 3], pad 1: y [1, 3, 4, 4], all NCHW packed FLOAT.
struct problem {
    cudnnHandle_t h = nullptr;
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    float *dx = nullptr, *dw = nullptr, *dy = nullptr;
    std::vector<float> hx, hw;
};

void set_packed(cudnnTensorDescriptor_t d, cudnnDataType_t dt, int n, int c, int h, int w) {
    int dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1};
    CHECK(cudnnSetTensorNdDescriptor(d, dt, 4, dims, strides));
}

void setup(problem *p, cudnnMathType_t math) {
    CHECK(cudnnCreate(&p->h));
    CHECK(cudnnCreateTensorDescriptor(&p->x));
    CHECK(cudnnCreateTensorDescriptor(&p->y));
    CHECK(cudnnCreateFilterDescriptor(&p->w));
    CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
    set_packed(p->x, CUDNN_DATA_FLOAT, 1, 2, 4, 4);
    set_packed(p->y, CUDNN_DATA_FLOAT, 1, 3, 4, 4);
    CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 3, 2, 3, 3));
    CHECK(cudnnSetConvolution2dDescriptor(p->conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT));
    CHECK(cudnnSetConvolutionMathType(p->conv, math));
    p->hx.resize(32);
    p->hw.resize(54);
    for (size_t i = 0; i < p->hx.size(); i++) p->hx[i] = 1.0f + 0.001f * (float)i;
    for (size_t i = 0; i < p->hw.size(); i++) p->hw[i] = (float)((int)i % 7 - 3) * 0.25f;
    assert_int_equal(cudaMalloc((void **)&p->dx, 32 * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p->dw, 54 * 4), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&p->dy, 48 * 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(p->dx, p->hx.data(), 32 * 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(p->dw, p->hw.data(), 54 * 4, cudaMemcpyHostToDevice), cudaSuccess);
}

void teardown(problem *p) {
    CHECK(cudnnDestroyTensorDescriptor(p->x));
    CHECK(cudnnDestroyTensorDescriptor(p->y));
    CHECK(cudnnDestroyFilterDescriptor(p->w));
    CHECK(cudnnDestroyConvolutionDescriptor(p->conv));
    CHECK(cudnnDestroy(p->h));
    cudaFree(p->dx);
    cudaFree(p->dw);
    cudaFree(p->dy);
}

double ref_y(const problem &p, int k, int oh, int ow, bool tf32) {
    auto r = [tf32](float v) {
        if (!tf32) return (double)v;
        uint32_t u;
        std::memcpy(&u, &v, 4);
        u += 0xfffu + ((u >> 13) & 1u);
        u &= ~0x1fffu;
        float f;
        std::memcpy(&f, &u, 4);
        return (double)f;
    };
    double s = 0;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                int ih = oh - 1 + i, iw = ow - 1 + j;
                if (ih < 0 || ih >= 4 || iw < 0 || iw >= 4) continue;
                s += r(p.hx[(c * 4 + ih) * 4 + iw]) * r(p.hw[((k * 2 + c) * 3 + i) * 3 + j]);
            }
    return s;
}

void forward(problem &p, size_t *ws_bytes, void **ws) {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int n = 0;
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(p.h, p.x, p.w, p.conv, p.y, 8, &n, perf));
    assert_true(n >= 1);
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(p.h, p.x, p.w, p.conv, p.y, perf[0].algo,
                                                  ws_bytes));
    *ws = nullptr;
    if (*ws_bytes) assert_int_equal(cudaMalloc(ws, *ws_bytes), cudaSuccess);
    const float one = 1, zero = 0;
    CHECK(cudnnConvolutionForward(p.h, &one, p.x, p.dx, p.w, p.dw, p.conv, perf[0].algo, *ws,
                                  *ws_bytes, &zero, p.y, p.dy));
}

void check_forward(cudnnMathType_t math, bool tf32) {
    problem p;
    setup(&p, math);
    size_t wsb;
    void *ws;
    forward(p, &wsb, &ws);
    assert_true(wsb > 0); // the first choice needs a workspace: the path is exercised
    std::vector<float> y(48);
    assert_int_equal(cudaMemcpy(y.data(), p.dy, 48 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                assert_true(std::fabs(y[(k * 4 + i) * 4 + j] - ref_y(p, k, i, j, tf32)) < 1e-5);
    cudaFree(ws);
    teardown(&p);
}

void test_forward_fma(void **) {
    check_forward(CUDNN_FMA_MATH, false);
}

// FLOAT data with tensor-op math reads TF32 inputs: the FMA reference is off by far more
// than FP32 rounding, the TF32 one is not.
void test_forward_tf32(void **) {
    check_forward(CUDNN_DEFAULT_MATH, true);
    problem p;
    setup(&p, CUDNN_DEFAULT_MATH);
    size_t wsb;
    void *ws;
    forward(p, &wsb, &ws);
    std::vector<float> y(48);
    assert_int_equal(cudaMemcpy(y.data(), p.dy, 48 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double worst = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                worst =
                    std::fmax(worst, std::fabs(y[(k * 4 + i) * 4 + j] - ref_y(p, k, i, j, false)));
    assert_true(worst > 1e-4);
    cudaFree(ws);
    teardown(&p);
}

// Backward data and filter against the adjoint loops, with a cotangent of ones.
void test_backward(void **) {
    problem p;
    setup(&p, CUDNN_FMA_MATH);
    std::vector<float> ones(48, 1.0f);
    assert_int_equal(cudaMemcpy(p.dy, ones.data(), 48 * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const float one = 1, zero = 0;
    size_t wsb = 0;
    CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(p.h, p.w, p.y, p.conv, p.x,
                                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, &wsb));
    assert_int_equal(wsb, 0);
    CHECK(cudnnConvolutionBackwardData(p.h, &one, p.w, p.dw, p.y, p.dy, p.conv,
                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &zero, p.x,
                                       p.dx));
    CHECK(cudnnConvolutionBackwardFilter(p.h, &one, p.x, p.dx, p.y, p.dy, p.conv,
                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0, &zero,
                                         p.w, p.dw));
    std::vector<float> gx(32), gw(54);
    assert_int_equal(cudaMemcpy(gx.data(), p.dx, 32 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(gw.data(), p.dw, 54 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    // gx[c, h, w] = sum over k and taps that reach (h, w) of w[k, c, i, j]
    std::vector<double> egx(32, 0.0), egw(54, 0.0);
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    for (int oh = 0; oh < 4; oh++)
                        for (int ow = 0; ow < 4; ow++) {
                            int ih = oh - 1 + i, iw = ow - 1 + j;
                            if (ih < 0 || ih >= 4 || iw < 0 || iw >= 4) continue;
                            egx[(c * 4 + ih) * 4 + iw] += p.hw[((k * 2 + c) * 3 + i) * 3 + j];
                        }
    for (int i = 0; i < 32; i++) assert_true(std::fabs(gx[i] - egx[i]) < 1e-5);
    // the filter gradient reads the gx just written as its x
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    double s = 0;
                    for (int oh = 0; oh < 4; oh++)
                        for (int ow = 0; ow < 4; ow++) {
                            int ih = oh - 1 + i, iw = ow - 1 + j;
                            if (ih >= 0 && ih < 4 && iw >= 0 && iw < 4)
                                s += gx[(c * 4 + ih) * 4 + iw];
                        }
                    assert_true(std::fabs(gw[((k * 2 + c) * 3 + i) * 3 + j] - s) < 1e-4);
                }
    teardown(&p);
}

// Every misuse is refused before anything is queued.
void test_bad_arguments(void **) {
    problem p;
    setup(&p, CUDNN_FMA_MATH);
    const float one = 1, zero = 0;
    const int algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    size_t need = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(p.h, p.x, p.w, p.conv, p.y,
                                                  (cudnnConvolutionFwdAlgo_t)algo, &need));
    assert_true(need > 0);
    void *ws;
    assert_int_equal(cudaMalloc(&ws, need), cudaSuccess);
    auto fwd = [&](cudnnTensorDescriptor_t x, const void *xp, void *w_s, size_t wsb) {
        return cudnnConvolutionForward(p.h, &one, x, xp, p.w, p.dw, p.conv,
                                       (cudnnConvolutionFwdAlgo_t)algo, w_s, wsb, &zero, p.y, p.dy);
    };
    CHECK(fwd(p.x, p.dx, ws, need));
    // a workspace too small, or not device memory
    assert_int_equal(fwd(p.x, p.dx, ws, need - 1), CUDNN_STATUS_BAD_PARAM);
    std::vector<char> host(need);
    assert_int_equal(fwd(p.x, p.dx, host.data(), need), CUDNN_STATUS_BAD_PARAM);
    // NULL and host data pointers
    assert_int_equal(fwd(p.x, nullptr, ws, need), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
    assert_int_equal(fwd(p.x, p.hx.data(), ws, need), CUDNN_STATUS_BAD_PARAM);
    // a wrong dtype combination: HALF x with FLOAT filter and y
    cudnnTensorDescriptor_t hx;
    CHECK(cudnnCreateTensorDescriptor(&hx));
    set_packed(hx, CUDNN_DATA_HALF, 1, 2, 4, 4);
    assert_int_equal(fwd(hx, p.dx, ws, need), CUDNN_STATUS_BAD_PARAM);
    // FLOAT data with a DOUBLE compute type is refused at the call
    cudnnConvolutionDescriptor_t c64;
    CHECK(cudnnCreateConvolutionDescriptor(&c64));
    CHECK(cudnnSetConvolution2dDescriptor(c64, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_DOUBLE));
    assert_int_equal(cudnnConvolutionForward(p.h, &one, p.x, p.dx, p.w, p.dw, c64,
                                             (cudnnConvolutionFwdAlgo_t)algo, ws, need, &zero, p.y,
                                             p.dy),
                     CUDNN_STATUS_BAD_PARAM);
    // bad strides and sizes
    int dims[4] = {1, 2, 4, 4}, bad[4] = {32, 16, 0, 1}, zero_dim[4] = {1, 0, 4, 4},
        strides[4] = {32, 16, 4, 1};
    assert_int_equal(cudnnSetTensorNdDescriptor(hx, CUDNN_DATA_FLOAT, 4, dims, bad),
                     CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(cudnnSetTensorNdDescriptor(hx, CUDNN_DATA_FLOAT, 4, zero_dim, strides),
                     CUDNN_STATUS_BAD_PARAM);
    // strided (not packed) x: not emulated, refused
    int gaps[4] = {64, 32, 8, 2};
    CHECK(cudnnSetTensorNdDescriptor(hx, CUDNN_DATA_FLOAT, 4, dims, gaps));
    assert_int_equal(fwd(hx, p.dx, ws, need), CUDNN_STATUS_NOT_SUPPORTED);
    // y of the wrong size for the geometry
    set_packed(hx, CUDNN_DATA_FLOAT, 1, 3, 5, 4);
    assert_int_equal(cudnnConvolutionForward(p.h, &one, p.x, p.dx, p.w, p.dw, p.conv,
                                             (cudnnConvolutionFwdAlgo_t)algo, ws, need, &zero, hx,
                                             p.dy),
                     CUDNN_STATUS_BAD_PARAM);
    // groups that do not divide the channels; an out-of-range algorithm
    CHECK(cudnnSetConvolutionGroupCount(p.conv, 2));
    assert_int_equal(fwd(p.x, p.dx, ws, need), CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolutionGroupCount(p.conv, 1));
    assert_int_equal(cudnnConvolutionForward(p.h, &one, p.x, p.dx, p.w, p.dw, p.conv,
                                             (cudnnConvolutionFwdAlgo_t)99, ws, need, &zero, p.y,
                                             p.dy),
                     CUDNN_STATUS_BAD_PARAM);
    // fault injection reaches every convolution entry point, the Find calls and size queries too
    cudnnConvolutionFwdAlgoPerf_t perf[4];
    int found = 0;
    size_t size = 0;
    setenv("MTEMU_CUDNN_FAIL", "cudnnFindConvolutionForwardAlgorithmEx=3000", 1);
    assert_int_equal(cudnnFindConvolutionForwardAlgorithmEx(p.h, p.x, p.dx, p.w, p.dw, p.conv, p.y,
                                                            p.dy, 4, &found, perf, ws, need),
                     CUDNN_STATUS_NOT_SUPPORTED);
    setenv("MTEMU_CUDNN_FAIL", "cudnnGetConvolutionBackwardFilterWorkspaceSize=4000", 1);
    assert_int_equal(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                         p.h, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, &size),
                     CUDNN_STATUS_INTERNAL_ERROR);
    unsetenv("MTEMU_CUDNN_FAIL");
    // a destroyed descriptor
    CHECK(cudnnDestroyTensorDescriptor(hx));
    assert_int_equal(fwd(hx, p.dx, ws, need), CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnDestroyConvolutionDescriptor(c64));
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); // the one good call ran
    cudaFree(ws);
    teardown(&p);
}

// cuDNN's pooling: max pads with -inf; INCLUDE_PADDING divides by the whole window.
void test_pooling(void **) {
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h));
    cudnnTensorDescriptor_t x, y;
    cudnnPoolingDescriptor_t pd;
    CHECK(cudnnCreateTensorDescriptor(&x));
    CHECK(cudnnCreateTensorDescriptor(&y));
    CHECK(cudnnCreatePoolingDescriptor(&pd));
    set_packed(x, CUDNN_DATA_FLOAT, 1, 1, 2, 2);
    set_packed(y, CUDNN_DATA_FLOAT, 1, 1, 2, 2);
    float hx[4] = {1, -2, 3, -4}, hy[4];
    float *dx, *dy;
    assert_int_equal(cudaMalloc((void **)&dx, 16), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dy, 16), cudaSuccess);
    assert_int_equal(cudaMemcpy(dx, hx, 16, cudaMemcpyHostToDevice), cudaSuccess);
    const float one = 1, zero = 0;
    CHECK(cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                      CUDNN_PROPAGATE_NAN, 2, 2, 1, 1, 1, 1));
    set_packed(y, CUDNN_DATA_FLOAT, 1, 1, 3, 3);
    // y's extent checked against its allocation: 9 floats do not fit in 4
    assert_int_equal(cudnnPoolingForward(h, pd, &one, x, dx, &zero, y, dy), CUDNN_STATUS_BAD_PARAM);
    float avg[9];
    float *dy9;
    assert_int_equal(cudaMalloc((void **)&dy9, 36), cudaSuccess);
    CHECK(cudnnPoolingForward(h, pd, &one, x, dx, &zero, y, dy9));
    assert_int_equal(cudaMemcpy(avg, dy9, 36, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(avg[0] == 0.25f && avg[4] == -0.5f); // corner: one element / 4; centre: sum / 4
    // a y of the wrong size (ceil-mode sizes are not cuDNN's)
    set_packed(y, CUDNN_DATA_FLOAT, 1, 1, 4, 4);
    assert_int_equal(cudnnPoolingForward(h, pd, &one, x, dx, &zero, y, dy9),
                     CUDNN_STATUS_BAD_PARAM);
    CHECK(
        cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_MAX, CUDNN_PROPAGATE_NAN, 2, 2, 0, 0, 1, 1));
    set_packed(y, CUDNN_DATA_FLOAT, 1, 1, 1, 1);
    CHECK(cudnnPoolingForward(h, pd, &one, x, dx, &zero, y, dy));
    assert_int_equal(cudaMemcpy(hy, dy, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(hy[0] == 3.0f);
    CHECK(cudnnDestroyPoolingDescriptor(pd));
    CHECK(cudnnDestroyTensorDescriptor(x));
    CHECK(cudnnDestroyTensorDescriptor(y));
    CHECK(cudnnDestroy(h));
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dy9);
}

// Batch norm: HALF data with FLOAT parameters computes; a parameter descriptor of the wrong
// type, shape or rank, x not 4-d, half-given running buffers and device-memory blend factors
// are refused; descriptors equal in their nd dims are the same.
void test_batch_norm(void **) {
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h));
    cudnnTensorDescriptor_t x, p;
    CHECK(cudnnCreateTensorDescriptor(&x));
    CHECK(cudnnCreateTensorDescriptor(&p));
    set_packed(x, CUDNN_DATA_HALF, 2, 1, 2, 1); // 4 values of one channel
    set_packed(p, CUDNN_DATA_FLOAT, 1, 1, 1, 1);
    uint16_t hx[4] = {0x3c00, 0x4000, 0x4200, 0x4400}; // 1, 2, 3, 4
    float hw = 2, hb = 1, rm = 0, rv = 1;
    uint16_t *dx, *dy;
    float *dw, *db, *drm, *drv, *dsm, *dsi;
    assert_int_equal(cudaMalloc((void **)&dx, 8), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dy, 8), cudaSuccess);
    float **ps[6] = {&dw, &db, &drm, &drv, &dsm, &dsi};
    for (float **q : ps) assert_int_equal(cudaMalloc((void **)q, 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(dx, hx, 8, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dw, &hw, 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(db, &hb, 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(drm, &rm, 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(drv, &rv, 4, cudaMemcpyHostToDevice), cudaSuccess);
    const float one = 1, zero = 0;
    CHECK(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, dx, x,
                                                 dy, p, dw, db, 0.5, drm, drv, 1e-5, dsm, dsi));
    float got_rm, got_rv, got_sm, got_si;
    assert_int_equal(cudaMemcpy(&got_rm, drm, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(&got_rv, drv, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(&got_sm, dsm, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(&got_si, dsi, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    // mean 2.5, biased var 1.25, unbiased 5/3
    assert_true(std::fabs(got_sm - 2.5f) < 1e-6 && std::fabs(got_rm - 1.25f) < 1e-6);
    assert_true(std::fabs(got_rv - (0.5f + 0.5f * 5.0f / 3.0f)) < 1e-6);
    assert_true(std::fabs(got_si - 1.0f / std::sqrt(1.25f + 1e-5f)) < 1e-5);
    // the parameters of HALF data are FLOAT, not HALF
    cudnnTensorDescriptor_t bad;
    CHECK(cudnnCreateTensorDescriptor(&bad));
    set_packed(bad, CUDNN_DATA_HALF, 1, 1, 1, 1);
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            x, dx, x, dy, bad, dw, db, 0.5, drm,
                                                            drv, 1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    set_packed(bad, CUDNN_DATA_FLOAT, 1, 2, 1, 1); // two channels for x's one
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            x, dx, x, dy, bad, dw, db, 0.5, drm,
                                                            drv, 1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    // a running mean without its variance; blend factors in device memory
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            x, dx, x, dy, p, dw, db, 0.5, drm,
                                                            nullptr, 1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, dw, &zero,
                                                            x, dx, x, dy, p, dw, db, 0.5, drm, drv,
                                                            1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    // as cuDNN documents: BAD_PARAM for a 3-d x and for a 3-d parameter descriptor
    int dims3[3] = {2, 1, 2}, strides3[3] = {2, 2, 1}, pdims3[3] = {1, 1, 1};
    CHECK(cudnnSetTensorNdDescriptor(bad, CUDNN_DATA_HALF, 3, dims3, strides3));
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            bad, dx, bad, dy, p, dw, db, 0.5, drm,
                                                            drv, 1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetTensorNdDescriptor(bad, CUDNN_DATA_FLOAT, 3, pdims3, pdims3));
    assert_int_equal(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            x, dx, x, dy, bad, dw, db, 0.5, drm,
                                                            drv, 1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    // a descriptor set 5-d, then as x: the same as x (its stale fifth dim does not count)
    int dims5[5] = {2, 1, 2, 1, 3}, strides5[5] = {6, 6, 3, 3, 1};
    CHECK(cudnnSetTensorNdDescriptor(bad, CUDNN_DATA_HALF, 5, dims5, strides5));
    set_packed(bad, CUDNN_DATA_HALF, 2, 1, 2, 1);
    CHECK(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bad, dx,
                                                 x, dy, p, dw, db, 0.5, drm, drv, 1e-5, dsm, dsi));
    // the backward: dx of a HALF x described as FLOAT is refused
    set_packed(bad, CUDNN_DATA_FLOAT, 2, 1, 2, 1);
    assert_int_equal(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one,
                                                     &zero, x, dx, x, dy, bad, dy, p, dw, db, dsm,
                                                     1e-5, dsm, dsi),
                     CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnDestroyTensorDescriptor(bad));
    CHECK(cudnnDestroyTensorDescriptor(x));
    CHECK(cudnnDestroyTensorDescriptor(p));
    CHECK(cudnnDestroy(h));
    cudaFree(dx);
    cudaFree(dy);
    for (float **q : ps) cudaFree(*q);
}

} // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_fma), cmocka_unit_test(test_forward_tf32),
        cmocka_unit_test(test_backward),    cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_pooling),     cmocka_unit_test(test_batch_norm),
    };
    unsetenv("MTEMU_CUDNN_FAIL");
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

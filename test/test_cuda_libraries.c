/* The real CUDA libraries load through the dlopen loaders with every entry point the backend
   names (a misspelt symbol would otherwise show only on a GPU machine). Built where the CUDA
   backend is compiled against the real toolkit; needs no GPU, only the libraries. cuBLAS and
   cuBLASLt come with nvcc's toolkit, so their absence fails; cuDNN and NCCL are separate
   packages, so where they are missing their cases are reported skipped with the reason. */
#include "test_util.h"
#include "../src/cuda/cuda_impl.h"
#include "../src/cuda/cudnn_impl.h"
#include "../src/dist/dist_impl.h"

static void test_cublas_loads(void **state) {
    (void)state;
    const mt_cublas_api *api = mt_cublas_load("test");
    if (!api) fail_msg("%s", mt_last_error());
    assert_non_null(api->gemm_strided_batched_ex);
    assert_non_null(api->lt_matmul);
}

static void test_cudnn_loads(void **state) {
    (void)state;
    const mt_cudnn_api *api = mt_cudnn_load("test", 0);
    if (!api) fail_msg("%s", mt_last_error());
    assert_non_null(api->conv_fwd);
    assert_non_null(api->bn_bwd);
    assert_non_null(api->bn_fwd_infer);
    assert_non_null(api->bn_fwd_train_ex);
    assert_non_null(api->bn_bwd_ex);
    assert_non_null(api->bn_ex_reserve);
    assert_non_null(api->set_act);
}

static void test_nccl_loads(void **state) {
    (void)state;
    const char *why = mt_dist_nccl_load_error();
    if (why) fail_msg("%s", why);
}

int main(void) {
    bool cudnn = mt_cudnn_available();
    const char *nccl_why = mt_dist_nccl_load_error();
    bool nccl = !nccl_why || !strstr(nccl_why, "cannot load"); /* "lacks": a failure */
    mt_clear_error();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cublas_loads),
        cudnn ? (struct CMUnitTest)cmocka_unit_test(test_cudnn_loads)
              : MT_TEST_SKIPPED(test_cudnn_loads, "libcudnn.so.9 is not installed here"),
        nccl ? (struct CMUnitTest)cmocka_unit_test(test_nccl_loads)
             : MT_TEST_SKIPPED(test_nccl_loads, "libnccl.so.2 is not installed here"),
    };
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

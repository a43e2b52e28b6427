/* train_mlp: a small, complete mixed-precision training loop.
 *
 * A two-layer MLP learns a fixed random "teacher" function y = tanh(x A) from 1024 samples.
 * The forward pass runs under autocast (GEMMs in FP16 or BF16, the loss in FP32), a
 * GradScaler scales the loss so small FP16 gradients do not underflow, and AdamW updates the
 * FP32 parameters. Usage: train_mlp [fp16|bf16|fp32] (default fp16). */
#include <stdio.h>
#include <string.h>
#include "mixtape.h"

static int fail(const char *what) {
    fprintf(stderr, "train_mlp: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    mt_dtype low = MT_F16;
    if (argc > 1 && strcmp(argv[1], "bf16") == 0) low = MT_BF16;
    if (argc > 1 && strcmp(argv[1], "fp32") == 0) low = MT_F32; /* autocast region disabled */
    mt_manual_seed(0);

    /* The data set. Intermediate results die with the scope; mt_retain keeps y past it. */
    mt_tensor *x = mt_randn(MT_SHAPE(1024, 32), MT_F32, MT_CPU);
    mt_tensor *a = mt_randn(MT_SHAPE(32, 8), MT_F32, MT_CPU);
    mt_scope_begin();
    mt_tensor *y = mt_retain(mt_tanh(mt_matmul(x, a)));
    mt_scope_end();

    /* The model: Linear(32, 64) -> ReLU -> Linear(64, 8); FP32 parameters. */
    mt_linear_layer l1 = {0}, l2 = {0};
    mt_linear_layer_init(&l1, 32, 64, true, MT_F32, MT_CPU);
    mt_linear_layer_init(&l2, 64, 8, true, MT_F32, MT_CPU);
    if (mt_last_status() != MT_OK) return fail("making the model");
    mt_tensor *params[] = {l1.weight, l1.bias, l2.weight, l2.bias};
    mt_optimizer *opt = mt_adamw_new(params, 4, &(mt_adam_opts){.lr = MT_SET(1e-2)});
    mt_grad_scaler *scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
    if (mt_last_status() != MT_OK) return fail("making the optimizer");

    double first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        mt_scope_begin(); /* everything a step makes is released by mt_scope_end */
        mt_autocast_begin(low, MT_AMP_O1);
        mt_tensor *h = mt_relu(mt_linear_layer_forward(&l1, x));
        mt_tensor *loss = mt_mse_loss(mt_linear_layer_forward(&l2, h), y);
        mt_autocast_end();
        mt_backward(mt_grad_scaler_scale(scaler, loss), NULL);
        mt_grad_scaler_minimize(scaler, opt); /* unscale, skip on inf/nan, step, update scale */
        mt_optimizer_zero_grad(opt);
        last = mt_item(loss);
        mt_scope_end();
        if (mt_last_status() != MT_OK) return fail("training step"); /* one check per step */
        if (step == 0) first = last;
        if (step % 50 == 0)
            printf("step %3d  loss %.5f  scale %g\n", step, last, mt_grad_scaler_get_scale(scaler));
    }
    printf("%s: loss %.5f -> %.5f, %lld step(s) skipped\n",
           low == MT_F16    ? "fp16"
           : low == MT_BF16 ? "bf16"
                            : "fp32",
           first, last, (long long)mt_grad_scaler_skipped_steps(scaler));

    mt_grad_scaler_free(scaler);
    mt_optimizer_free(opt);
    mt_linear_layer_free(&l1);
    mt_linear_layer_free(&l2);
    mt_release(x);
    mt_release(a);
    mt_release(y);
    if (mt_live_tensors() != 0)
        fprintf(stderr, "train_mlp: %lld tensors leaked\n", (long long)mt_live_tensors());
    return last < first ? 0 : 1;
}

/* train_mlp: a small, complete mixed-precision training loop.
 *
 * A two-layer MLP learns a fixed random "teacher" function y = tanh(x A) from 1024 samples.
 * The forward pass runs under autocast (GEMMs in FP16 or BF16, the loss in FP32), a
 * GradScaler scales the loss so small FP16 gradients do not underflow, and AdamW updates the
 * FP32 parameters.
 *
 * Usage: train_mlp [fp16|bf16|fp32] [--steps N] [--save PATH] [--resume PATH]
 * (default fp16, 300 steps). --save writes a safetensors checkpoint (the model as "fc1.weight"
 * ..., the names of the matching PyTorch module; the AdamW state; the GradScaler; the step)
 * at the end; --resume continues from one: 150 steps saved and resumed for 150 more end with
 * the same parameters, bit for bit, as 300 steps in one run.
 * Exit status: 0 when the loss fell; 1 when it did not (said on stderr) or something failed;
 * 2 for a bad command line. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define MT_SAMPLE_NAME "train_mlp"
#include "sample_util.h" /* read_long, parse_long, check_save_path, check_load_path */

/* --steps and a checkpoint's step at most: their sum stays an int. */
enum { MAX_STEPS = INT_MAX / 2 };

static int fail(const char *what) {
    fprintf(stderr, "train_mlp: %s: %s\n", what, mt_last_error());
    return 1;
}

static int usage(FILE *f, int status) {
    fprintf(f, "usage: train_mlp [fp16|bf16|fp32] [--steps N] [--save PATH] [--resume PATH]\n");
    return status;
}

/* The model, optimizer and scaler in one state dict. */
static int save(const char *path, mt_linear_layer *l1, mt_linear_layer *l2, mt_optimizer *opt,
                mt_grad_scaler *scaler, int step) {
    mt_state *s = mt_state_new();
    char buf[32];
    snprintf(buf, sizeof buf, "%d", step);
    mt_linear_layer_state_put(l1, s, "fc1.");
    mt_linear_layer_state_put(l2, s, "fc2.");
    mt_optimizer_state_save(opt, s, "optim.");
    mt_grad_scaler_state_save(scaler, s, "scaler.");
    mt_state_set_meta(s, "step", buf);
    mt_state_save(s, path);
    mt_state_free(s);
    return mt_last_status() == MT_OK ? 0 : fail("saving the checkpoint");
}

/* Restores what save wrote; *step is the number of steps it had done. */
static int resume(const char *path, mt_linear_layer *l1, mt_linear_layer *l2, mt_optimizer *opt,
                  mt_grad_scaler *scaler, int *step) {
    mt_state *s = mt_state_load(path, MT_CPU);
    if (!s) return fail("loading the checkpoint");
    mt_tensor *params[] = {l1->weight, l1->bias, l2->weight, l2->bias};
    const char *st = mt_state_get_meta(s, "step");
    long done = 0;
    /* From a file: a negative or huge count would make the step loop run nothing or overflow. */
    if (st && !read_long(st, 0, MAX_STEPS, &done)) {
        fprintf(stderr, "train_mlp: %s: step \"%s\" is not a step count (an integer in [0, %d])\n",
                path, st, MAX_STEPS);
        mt_state_free(s);
        return 1;
    }
    *step = (int)done;
    /* the model strictly under "fc" (a PyTorch state dict of the same module loads too) */
    mt_state_load_into(s, "fc", params,
                       (const char *[]){"1.weight", "1.bias", "2.weight", "2.bias"}, 4, true);
    mt_optimizer_state_load(opt, s, "optim.");
    mt_grad_scaler_state_load(scaler, s, "scaler.");
    mt_state_free(s);
    return mt_last_status() == MT_OK ? 0 : fail("restoring the checkpoint");
}

int main(int argc, char **argv) {
    mt_dtype low = MT_F16;
    const char *save_path = NULL, *resume_path = NULL;
    int steps = 300;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "bf16") == 0)
            low = MT_BF16;
        else if (strcmp(argv[i], "fp32") == 0)
            low = MT_F32; /* autocast region disabled */
        else if (strcmp(argv[i], "fp16") == 0)
            low = MT_F16;
        else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc)
            save_path = argv[++i];
        else if (strcmp(argv[i], "--resume") == 0 && i + 1 < argc)
            resume_path = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = (int)parse_long("--steps", argv[++i], 1, MAX_STEPS);
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return usage(stdout, 0);
        else {
            fprintf(stderr, "train_mlp: unknown or incomplete argument \"%s\"\n", argv[i]);
            return usage(stderr, 2);
        }
    }
    /* Fail now, not after the whole run, when the checkpoint could not be written. */
    if (save_path) check_save_path("--save", save_path);
    if (resume_path) check_load_path("--resume", resume_path);
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

    int start = 0;
    if (resume_path && resume(resume_path, &l1, &l2, opt, scaler, &start)) return 1;
    if (resume_path) printf("resumed from %s after %d steps\n", resume_path, start);
    double first = 0, last = 0;
    for (int step = start; step < start + steps; step++) {
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
        if (step == start) first = last;
        if (step % 50 == 0)
            printf("step %3d  loss %.5f  scale %g\n", step, last, mt_grad_scaler_get_scale(scaler));
    }
    printf("%s: loss %.5f -> %.5f, %lld step(s) skipped\n",
           low == MT_F16    ? "fp16"
           : low == MT_BF16 ? "bf16"
                            : "fp32",
           first, last, (long long)mt_grad_scaler_skipped_steps(scaler));
    if (save_path && save(save_path, &l1, &l2, opt, scaler, start + steps)) return 1;

    mt_grad_scaler_free(scaler);
    mt_optimizer_free(opt);
    mt_linear_layer_free(&l1);
    mt_linear_layer_free(&l2);
    mt_release(x);
    mt_release(a);
    mt_release(y);
    if (mt_live_tensors() != 0)
        fprintf(stderr, "train_mlp: %lld tensors leaked\n", (long long)mt_live_tensors());
    if (last < first) return 0;
    /* The exit status says whether it learned; a failing one says why. */
    fprintf(stderr, "train_mlp: the loss did not fall over %d step(s) (%.5f -> %.5f)%s\n", steps,
            first, last, steps == 1 ? "; one step is too few to tell" : "");
    return 1;
}

/* SimpleNet AMP sample: the network of the PaddlePaddle AMP guide (three Linear layers with
 * ReLU after the first two, MSE loss, SGD lr 1e-4, GradScaler with init scale 1024), trained
 * once per mode on the same data from the same initial weights, and timed:
 *
 *   fp32     plain FP32 training
 *   o1-fp16  autocast O1 to FP16 (GEMMs in FP16, loss in FP32) + GradScaler
 *   o2-fp16  parameters cast to FP16 once (mt_amp_decorate), autocast O2, GradScaler, SGD with
 *            FP32 master weights (multi_precision)
 *   o1-bf16  autocast O1 to BF16; BF16 has FP32's exponent range, so no loss scaling
 *
 * Each training step is one scope; errors are checked once per step. On a CUDA device ops
 * return before the device has run them, so the clock is read only after mt_synchronize (at
 * the end of the warm-up steps and after the last step), and the memory figures are the
 * device's own (mt_memory_stats_get): the GPU's peak, comparable with
 * torch.cuda.max_memory_allocated. mt_host_sync_count tells how often a step made the host
 * wait for the device (0 for a step that stays on the device).
 * --save PATH writes a checkpoint (model, optimizer, GradScaler, step) after the run, and
 * --resume PATH continues from one: a run of 2 epochs equals, bit for bit, a run of 1 epoch
 * saved and resumed for 1 more (with one mode selected).
 * With --ddp the sample is one rank of a data-parallel job (mpirun -np N simplenet_amp --ddp):
 * every rank trains on its own batches, the gradients are averaged through mt_ddp (buckets of
 * --bucket-mb MiB, started during backward) and the GradScaler skips the same steps on every
 * rank; each rank reports its all-reduce calls per step and a parameter checksum (equal on
 * every rank when the replicas stayed in sync).
 * Run with --help for the options. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#define MT_SAMPLE_NAME "simplenet_amp"
#include "sample_util.h"
#include "sample_opts.h"

enum { N_LAYERS = 3 };
/* --steps x --epochs at most: a CPU run keeps every step's time (8 bytes a step), and the
   step counts stay ints. */
enum { MAX_TOTAL_STEPS = 1 << 24 };
/* A checkpoint's steps_done at most: far above any real run, far below overflow when the
   resumed run adds its steps. */
#define MAX_STEPS_DONE (1L << 50)

typedef struct {
    int64_t hidden, batch;
    int steps, epochs; /* batches per epoch, epochs */
    int total_steps;   /* steps x epochs, at most MAX_TOTAL_STEPS */
    int warmup;        /* untimed steps at the start */
    int threads;       /* 0: library default */
    mt_device dev;
    bool json;
    bool run[N_MODES];
    uint64_t seed;
    const char *save_path, *resume_path; /* checkpoints; NULL: none */
    bool ddp;
    mt_ddp_opts ddp_opts;
} config;

typedef struct {
    double ms_per_step, loss;
    double ms_median; /* median step time; CPU only (device work is asynchronous) */
    int timed_steps;
    /* peak_bytes, data_bytes, cached_bytes: the training device's figures (mt_memory_stats);
       peak_bytes_all: mt_peak_bytes, every device and the host together */
    int64_t peak_bytes, data_bytes, cached_bytes, peak_bytes_all, rss_delta_bytes, skipped;
    int64_t host_syncs; /* host waits for the device during the timed steps */
    mt_ddp_stats ddp;   /* --ddp: the last step's all-reduce calls, buckets */
    ddp_trace trace;    /* --ddp: backward against the all-reduces, per timed step */
    double checksum;    /* the sum of every parameter after training */
} result;

static const char *device_name(mt_device d) {
    return d.type == MT_DEVICE_CUDA ? "cuda" : "cpu";
}

static int64_t maxrss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: simplenet_amp [options]\n"
               "  --modes LIST     comma list of fp32,o1-fp16,o2-fp16,o1-bf16 (default: all)\n"
               "  --device DEV     cpu or cuda[:N] (default: cuda when available, else cpu)\n"
               "  --hidden N       input = hidden = output size (GPU default 4096, CPU 1024)\n"
               "  --batch N        batch size (GPU default 512, CPU 256)\n"
               "  --steps N        batches per epoch (GPU default 50, CPU 10)\n"
               "  --epochs N       epochs (GPU default 5, CPU 2)\n"
               "  --warmup N       untimed steps at the start (default 1)\n"
               "  --threads N      CPU threads for kernels and BLAS (default: all cores)\n"
               "  --seed N         seed for data and weights (default 2023)\n"
               "  --json           one JSON object per mode and line on stdout, nothing else\n"
               "  --save PATH      write a checkpoint after the run (one mode only)\n"
               "  --resume PATH    continue from a checkpoint of the same mode and "
               "sizes\n" SAMPLE_DDP_USAGE);
}

/* Sizes given on the command line; 0: the device's default. */
typedef struct {
    int64_t hidden, batch, steps, epochs, warmup;
    bool dev_given;
} given;

static void parse_args(int argc, char **argv, config *c) {
    given g = {.warmup = 1};
    const sample_opt opts[] = {
        SAMPLE_OPT_RANGE("hidden", SO_I64, &g.hidden, 1, 1 << 16),
        SAMPLE_OPT_RANGE("batch", SO_I64, &g.batch, 1, 1 << 20),
        SAMPLE_OPT_RANGE("steps", SO_I64, &g.steps, 1, 1 << 20),
        SAMPLE_OPT_RANGE("epochs", SO_I64, &g.epochs, 1, 1 << 20),
        SAMPLE_OPT_RANGE("warmup", SO_I64, &g.warmup, 0, 1 << 20),
        SAMPLE_OPT("modes", SO_MODES, c->run),
        {.name = "device", .kind = SO_DEVICE, .dst = &c->dev, .seen = &g.dev_given},
        SAMPLE_OPT_THREADS(&c->threads),
        SAMPLE_OPT_SEED(&c->seed),
        SAMPLE_OPT("json", SO_FLAG, &c->json),
        SAMPLE_OPT("save", SO_STRING, &c->save_path),
        SAMPLE_OPT("resume", SO_STRING, &c->resume_path),
        SAMPLE_OPTS_DDP(&c->ddp, &c->ddp_opts),
        SAMPLE_OPT_HELP,
    };
    *c = (config){.seed = 2023, .dev = MT_CPU};
    for (int k = 0; k < N_MODES; k++) c->run[k] = true;
    sample_opts_parse(argc, argv, opts, (int)(sizeof opts / sizeof *opts), usage, true);
    int n_modes = 0;
    for (int k = 0; k < N_MODES; k++) n_modes += c->run[k];
    if ((c->save_path || c->resume_path) && n_modes != 1) {
        fprintf(stderr, "simplenet_amp: --save and --resume need exactly one mode (--modes)\n");
        exit(2);
    }
    c->dev = resolve_device(g.dev_given, c->dev);
    /* The guide's sizes on a GPU; on a CPU a scaled-down run that takes seconds, not minutes. */
    bool gpu = c->dev.type == MT_DEVICE_CUDA;
    c->hidden = g.hidden ? g.hidden : (gpu ? 4096 : 1024);
    c->batch = g.batch ? g.batch : (gpu ? 512 : 256);
    c->steps = g.steps ? (int)g.steps : (gpu ? 50 : 10);
    c->epochs = g.epochs ? (int)g.epochs : (gpu ? 5 : 2);
    int64_t total = (int64_t)c->steps * c->epochs;
    if (total > MAX_TOTAL_STEPS) {
        fprintf(stderr, "simplenet_amp: --steps %d x --epochs %d is %lld steps; at most %d\n",
                c->steps, c->epochs, (long long)total, MAX_TOTAL_STEPS);
        exit(2);
    }
    c->total_steps = (int)total;
    /* At least one step is timed: a one-step run times its only step, warm-up included. */
    c->warmup = g.warmup < total ? (int)g.warmup : (int)(total - 1);
    /* Fail now, not after the whole run, when the checkpoint could not be written or read. */
    if (c->save_path) check_save_path("--save", c->save_path);
    if (c->resume_path) check_load_path("--resume", c->resume_path);
    if (!gpu && !(g.hidden || g.batch || g.steps || g.epochs)) {
        fprintf(
            c->json ? stderr : stdout,
            "cpu: scaled-down defaults (hidden 1024, batch 256, 10 batches x 2 epochs); the AMP "
            "guide's sizes are --hidden 4096 --batch 512 --steps 50 --epochs 5\n");
    }
}

/* A "\r" progress line on stderr: on a terminal, or every 10% when the run is long. */
static void progress(const mode_spec *m, int step, int total, double *last) {
    bool tty = isatty(STDERR_FILENO);
    if (tty) {
        double t = now_s();
        if (step < total && t - *last < 0.1) return;
        *last = t;
        if (step < total)
            fprintf(stderr, "\r  %-8s step %d/%d", m->name, step, total);
        else
            fprintf(stderr, "\r%40s\r", "");
    } else if (total >= 200 && step < total && step % (total / 10) == 0) {
        fprintf(stderr, "  %-8s step %d/%d\n", m->name, step, total);
    }
}

/* ---- checkpoints: the layers as "fc1." "fc2." "fc3.", the optimizer under "optim.", the
   scaler under "scaler.", the mode and the number of steps done as metadata. */
static void checkpoint_save(const char *path, const mode_spec *m, mt_linear_layer *layers,
                            mt_optimizer *opt, mt_grad_scaler *scaler, long steps_done) {
    mt_state *s = mt_state_new();
    char prefix[16], steps[32];
    for (int i = 0; i < N_LAYERS; i++) {
        snprintf(prefix, sizeof prefix, "fc%d.", i + 1);
        mt_linear_layer_state_put(&layers[i], s, prefix);
    }
    mt_optimizer_state_save(opt, s, "optim.");
    if (scaler) mt_grad_scaler_state_save(scaler, s, "scaler.");
    snprintf(steps, sizeof steps, "%ld", steps_done);
    mt_state_set_meta(s, "mode", m->name);
    mt_state_set_meta(s, "steps_done", steps);
    mt_state_save(s, path);
    mt_state_free(s);
    check_file("cannot save the checkpoint");
}

/* Loads a checkpoint into the freshly made model, optimizer and scaler; returns the number
   of steps it had done. */
static long checkpoint_load(const char *path, const config *c, const mode_spec *m,
                            mt_linear_layer *layers, mt_optimizer *opt, mt_grad_scaler *scaler) {
    mt_state *s = mt_state_load(path, c->dev);
    check_file("cannot load the checkpoint");
    const char *mode = mt_state_get_meta(s, "mode"), *steps = mt_state_get_meta(s, "steps_done");
    if (!mode || strcmp(mode, m->name) != 0) {
        fprintf(stderr, "simplenet_amp: %s is a checkpoint of mode %s, not %s\n", path,
                mode ? mode : "(none)", m->name);
        exit(1);
    }
    if (!steps) {
        fprintf(stderr, "simplenet_amp: %s has no steps_done metadata\n", path);
        exit(1);
    }
    mt_tensor *params[2 * N_LAYERS];
    const char *names[2 * N_LAYERS] = {"1.weight", "1.bias",   "2.weight",
                                       "2.bias",   "3.weight", "3.bias"};
    for (int i = 0; i < N_LAYERS; i++) {
        params[2 * i] = layers[i].weight;
        params[2 * i + 1] = layers[i].bias;
    }
    /* "fc1.weight" ...: strict, so nothing is missing and nothing else is under "fc" */
    mt_state_load_into(s, "fc", params, names, 2 * N_LAYERS, true);
    mt_optimizer_state_load(opt, s, "optim.");
    if (scaler) mt_grad_scaler_state_load(scaler, s, "scaler.");
    /* From a file: a negative count would index the batches out of bounds, a huge one overflow
       the steps this run adds. */
    long done;
    if (!read_long(steps, 0, MAX_STEPS_DONE, &done)) {
        fprintf(stderr,
                "simplenet_amp: %s: steps_done \"%s\" is not a step count (an integer in [0, "
                "%ld])\n",
                path, steps, MAX_STEPS_DONE);
        exit(1);
    }
    mt_state_free(s);
    check("restoring the checkpoint");
    return done;
}

/* One training step: forward under autocast, (scaled) backward, optimizer step. The returned
   loss belongs to the caller's scope. */
static mt_tensor *train_step(const mode_spec *m, mt_linear_layer *layers, mt_optimizer *opt,
                             mt_grad_scaler *scaler, mt_ddp *ddp, ddp_trace *tr, mt_tensor *x,
                             mt_tensor *y) {
    if (m->low != MT_F32) mt_autocast_begin(m->low, m->level);
    mt_tensor *h = mt_relu(mt_linear_layer_forward(&layers[0], x));
    h = mt_relu(mt_linear_layer_forward(&layers[1], h));
    mt_tensor *pred = mt_linear_layer_forward(&layers[2], h);
    mt_tensor *loss = mt_mse_loss(pred, y);
    if (m->low != MT_F32) mt_autocast_end();
    sample_backward_step(loss, opt, scaler, ddp, tr);
    return loss;
}

/* One mode's model: the layers, their parameters, the optimizer and the mode's scaler and
   data-parallel wrapper. */
typedef struct {
    mt_linear_layer layers[N_LAYERS];
    mt_tensor *params[2 * N_LAYERS];
    mt_optimizer *opt;
    mt_grad_scaler *scaler;
    mt_ddp *ddp;
} model;

static void model_make(model *md, const config *c, const mode_spec *m, result *r) {
    *md = (model){0};
    mt_manual_seed(c->seed + 1); /* the same initial weights in every mode */
    for (int i = 0; i < N_LAYERS; i++) {
        mt_linear_layer_init(&md->layers[i], c->hidden, c->hidden, true, MT_F32, c->dev);
        check("mt_linear_layer_init");
        md->params[2 * i] = md->layers[i].weight;
        md->params[2 * i + 1] = md->layers[i].bias;
    }
    if (m->master_weights) {
        mt_amp_decorate(md->params, 2 * N_LAYERS, m->low, NULL);
        check("mt_amp_decorate");
    }
    md->opt = mt_sgd_new(md->params, 2 * N_LAYERS,
                         &(mt_sgd_opts){.lr = MT_SET(1e-4), .multi_precision = m->master_weights});
    check("mt_sgd_new");
    if (m->scaler) {
        md->scaler = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
        check("mt_grad_scaler_new");
    }
    if (c->ddp)
        md->ddp = sample_ddp_new(md->params, 2 * N_LAYERS, &c->ddp_opts, md->scaler, &r->trace,
                                 c->total_steps);
}

static void model_free(model *md) {
    mt_ddp_free(md->ddp);
    mt_grad_scaler_free(md->scaler);
    mt_optimizer_free(md->opt);
    for (int i = 0; i < N_LAYERS; i++) mt_linear_layer_free(&md->layers[i]);
}

/* The training steps, from batch `start` on: the time of the steps after the warm-up (and,
   on the CPU, each step's own time, for the median), the host waits they made and the last
   loss. */
static void run_steps(const config *c, const mode_spec *m, model *md, long start, mt_tensor **xs,
                      mt_tensor **ys, result *r) {
    int total = c->total_steps;
    /* On the CPU every op has finished when it returns, so single steps can be timed too; their
       median shrugs off the odd step slowed by another process. On a GPU a step's ops return
       before the device has run them: only whole runs between two mt_synchronize are timed. */
    bool per_step = c->dev.type == MT_DEVICE_CPU;
    double *step_ms = per_step ? calloc((size_t)total, sizeof *step_ms) : NULL;
    if (per_step && !step_ms) {
        fprintf(stderr, "simplenet_amp: out of memory for %d step times\n", total);
        exit(1);
    }
    /* The data copies and the weights' initialization are not part of any step. */
    mt_synchronize(c->dev);
    check("mt_synchronize");
    double t0 = now_s(), last = 0;
    int64_t syncs0 = mt_host_sync_count();
    mt_tensor *final_loss = NULL;
    for (int s = 0; s < total; s++) {
        if (s == c->warmup && s > 0) {
            /* The warm-up steps (caches, allocators, cuBLAS handles) have finished. */
            mt_synchronize(c->dev);
            check("mt_synchronize");
            t0 = now_s();
            syncs0 = mt_host_sync_count();
        }
        double ts = now_s();
        mt_scope_begin();
        int b = (int)((start + s) % c->steps); /* a resumed run continues the batch order */
        mt_tensor *loss = train_step(m, md->layers, md->opt, md->scaler, md->ddp,
                                     s >= c->warmup ? &r->trace : NULL, xs[b], ys[b]);
        if (!loss && mt_last_status() == MT_OK) {
            fprintf(stderr,
                    "simplenet_amp: %s step %d: the forward pass returned no loss and "
                    "no error (a library function is not implemented yet?)\n",
                    m->name, s);
            exit(1);
        }
        /* The loss is read after the clock stops: mt_item would wait for the device. */
        if (s == total - 1) final_loss = mt_retain(loss);
        mt_scope_end();
        if (step_ms) step_ms[s] = 1e3 * (now_s() - ts);
        check(m->name);
        progress(m, s + 1, total, &last);
    }
    /* Host waits the steps made themselves, before our own wait below. */
    r->host_syncs = mt_host_sync_count() - syncs0;
    mt_synchronize(c->dev);
    check("mt_synchronize");
    double t1 = now_s();
    r->loss = mt_item(final_loss);
    check("mt_item");
    mt_release(final_loss);
    r->timed_steps = total - c->warmup;
    r->ms_per_step = 1e3 * (t1 - t0) / r->timed_steps;
    r->ms_median = NAN;
    if (step_ms) {
        double *timed = step_ms + (total - r->timed_steps);
        qsort(timed, (size_t)r->timed_steps, sizeof *timed, cmp_double);
        int n = r->timed_steps;
        r->ms_median = n % 2 ? timed[n / 2] : 0.5 * (timed[n / 2 - 1] + timed[n / 2]);
        free(step_ms);
    }
}

static void train(const config *c, const mode_spec *m, mt_tensor **xs, mt_tensor **ys, result *r) {
    int64_t tensors_before = mt_live_tensors();
    mt_peak_bytes_reset();
    mt_memory_peak_reset(c->dev);
    mt_memory_stats ms0 = {0};
    /* Before the model exists the device holds the data set alone. */
    if (mt_memory_stats_get(c->dev, &ms0) < 0) check("mt_memory_stats_get");
    r->data_bytes = ms0.live_bytes;
    int64_t rss0 = maxrss_bytes();

    model md;
    model_make(&md, c, m, r);
    long start =
        c->resume_path ? checkpoint_load(c->resume_path, c, m, md.layers, md.opt, md.scaler) : 0;
    run_steps(c, m, &md, start, xs, ys, r);

    r->skipped = md.scaler ? mt_grad_scaler_skipped_steps(md.scaler) : 0;
    check("mt_grad_scaler_skipped_steps");
    mt_memory_stats ms1 = {0};
    if (mt_memory_stats_get(c->dev, &ms1) < 0) check("mt_memory_stats_get");
    r->peak_bytes = ms1.peak_bytes;
    r->cached_bytes = ms1.cached_bytes;
    r->peak_bytes_all = mt_peak_bytes();
    r->rss_delta_bytes = maxrss_bytes() - rss0;

    if (c->save_path)
        checkpoint_save(c->save_path, m, md.layers, md.opt, md.scaler, start + c->total_steps);
    if (md.ddp) mt_ddp_stats_get(md.ddp, &r->ddp);
    r->checksum = param_checksum(md.params, 2 * N_LAYERS);
    check("the parameter checksum");
    model_free(&md);
    warn_live_tensors(m->name, tensors_before);
}

static void print_json(const config *c, const mode_spec *m, result *r) {
    printf("{\"mode\": \"%s\", \"device\": \"%s\", \"hidden\": %lld, \"batch\": %lld, "
           "\"steps\": %d, \"batches\": %d, \"epochs\": %d, \"threads\": %d, \"ms_per_step\": ",
           m->name, device_name(c->dev), (long long)c->hidden, (long long)c->batch, c->total_steps,
           c->steps, c->epochs, mt_get_num_threads());
    print_json_number(r->ms_per_step);
    print_json_field("ms_median", r->ms_median);
    print_json_field("loss", r->loss);
    printf(", \"peak_bytes\": %lld, \"data_bytes\": %lld, \"rss_delta_bytes\": %lld, "
           "\"skipped\": %lld, \"warmup\": %d, \"timed_steps\": %d, \"cached_bytes\": %lld, "
           "\"peak_bytes_all\": %lld, \"host_syncs\": %lld, \"host_syncs_per_step\": ",
           (long long)r->peak_bytes, (long long)r->data_bytes, (long long)r->rss_delta_bytes,
           (long long)r->skipped, c->warmup, r->timed_steps, (long long)r->cached_bytes,
           (long long)r->peak_bytes_all, (long long)r->host_syncs);
    print_json_number((double)r->host_syncs / r->timed_steps);
    print_ddp_json(&r->ddp, &c->ddp_opts, c->ddp ? &r->trace : NULL);
    print_json_checksum_end(r->checksum);
}

/* Random inputs and targets, made once: every mode trains on the same data. They are made on
   the CPU so that every device sees the same numbers; each rank draws its own batches. */
static void make_data(const config *c, mt_tensor ***xs, mt_tensor ***ys) {
    mt_manual_seed(c->seed + (uint64_t)mt_dist_rank());
    *xs = calloc((size_t)c->steps, sizeof **xs);
    *ys = calloc((size_t)c->steps, sizeof **ys);
    if (!*xs || !*ys) {
        fprintf(stderr, "simplenet_amp: out of memory\n");
        exit(1);
    }
    for (int b = 0; b < c->steps; b++) {
        mt_tensor *x = mt_randn(MT_SHAPE(c->batch, c->hidden), MT_F32, MT_CPU);
        mt_tensor *y = mt_randn(MT_SHAPE(c->batch, c->hidden), MT_F32, MT_CPU);
        (*xs)[b] = mt_to(x, c->dev);
        (*ys)[b] = mt_to(y, c->dev);
        mt_release(x);
        mt_release(y);
        check("making the data");
    }
}

static void free_data(const config *c, mt_tensor **xs, mt_tensor **ys) {
    for (int b = 0; b < c->steps; b++) {
        mt_release(xs[b]);
        mt_release(ys[b]);
    }
    free(xs);
    free(ys);
}

static void print_table_header(const config *c) {
    if (c->ddp) print_ddp_header(c->batch, &c->ddp_opts);
    printf("SimpleNet: 3 x Linear(%lld, %lld), ReLU, MSE loss; SGD lr 1e-4; batch %lld; "
           "%d batches x %d epochs on %s (%d threads)\n",
           (long long)c->hidden, (long long)c->hidden, (long long)c->batch, c->steps, c->epochs,
           device_name(c->dev), mt_get_num_threads());
    printf("%-28s %10s %12s %9s %10s %8s %10s\n", "mode", "ms/step", "final loss", "speedup",
           "peak MiB", "skipped", "syncs/step");
    fflush(stdout);
}

static void print_table_row(const config *c, const mode_spec *m, result *r, double fp32_ms) {
    char speedup[32] = "-";
    if (isfinite(fp32_ms)) snprintf(speedup, sizeof speedup, "%.2fx", fp32_ms / r->ms_per_step);
    printf("%-28s %10.2f %12.7g %9s %10.1f %8lld %10.2f\n", m->label, r->ms_per_step, r->loss,
           speedup, (double)r->peak_bytes / (1 << 20), (long long)r->skipped,
           (double)r->host_syncs / r->timed_steps);
    if (c->ddp) {
        printf("  %d buckets: %lld all-reduce calls per step (%lld started during backward), "
               "param checksum %.9g\n"
               "  median step (ms from the start of backward, progress %s): ",
               r->ddp.buckets, (long long)r->ddp.allreduce_calls,
               (long long)r->ddp.started_in_backward, r->checksum,
               progress_name(c->ddp_opts.progress));
        print_ddp_trace_text(&r->trace);
    }
    fflush(stdout);
}

static void print_table_footer(const config *c, int64_t data_bytes) {
    printf("ms/step excludes the first %d (warm-up) step(s)%s; peak MiB is the %s's peak "
           "(mt_memory_stats_get) during the mode, including the %.1f MiB data set; "
           "syncs/step: host waits for the device per timed step (mt_host_sync_count).\n",
           c->warmup,
           c->dev.type == MT_DEVICE_CPU ? "" : ", timed between two mt_synchronize calls",
           c->dev.type == MT_DEVICE_CPU ? "host" : "GPU", (double)data_bytes / (1 << 20));
    if (c->dev.type == MT_DEVICE_CPU)
        printf("On a CPU, FP16 is a storage format computed in FP32 registers (less memory "
               "traffic, no faster math); BF16 GEMMs run natively through oneDNN where the "
               "CPU has AVX512-BF16/AMX.\n");
}

int main(int argc, char **argv) {
    config c;
    parse_args(argc, argv, &c);
    sample_init(c.threads, c.ddp);
    /* --ddp: only rank 0 prints the table (with --json every rank prints its lines) */
    bool table = !c.json && mt_dist_rank() == 0;
    mt_tensor **xs, **ys;
    make_data(&c, &xs, &ys);
    if (table) print_table_header(&c);
    double fp32_ms = NAN;
    int64_t data_bytes = 0;
    for (int k = 0; k < N_MODES; k++) {
        if (!c.run[k]) continue;
        result r = {0};
        train(&c, &MODES[k], xs, ys, &r);
        if (k == 0) fp32_ms = r.ms_per_step;
        data_bytes = r.data_bytes;
        if (c.json) print_json(&c, &MODES[k], &r);
        if (table) print_table_row(&c, &MODES[k], &r, fp32_ms);
        ddp_trace_free(&r.trace);
    }
    if (table) print_table_footer(&c, data_bytes);
    free_data(&c, xs, ys);
    if (c.ddp && mt_dist_finalize() < 0) check("mt_dist_finalize");
    return 0;
}

/* mixtape's GEMMs on a CUDA device against a direct cuBLAS call (cublasGemmEx) with the same
   operands, shapes, layouts and dtypes, timed in the same program, and against torch.matmul /
   F.linear on the same device when PyTorch with CUDA is there (bench/gemm.py, a child).

   Issue 6's goal: FP16 GEMMs at >= 60% of the cuBLAS rate measured alone. The shapes are a
   square 4096^3 and SimpleNet's three (batch 512, hidden 4096): the forward mt_linear
   (x [512,4096] @ w^T), the input gradient (dy @ w) and the weight gradient (dy^T @ x, a
   transposed view). FP16 and BF16 multiply on tensor cores with FP32 accumulation (cuBLAS:
   CUBLAS_COMPUTE_32F, output in the input dtype, as mixtape's); FP32 with TF32 off on all
   three sides, for information.

   Time per call: a run of --iters calls queued back to back, then one device synchronization,
   divided by --iters (so host overheads count only where they exceed the device time); the
   best of --reps runs, mixtape and cuBLAS interleaved so both see the same device. Before
   timing, mixtape's result is compared with cuBLAS's (max |diff| / max |cuBLAS|, at most one
   output rounding apart), so that both sides provably compute the same product; a
   disagreement is an error (exit status 1).

   The cuBLAS operands are the device copies of the same host values as mixtape's (mixtape's
   public API has no device pointer); same shapes, strides and dtype.

   Output: one JSON line per (shape, dtype), then a table. Without a CUDA device it says so and
   exits with status 77 (skipped). On the emulated device (test/cuda_emu) the device name says
   EMULATED: its timings are a smoke test, never GPU figures.

   usage: gemm [--device cuda[:N]] [--tiny] [--iters N] [--reps N] [--python PATH] [--no-torch]
     --tiny: the same four cases at sizes 32 and 16 instead of 4096 and 512 (the emulator) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "gpu_bench.h"
#include "mixtape.h"
#ifdef MT_BENCH_CUDART
#include <cublas_v2.h>
#ifndef MT_BENCH_EMULATED
#include <dlfcn.h>
#endif
#define MT_BENCH_STR_(x) #x
#define MT_BENCH_STR(x)  MT_BENCH_STR_(x)
#endif

typedef struct {
    char name[48];
    int64_t m, n, k;
    bool ta, tb; /* A stored [K,M] (used transposed), B stored [N,K] */
    bool linear; /* mt_linear(A, B) = A @ B^T instead of mt_matmul */
} gemm_case;

typedef struct {
    double mt_s, blas_s, torch_s; /* seconds per call; NAN when not measured */
    double rel_diff;              /* max |mixtape - cuBLAS| / max |cuBLAS| */
} gemm_result;

static void make_cases(bool tiny, gemm_case *c) {
    int64_t h = tiny ? 32 : 4096, b = tiny ? 16 : 512;
    c[0] = (gemm_case){"", h, h, h, false, false, false};
    snprintf(c[0].name, sizeof c[0].name, "%lld^3", (long long)h);
    c[1] = (gemm_case){"", b, h, h, false, true, true};
    snprintf(c[1].name, sizeof c[1].name, "linear-fwd %lldx%lldx%lld", (long long)b, (long long)h,
             (long long)h);
    c[2] = (gemm_case){"", b, h, h, false, false, false};
    snprintf(c[2].name, sizeof c[2].name, "linear-dX %lldx%lldx%lld", (long long)b, (long long)h,
             (long long)h);
    c[3] = (gemm_case){"", h, h, b, true, false, false};
    snprintf(c[3].name, sizeof c[3].name, "linear-dW %lldx%lldx%lld", (long long)h, (long long)h,
             (long long)b);
}
enum { N_CASES = 4, N_DTYPES = 3 };
static const mt_dtype DTYPES[N_DTYPES] = {MT_F16, MT_BF16, MT_F32};
static const char *const DTYPE_LABEL[N_DTYPES] = {"FP16", "BF16", "FP32"};

/* ---- the mixtape side */
typedef struct {
    const gemm_case *c;
    mt_tensor *a, *b; /* as the op takes them (transposed views where the case says so) */
    mt_device dev;
} mt_side;

static mt_tensor *mt_side_call(const mt_side *s) {
    return s->c->linear ? mt_linear(s->a, s->b, NULL) : mt_matmul(s->a, s->b);
}

/* Seconds per call of `iters` queued calls and one synchronization; NAN on an error. */
static double mt_side_time(const mt_side *s, int iters) {
    if (mt_synchronize(s->dev) != MT_OK) return NAN;
    double t0 = mt_bench_now_s();
    for (int i = 0; i < iters; i++) {
        mt_tensor *y = mt_side_call(s);
        if (!y) return NAN;
        mt_release(y);
    }
    if (mt_synchronize(s->dev) != MT_OK) return NAN;
    return (mt_bench_now_s() - t0) / iters;
}

/* ---- the cuBLAS side: the toolkit's libcublas, loaded here as the library loads it (the
   emulated build links the fake cuBLAS of test/cuda_emu instead) */
#ifdef MT_BENCH_CUDART
typedef struct {
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasDestroy_v2) *destroy;
    __typeof__(cublasGemmEx) *gemm_ex;
} blas_api;

static bool blas_load(blas_api *api) {
#ifdef MT_BENCH_EMULATED
    *api = (blas_api){cublasCreate_v2, cublasDestroy_v2, cublasGemmEx};
    return true;
#else
    static const char *const names[] = {"libcublas.so." MT_BENCH_STR(CUBLAS_VER_MAJOR),
                                        "libcublas.so"};
    void *lib = NULL;
    for (int i = 0; i < 2 && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "gemm: cannot load %s: %s\n", names[0], dlerror());
        return false;
    }
    void *f[3] = {dlsym(lib, "cublasCreate_v2"), dlsym(lib, "cublasDestroy_v2"),
                  dlsym(lib, "cublasGemmEx")};
    if (!f[0] || !f[1] || !f[2]) {
        fprintf(stderr, "gemm: libcublas lacks cublasCreate_v2/cublasDestroy_v2/cublasGemmEx\n");
        return false;
    }
    /* ISO C has no cast from an object pointer to a function pointer: copy the bytes */
    memcpy(&api->create, &f[0], sizeof api->create);
    memcpy(&api->destroy, &f[1], sizeof api->destroy);
    memcpy(&api->gemm_ex, &f[2], sizeof api->gemm_ex);
    return true;
#endif
}

typedef struct {
    const blas_api *api;
    cublasHandle_t h;
    const gemm_case *c;
    cudaDataType dt;
    void *a, *b, *y; /* device buffers: A and B as stored, Y [M,N] row-major */
} blas_side;

/* Row-major Y = op(A) op(B) is column-major Y^T = op(B)^T op(A)^T: B first. A row-major
   [r, c] matrix read column-major is its transpose with leading dimension c. */
static cublasStatus_t blas_call(const blas_side *s) {
    const gemm_case *c = s->c;
    const float one = 1.0f, zero = 0.0f;
    int m = (int)c->m, n = (int)c->n, k = (int)c->k;
    return s->api->gemm_ex(s->h, c->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                           c->ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, s->b, s->dt,
                           c->tb ? k : n, s->a, s->dt, c->ta ? m : k, &zero, s->y, s->dt, n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static double blas_time(const blas_side *s, int iters) {
    if (cudaDeviceSynchronize() != cudaSuccess) return NAN;
    double t0 = mt_bench_now_s();
    for (int i = 0; i < iters; i++)
        if (blas_call(s) != CUBLAS_STATUS_SUCCESS) return NAN;
    if (cudaDeviceSynchronize() != cudaSuccess) return NAN;
    return (mt_bench_now_s() - t0) / iters;
}

/* A device copy of host tensor t (contiguous, on the CPU); NULL on failure. */
static void *blas_upload(const mt_tensor *t) {
    size_t bytes = (size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t));
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    if (cudaMemcpy(d, mt_data_ptr(t), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}
#endif

/* Y [M,N] as F32 on the host: from a mixtape tensor (any device) or, with t NULL, from
   device memory of dtype dt. NULL on failure. */
static float *host_f32(mt_tensor *t, const void *dev_ptr, mt_dtype dt, int64_t m, int64_t n) {
    mt_tensor *src = t;
#ifdef MT_BENCH_CUDART
    mt_tensor *raw = NULL;
    if (!t) {
        size_t bytes = (size_t)(m * n) * mt_dtype_size(dt);
        void *buf = malloc(bytes);
        if (buf && cudaMemcpy(buf, dev_ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess)
            raw = mt_from_data(buf, dt, MT_SHAPE(m, n), MT_CPU);
        free(buf);
        src = raw;
    }
#else
    (void)dev_ptr;
    (void)dt;
#endif
    mt_tensor *f = src ? mt_cast(src, MT_F32) : NULL;
    float *out = malloc((size_t)(m * n) * sizeof(float));
    bool ok = f && out && mt_copy_to_host(f, out, (size_t)(m * n) * sizeof(float)) == MT_OK;
    mt_release(f);
#ifdef MT_BENCH_CUDART
    mt_release(raw);
#endif
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- PyTorch on the same device: bench/gemm.py prints {"case", "dtype", "s"} lines */
static int run_torch(const char *python, const char *device, const gemm_case *cases, int iters,
                     int reps, gemm_result res[N_CASES][N_DTYPES], char *gpu, size_t gpu_cap) {
    char cmd[2048];
    int len = snprintf(cmd, sizeof cmd, "'%s' '%s/gemm.py' --device %s --iters %d --reps %d",
                       python, MT_BENCH_DIR, device, iters, reps);
    for (int i = 0; i < N_CASES; i++)
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " '%s:%lld:%lld:%lld:%d:%d:%d'",
                        cases[i].name, (long long)cases[i].m, (long long)cases[i].n,
                        (long long)cases[i].k, cases[i].ta, cases[i].tb, cases[i].linear);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[1024], name[64], dt[16];
    int found = 0;
    while (fgets(line, sizeof line, p)) {
        if (line[0] != '{') {
            fprintf(stderr, "torch: %s", line);
            continue;
        }
        if (mt_bench_json_get(line, "gpu", gpu, gpu_cap)) continue;
        if (!mt_bench_json_get(line, "case", name, sizeof name) ||
            !mt_bench_json_get(line, "dtype", dt, sizeof dt))
            continue;
        for (int i = 0; i < N_CASES; i++)
            for (int d = 0; d < N_DTYPES; d++)
                if (!strcmp(name, cases[i].name) && !strcmp(dt, DTYPE_LABEL[d])) {
                    res[i][d].torch_s = mt_bench_json_num(line, "s");
                    found++;
                }
    }
    if (pclose(p) != 0) fprintf(stderr, "gemm: the PyTorch side failed (%s)\n", cmd);
    return found;
}

/* ---- one (shape, dtype): operands, the cross-check, the timed runs */
typedef struct {
    int index;
    int iters, reps;
} run_opts;

#ifdef MT_BENCH_CUDART
/* max |x - ref| / max |ref| over n F32 values */
static double rel_diff(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)x[i] - (double)ref[i]));
        r = fmax(r, fabs((double)ref[i]));
    }
    return r > 0 ? d / r : d;
}

/* cuBLAS's result for the cross-check, then both sides timed, interleaved. */
static bool measure_blas(const mt_side *s, const blas_api *api, mt_tensor *ah, mt_tensor *bh,
                         const float *mine, gemm_result *r, const run_opts *o) {
    static const cudaDataType cuda_dt[N_DTYPES] = {CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F};
    mt_dtype dt = mt_dtype_of(ah);
    int di = dt == MT_F16 ? 0 : dt == MT_BF16 ? 1 : 2;
    blas_side b = {api, NULL, s->c, cuda_dt[di], blas_upload(ah), blas_upload(bh), NULL};
    size_t ybytes = (size_t)(s->c->m * s->c->n) * mt_dtype_size(dt);
    bool ok = b.a && b.b && cudaMalloc(&b.y, ybytes) == cudaSuccess &&
              api->create(&b.h) == CUBLAS_STATUS_SUCCESS && blas_call(&b) == CUBLAS_STATUS_SUCCESS;
    float *ref = ok ? host_f32(NULL, b.y, dt, s->c->m, s->c->n) : NULL;
    bool agree = true;
    if (ref) {
        r->rel_diff = rel_diff(mine, ref, s->c->m * s->c->n);
        /* one rounding of the output apart at most: an ulp of the largest value (FP16 2^-10,
           BF16 2^-7 relative); FP32 sums in another order */
        static const double tol[N_DTYPES] = {2e-3, 1e-2, 1e-4};
        if (!(r->rel_diff <= tol[di])) {
            fprintf(stderr, "gemm: %s %s: mixtape and cuBLAS differ: max rel diff %.3g > %.0e\n",
                    s->c->name, DTYPE_LABEL[di], r->rel_diff, tol[di]);
            agree = false;
        }
        for (int rep = 0; rep < o->reps; rep++) {
            r->mt_s = fmin(r->mt_s, mt_side_time(s, o->iters));
            r->blas_s = fmin(r->blas_s, blas_time(&b, o->iters));
        }
    } else {
        fprintf(stderr, "gemm: %s %s: the cuBLAS side failed (%s)\n", s->c->name, DTYPE_LABEL[di],
                cudaGetErrorString(cudaGetLastError()));
    }
    bool measured = ref != NULL && agree;
    free(ref);
    if (b.h) api->destroy(b.h);
    cudaFree(b.a);
    cudaFree(b.b);
    cudaFree(b.y);
    return measured;
}
#endif

static bool measure(const gemm_case *c, mt_dtype dt, const void *api, gemm_result *r,
                    const run_opts *o) {
    *r = (gemm_result){INFINITY, INFINITY, NAN, NAN};
    mt_device dev = MT_CUDA(o->index);
    mt_scope_begin();
    /* the operands as stored, on the host in dtype dt, then on the device */
    mt_tensor *ah =
        mt_cast(mt_randn(MT_SHAPE(c->ta ? c->k : c->m, c->ta ? c->m : c->k), MT_F32, MT_CPU), dt);
    mt_tensor *bh =
        mt_cast(mt_randn(MT_SHAPE(c->tb ? c->n : c->k, c->tb ? c->k : c->n), MT_F32, MT_CPU), dt);
    mt_tensor *a = mt_to(ah, dev), *b = mt_to(bh, dev);
    mt_side s = {c, c->ta ? mt_transpose(a, 0, 1) : a,
                 c->tb && !c->linear ? mt_transpose(b, 0, 1) : b, dev};
    mt_tensor *y = s.a && s.b ? mt_side_call(&s) : NULL;
    float *mine = y ? host_f32(y, NULL, dt, c->m, c->n) : NULL;
    bool ok = mine != NULL;
    if (!ok) fprintf(stderr, "gemm: %s: mixtape failed: %s\n", c->name, mt_last_error());
#ifdef MT_BENCH_CUDART
    if (ok && api) ok = measure_blas(&s, api, ah, bh, mine, r, o);
#endif
    if (ok && !api) /* no cuBLAS to compare with: mixtape alone */
        for (int rep = 0; rep < o->reps; rep++) r->mt_s = fmin(r->mt_s, mt_side_time(&s, o->iters));
    free(mine);
    mt_scope_end();
    if (!isfinite(r->mt_s)) r->mt_s = NAN;
    if (!isfinite(r->blas_s)) r->blas_s = NAN;
    return ok && !isnan(r->mt_s);
}

/* ---- output */
static double tflops(const gemm_case *c, double s) {
    return 2.0 * (double)c->m * (double)c->n * (double)c->k / s * 1e-12;
}

static void json_num(const char *key, double v) {
    if (isnan(v))
        printf(", \"%s\": null", key);
    else
        printf(", \"%s\": %.6g", key, v);
}

static void print_json(const char *gpu, const gemm_case *c, int d, const gemm_result *r) {
    printf("{\"bench\": \"gemm\", \"device\": \"%s\", \"emulated\": %s, \"case\": \"%s\", "
           "\"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld",
           gpu, mt_gpu_bench_emulated() ? "true" : "false", c->name, DTYPE_LABEL[d],
           (long long)c->m, (long long)c->n, (long long)c->k);
    json_num("mixtape_tflops", tflops(c, r->mt_s));
    json_num("cublas_tflops", tflops(c, r->blas_s));
    json_num("torch_tflops", tflops(c, r->torch_s));
    /* the goal's figure: mixtape's rate as a fraction of cuBLAS's (higher is better) */
    json_num("ratio_cublas", r->blas_s / r->mt_s);
    json_num("ratio_torch", r->torch_s / r->mt_s);
    json_num("max_rel_diff", r->rel_diff);
    printf("}\n");
}

static void print_table(const gemm_case *cases, gemm_result res[N_CASES][N_DTYPES]) {
    printf("\n| shape (M x N x K) | dtype | mixtape TFLOP/s | cuBLAS TFLOP/s | torch TFLOP/s | "
           "mixtape / cuBLAS | mixtape / torch | max rel diff |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < N_CASES; i++)
        for (int d = 0; d < N_DTYPES; d++) {
            const gemm_result *r = &res[i][d];
            printf("| %s | %s%s | %.4g | %.4g | %.4g | %.2f | %.2f | %.1e |\n", cases[i].name,
                   DTYPE_LABEL[d], d == 2 ? " (TF32 off)" : "", tflops(&cases[i], r->mt_s),
                   tflops(&cases[i], r->blas_s), tflops(&cases[i], r->torch_s), r->blas_s / r->mt_s,
                   r->torch_s / r->mt_s, r->rel_diff);
        }
    printf("\nmixtape / cuBLAS: the rate ratio (issue 6's goal: >= 0.60 for FP16); nan: not "
           "measured\n");
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemm [--device cuda[:N]] [--tiny] [--iters N] [--reps N] [--python PATH] "
               "[--no-torch]\n");
}

int main(int argc, char **argv) {
    const char *device = "cuda:0", *python = MT_TORCH_PYTHON;
    bool tiny = false, torch = true;
    run_opts o = {0, 20, 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tiny"))
            tiny = true;
        else if (!strcmp(a, "--no-torch"))
            torch = false;
        else if (mt_bench_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "--device"))
            device = argv[++i];
        else if (v && !strcmp(a, "--iters")) {
            if (!mt_bench_parse_int("gemm", a, argv[++i], 1, 1000000, &o.iters)) return 2;
        } else if (v && !strcmp(a, "--reps")) {
            if (!mt_bench_parse_int("gemm", a, argv[++i], 1, 10000, &o.reps)) return 2;
        } else if (v && !strcmp(a, "--python"))
            python = argv[++i];
        else {
            fprintf(stderr, "gemm: %s \"%s\"\n",
                    v ? "unknown option" : "unknown option or no value", a);
            usage(stderr);
            return 2;
        }
    }
    o.index = mt_gpu_bench_parse_device(device);
    if (o.index < 0 || strchr(python, '\'')) {
        usage(stderr);
        return 2;
    }
    if (!mt_gpu_bench_have_device("gemm", o.index)) return MT_GPU_BENCH_NO_DEVICE;
    char gpu[320], torch_gpu[160] = "";
    mt_gpu_bench_device_name(o.index, gpu, sizeof gpu);
    gemm_case cases[N_CASES];
    make_cases(tiny, cases);
    const void *api = NULL;
#ifdef MT_BENCH_CUDART
    static blas_api blas;
    if (cudaSetDevice(o.index) == cudaSuccess && blas_load(&blas)) api = &blas;
#endif
    if (!api) fprintf(stderr, "gemm: no cuBLAS to compare with: mixtape's rates only\n");
    printf("GEMM on %s: mixtape against cuBLAS (cublasGemmEx, FP32 accumulation) and torch; "
           "%d calls per run, best of %d runs\n",
           gpu, o.iters, o.reps);
    fflush(stdout);
    mt_manual_seed(1);
    mt_cuda_set_allow_tf32(false);
    static gemm_result res[N_CASES][N_DTYPES];
    bool ok = true;
    for (int i = 0; i < N_CASES; i++)
        for (int d = 0; d < N_DTYPES; d++) ok &= measure(&cases[i], DTYPES[d], api, &res[i][d], &o);
    if (torch &&
        run_torch(python, device, cases, o.iters, o.reps, res, torch_gpu, sizeof torch_gpu) == 0)
        fprintf(stderr, "gemm: no torch results (is PyTorch with CUDA installed for %s?)\n",
                python);
    if (torch_gpu[0]) printf("torch: %s\n", torch_gpu);
    for (int i = 0; i < N_CASES; i++)
        for (int d = 0; d < N_DTYPES; d++) print_json(gpu, &cases[i], d, &res[i][d]);
    print_table(cases, res);
    return ok ? 0 : 1;
}

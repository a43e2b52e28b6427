/* The fake cuBLASLt's call counters (fake_cublaslt.cpp), for tests of the emulated device:
   how many cuBLASLt calls one fused linear makes, that a cached plan skips the heuristic, and
   that every object mixtape created was destroyed again. C and C++. */
#ifndef MTEMU_CUBLASLT_COUNTS_H
#define MTEMU_CUBLASLT_COUNTS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t creates;    /* cublasLtMatmulDescCreate, MatrixLayoutCreate, PreferenceCreate */
    int64_t sets;       /* cublasLtMatmulDescSetAttribute, PreferenceSetAttribute */
    int64_t heuristics; /* cublasLtMatmulAlgoGetHeuristic */
    int64_t matmuls;    /* cublasLtMatmul */
    int64_t live;       /* descriptors, layouts and preferences created and not yet destroyed */
} mtemu_cublaslt_counts;

/* The counts since the process started (live: now). */
void mtemu_cublaslt_counts_get(mtemu_cublaslt_counts *out);

#ifdef __cplusplus
}
#endif
#endif

/* oneDNN glue of the CPU backend: the engine and stream, a per-thread cache of primitives
   keyed by shape, and arguments that bind a mixtape tensor to a primitive's memory
   descriptor (through a reorder into a scratch buffer when the layouts differ). */
#ifndef MT_CPU_DNNL_H
#define MT_CPU_DNNL_H
#include <oneapi/dnnl/dnnl.h>
#include "cpu.h"

/* Maps a failed oneDNN call to an mt error naming op and what failed; 0 on success. */
int mt_dnnl_check(const char *op, dnnl_status_t st, const char *what);
/* The CPU engine (created once), or NULL with an error naming op. */
dnnl_engine_t mt_dnnl_engine(const char *op);
/* The primitive cached under key (compared byte for byte: zero the padding), or NULL. */
dnnl_primitive_t mt_dnnl_cache_get(const void *key, size_t nbytes);
/* Creates the primitive of pd, caches it under key and returns it; takes pd in any case.
   NULL with an error. */
dnnl_primitive_t mt_dnnl_cache_put(const char *op, const void *key, size_t nbytes,
                                   dnnl_primitive_desc_t pd);
/* Whether key was stored with mt_dnnl_cache_put_none: oneDNN has no implementation for it
   (on this CPU), and the caller takes its fallback without asking again. */
bool mt_dnnl_cache_none(const void *key, size_t nbytes);
/* Remembers that oneDNN answered dnnl_unimplemented for key (sets no error; out of memory
   just skips the memo). */
void mt_dnnl_cache_put_none(const void *key, size_t nbytes);
/* The memory descriptor of one of a cached primitive's arguments (dnnl_query_*_md). */
const dnnl_memory_desc_t *mt_dnnl_query_md(dnnl_primitive_t prim, dnnl_query_t what);

/* mixtape dtype -> oneDNN data type (F32, BF16; F16 is dnnl_f16 but not used for compute). */
dnnl_data_type_t mt_dnnl_dtype(mt_dtype dt);
/* The descriptor of t as it lies in memory. groups > 1 splits a weight [OC, IC, KH, KW] into
   [G, OC / G, IC, KH, KW]. */
int mt_dnnl_md_of(const char *op, dnnl_memory_desc_t *md, const mt_tensor *t, int64_t groups);
/* A plain descriptor of dims (4-d: NCHW or NHWC order) in data type dt. */
int mt_dnnl_md_plain(const char *op, dnnl_memory_desc_t *md, int ndim, const int64_t *dims,
                     dnnl_data_type_t dt, bool channels_last);

/* A tensor bound to a primitive argument: `mem` has the primitive's descriptor, over the
   tensor's memory when the descriptors agree, else over a scratch buffer that an input is
   reordered into before the primitive runs and an output is reordered out of afterwards. */
typedef struct {
    dnnl_memory_t user, mem;
    void *scratch;
    size_t nbytes;
    bool output;
} mt_dnnl_arg;
int mt_dnnl_bind(const char *op, mt_dnnl_arg *a, const mt_tensor *t, const dnnl_memory_desc_t *user,
                 const dnnl_memory_desc_t *want, bool output);
/* Runs prim with args, then reorders the outputs bound through scratch back. */
int mt_dnnl_execute(const char *op, dnnl_primitive_t prim, int n, const int *kinds,
                    mt_dnnl_arg *args);
void mt_dnnl_release(mt_dnnl_arg *args, int n);
#endif

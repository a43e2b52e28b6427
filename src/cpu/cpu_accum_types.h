/* Instantiates a kernel template header once per accumulation type: T = float (F32, F16 and
   BF16 data) and T = double (F64), so both precisions share one text. The includer defines
   MT_ACCUM_IMPL as the template's file name; the template uses T, SFX(name) (name_f or
   name_d), LOAD, STORE, SQRT and NATIVE (the dtype whose data is T: read and written in
   place, without LOAD or STORE). Included without a guard, once per template. */
#define T      float
#define SFX(n) n##_f
#define LOAD   mt_cpu_load_f32
#define STORE  mt_cpu_store_f32
#define SQRT   sqrtf
#define NATIVE MT_F32
#include MT_ACCUM_IMPL
#undef T
#undef SFX
#undef LOAD
#undef STORE
#undef SQRT
#undef NATIVE
#define T      double
#define SFX(n) n##_d
#define LOAD   mt_cpu_load_f64
#define STORE  mt_cpu_store_f64
#define SQRT   sqrt
#define NATIVE MT_F64
#include MT_ACCUM_IMPL
#undef T
#undef SFX
#undef LOAD
#undef STORE
#undef SQRT
#undef NATIVE
#undef MT_ACCUM_IMPL

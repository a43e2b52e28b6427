/* The two channel/row sums every normalisation kernel needs, for one accumulation type T
   (included by the norm kernel templates, which define T and SFX): sa = sum(a - ka) and
   sab = sum((a - ka) * (b - kb)). Written with 32-byte vector types (GCC and clang vector
   extensions; plain SSE2 pairs where AVX is missing) and two accumulators each: a scalar
   accumulator is a serial chain of dependent adds, and GCC turns an array of lanes into
   shuffle-heavy code here. */
typedef T SFX(vec) __attribute__((vector_size(32)));
enum { SFX(VN) = 32 / (int)sizeof(T) };

/* a macro, not a function: a 32-byte vector passed or returned by value changes the ABI
   on targets without AVX (GCC and clang warn), while local ones just split in two */
#define NORM_VLOAD(v, p) memcpy(&(v), (p), sizeof(v))

/* always inlined, so that a caller compiled per x86-64 level (MT_CPU_CLONES) runs these
   vectors as AVX/AVX-512 code rather than the baseline's SSE2 pairs */
MT_CPU_INLINE void SFX(sums2)(const T *restrict a, T ka, const T *restrict b, T kb, int64_t m,
                              T *sa, T *sab) {
    const int vn = SFX(VN);
    SFX(vec) a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    int64_t i = 0;
    for (; i + 2 * vn <= m; i += 2 * vn) {
        SFX(vec) x0, x1, y0, y1;
        NORM_VLOAD(x0, a + i);
        NORM_VLOAD(x1, a + i + vn);
        NORM_VLOAD(y0, b + i);
        NORM_VLOAD(y1, b + i + vn);
        SFX(vec) d0 = x0 - ka, d1 = x1 - ka;
        a0 += d0;
        a1 += d1;
        b0 += d0 * (y0 - kb);
        b1 += d1 * (y1 - kb);
    }
    a0 += a1;
    b0 += b1;
    T ta = 0, tb = 0;
    for (int j = 0; j < vn; j++) {
        ta += a0[j];
        tb += b0[j];
    }
    for (; i < m; i++) {
        T d = a[i] - ka;
        ta += d;
        tb += d * (b[i] - kb);
    }
    *sa = ta;
    *sab = tb;
}
#undef NORM_VLOAD

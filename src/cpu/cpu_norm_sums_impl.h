/* The two channel/row sums every normalisation kernel needs, for one accumulation type T
   (included by the norm kernel templates, which define T, SFX and LANES): sa = sum(a - ka)
   and sab = sum((a - ka) * (b - kb)). The sums run in LANES independent lanes, which GCC
   vectorises (a single accumulator is a serial chain of dependent adds, 4-8x slower). */
static void SFX(sums2)(const T *restrict a, T ka, const T *restrict b, T kb, int64_t m, T *sa,
                       T *sab) {
    T la[LANES] = {0}, lb[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= m; i += LANES)
        for (int j = 0; j < LANES; j++) {
            T d = a[i + j] - ka;
            la[j] += d;
            lb[j] += d * (b[i + j] - kb);
        }
    T ta = 0, tb = 0;
    for (; i < m; i++) {
        T d = a[i] - ka;
        ta += d;
        tb += d * (b[i] - kb);
    }
    for (int w = LANES / 2; w > 0; w /= 2) /* pairwise over the lanes */
        for (int j = 0; j < w; j++) {
            la[j] += la[j + w];
            lb[j] += lb[j + w];
        }
    *sa = la[0] + ta;
    *sab = lb[0] + tb;
}

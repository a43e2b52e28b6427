/* ThreadSanitizer builds only (meson -Db_sanitize=thread; test/meson.build adds this file to
   every test program). GCC 12's TSan intercepts the pthread functions but not C11's
   <threads.h>: glibc's mtx_lock, call_once and thrd_create call its internal pthread code
   directly, so TSan sees no lock, no once-barrier and no thread start, reports every access
   under a mtx_t as a race, and crashes in threads made by thrd_create. These definitions,
   in the test program, take the place of libc's for the whole process (the library's calls
   included) and go through the intercepted pthread calls, so TSan sees the real
   synchronisation. glibc's C11 types are its pthread types under other names (mtx_t is a
   pthread_mutex_t, once_flag a pthread_once_t, tss_t a pthread_key_t); the asserts below
   check that on the build machine. */
#include <errno.h>
#include <pthread.h>
#include <threads.h>

_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t), "mtx_t is a pthread_mutex_t");
_Static_assert(sizeof(once_flag) == sizeof(pthread_once_t), "once_flag is a pthread_once_t");
_Static_assert(sizeof(tss_t) == sizeof(pthread_key_t), "tss_t is a pthread_key_t");

static int c11_result(int pthread_rc) {
    return pthread_rc == 0 ? thrd_success : thrd_error;
}

int mtx_init(mtx_t *m, int type) {
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0) return thrd_error;
    if (type & mtx_recursive) pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init((pthread_mutex_t *)m, &a);
    pthread_mutexattr_destroy(&a);
    return c11_result(rc);
}

int mtx_lock(mtx_t *m) {
    return c11_result(pthread_mutex_lock((pthread_mutex_t *)m));
}

int mtx_trylock(mtx_t *m) {
    int rc = pthread_mutex_trylock((pthread_mutex_t *)m);
    return rc == 0 ? thrd_success : rc == EBUSY ? thrd_busy : thrd_error;
}

int mtx_unlock(mtx_t *m) {
    return c11_result(pthread_mutex_unlock((pthread_mutex_t *)m));
}

void mtx_destroy(mtx_t *m) {
    pthread_mutex_destroy((pthread_mutex_t *)m);
}

void call_once(once_flag *flag, void (*fn)(void)) {
    pthread_once((pthread_once_t *)flag, fn);
}

int tss_create(tss_t *key, tss_dtor_t dtor) {
    return c11_result(pthread_key_create((pthread_key_t *)key, dtor));
}

void *tss_get(tss_t key) {
    return pthread_getspecific((pthread_key_t)key);
}

int tss_set(tss_t key, void *value) {
    return c11_result(pthread_setspecific((pthread_key_t)key, value));
}

void tss_delete(tss_t key) {
    pthread_key_delete((pthread_key_t)key);
}

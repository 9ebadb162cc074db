/* A wall clock moved by FAKE_CLOCK_OFFSET_US microseconds (signed, read once at load), for a
 * process started with LD_PRELOAD of this file compiled as a shared object (tests/it/common/
 * fake_clock.rs builds it with `cc`). CLOCK_REALTIME (and its coarse variant), gettimeofday and
 * time move; the monotonic clocks do not (nothing jumps: a process starts where the test wants
 * its calendar to be, and runs at the real pace). libfaketime 0.9.10 hangs Debian's jemalloc
 * redis-server; this does not (run Redis with `jemalloc-bg-thread no`). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long offset_us;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void fake_clock_init(void) {
    const char *s = getenv("FAKE_CLOCK_OFFSET_US");
    offset_us = s ? atoll(s) : 0;
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    if (!real_clock_gettime) {
        fake_clock_init();
    }
    int r = real_clock_gettime(clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us * 1000LL;
        ts->tv_sec = (time_t)(ns / 1000000000LL);
        ts->tv_nsec = (long)(ns % 1000000000LL);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}

// A wall-clock sampling profiler of one thread, for processes that cannot be run under `perf`
// (the GPU machine has none). Preloaded into any process, it samples the call stack of the
// thread that loads it (the main thread: lmx's trainer and the Python anchor both train there)
// every LMX_SAMPLE_US microseconds of wall time (default 200), blocked or running, and at exit
// writes the raw stacks and the process's memory map to LMX_SAMPLE_OUT, for
// bench/host_profile.py to symbolize against the same binaries elsewhere:
//
//     gcc -shared -fPIC -O2 bench/host_sampler.c -o sampler.so -lrt
//     LMX_SAMPLE_OUT=lmx.stacks LD_PRELOAD=./sampler.so lmx --device gpu bench train --one-row ...
//
// The output: `maps` lines copied from /proc/self/maps, then one line per sample: `stack`
// followed by the return addresses, innermost first, in hex. Sampling starts once
// LMX_SAMPLE_SKIP_S seconds (default 0) have passed, so that start-up can be left out.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { max_depth = 64, max_samples = 200000 };

struct sample {
    int depth;
    void *frames[max_depth];
};

static struct sample *samples;
static atomic_int taken;
static timer_t timer;
static int sampling;

static void on_tick(int signal, siginfo_t *info, void *context) {
    (void)signal;
    (void)info;
    (void)context;
    int index = atomic_fetch_add(&taken, 1);
    if (index >= max_samples) {
        return;
    }
    samples[index].depth = backtrace(samples[index].frames, max_depth);
}

static void write_samples(void) {
    if (!sampling) {
        return;
    }
    timer_delete(timer);
    const char *path = getenv("LMX_SAMPLE_OUT");
    FILE *out = fopen(path, "w");
    if (!out) {
        perror(path);
        return;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        fprintf(out, "maps %s", line);
    }
    if (maps) {
        fclose(maps);
    }
    int count = atomic_load(&taken);
    if (count > max_samples) {
        count = max_samples;
    }
    // Frames 0 and 1 are this handler and the kernel's signal trampoline.
    for (int i = 0; i < count; i++) {
        fputs("stack", out);
        for (int frame = 2; frame < samples[i].depth; frame++) {
            fprintf(out, " %lx", (unsigned long)samples[i].frames[frame]);
        }
        fputc('\n', out);
    }
    fclose(out);
}

__attribute__((constructor)) static void start_sampling(void) {
    if (!getenv("LMX_SAMPLE_OUT")) {
        return;
    }
    const char *period_us = getenv("LMX_SAMPLE_US");
    const char *skip_s = getenv("LMX_SAMPLE_SKIP_S");
    long period = period_us ? atol(period_us) : 200;
    double skip = skip_s ? atof(skip_s) : 0.0;
    samples = mmap(NULL, sizeof(struct sample) * max_samples, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (samples == MAP_FAILED) {
        perror("host_sampler: mmap");
        return;
    }
    // The first backtrace loads the unwinder, which must not happen inside the handler.
    void *warm[4];
    backtrace(warm, 4);

    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_tick;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPROF, &action, NULL);

    struct sigevent event;
    memset(&event, 0, sizeof event);
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGPROF;
    event._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) {
        perror("host_sampler: timer_create");
        return;
    }
    struct itimerspec spec;
    spec.it_interval.tv_sec = period / 1000000;
    spec.it_interval.tv_nsec = (period % 1000000) * 1000;
    long first_ns = (long)(skip * 1e9) + period * 1000;
    spec.it_value.tv_sec = first_ns / 1000000000;
    spec.it_value.tv_nsec = first_ns % 1000000000;
    timer_settime(timer, 0, &spec, NULL);
    sampling = 1;
    atexit(write_samples);
}

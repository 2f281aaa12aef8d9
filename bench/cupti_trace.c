/* A GPU timeline for any process, through CUPTI's activity API: preload it and every kernel,
 * copy, memset, driver and runtime call and unified-memory event of the process is written to
 * $LMX_TRACE_OUT, one tab-separated line each, for bench/trace_summary.py to read.
 *
 *     gcc -shared -fPIC -O2 -I$CUPTI/include bench/cupti_trace.c -o cupti_trace.so \
 *         $CUPTI/lib/libcupti.so.13
 *     LMX_TRACE_OUT=lmx.tsv LD_PRELOAD=./cupti_trace.so lmx --device gpu bench train --one-row ...
 *
 * It exists because the GPU machine's Nsight Systems cannot import its own captures
 * (docs/benchmarks.md); it traces a Rust binary and a Python process alike. It follows the one
 * process it is preloaded into: the processes that one starts run untraced. Built against
 * CUPTI 13.0's headers (the record layouts named below). Lines:
 *     K start end stream name         a kernel (ns; CUPTI puts GPU and host times on one clock)
 *     M start end stream kind:bytes   a copy (kind: CUPTI's copy kind, 1 = host to device)
 *     S start end stream bytes        a memset
 *     D start end thread name         a driver API call
 *     R start end thread name         a runtime API call (which makes driver calls of its own)
 *     U start end kind value          a unified-memory event (page faults, migrations)
 * A line "# dropped N" at the end counts the records CUPTI had to drop.
 */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_SIZE (8u << 20)

static FILE *out;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_SubscriberHandle subscriber;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_SIZE);
    *size = BUFFER_SIZE;
    *max_records = 0;
}

static const char *api_name(CUpti_CallbackDomain domain, uint32_t cbid) {
    const char *name = NULL;
    if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "?";
    return name;
}

/* One line: a tag, an interval, a number and a text. */
static void line(char tag, uint64_t start, uint64_t end, unsigned number, const char *text) {
    fprintf(out, "%c\t%llu\t%llu\t%u\t%s\n", tag, (unsigned long long)start,
            (unsigned long long)end, number, text);
}

static void write_record(CUpti_Activity *record) {
    char text[64];
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
        CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
        line('K', k->start, k->end, k->streamId, k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
        snprintf(text, sizeof text, "%u:%llu", m->copyKind, (unsigned long long)m->bytes);
        line('M', m->start, m->end, m->streamId, text);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
        snprintf(text, sizeof text, "%llu", (unsigned long long)m->bytes);
        line('S', m->start, m->end, m->streamId, text);
        break;
    }
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
        CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)record;
        int driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
        CUpti_CallbackDomain domain =
            driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
        line(driver ? 'D' : 'R', a->start, a->end, a->threadId, api_name(domain, a->cbid));
        break;
    }
    case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
        CUpti_ActivityUnifiedMemoryCounter3 *u = (CUpti_ActivityUnifiedMemoryCounter3 *)record;
        snprintf(text, sizeof text, "%llu", (unsigned long long)u->value);
        line('U', u->start, u->end, u->counterKind, text);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&out_lock);
    while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        write_record(record);
    pthread_mutex_unlock(&out_lock);
    free(buffer);
}

/* A context about to go away takes its undelivered records with it: deliver them first. */
static void CUPTIAPI on_resource(void *data, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                                 const void *info) {
    (void)data;
    (void)info;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
        cuptiActivityFlushAll(1);
}

static void enable_unified_memory_counters(void) {
    CUpti_ActivityUnifiedMemoryCounterConfig config[3];
    CUpti_ActivityUnifiedMemoryCounterKind kinds[3] = {
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
    };
    for (int i = 0; i < 3; i++) {
        config[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
        config[i].kind = kinds[i];
        config[i].deviceId = 0;
        config[i].enable = 1;
    }
    if (cuptiActivityConfigureUnifiedMemoryCounter(config, 3) == CUPTI_SUCCESS)
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
    else
        fprintf(stderr, "cupti_trace: unified-memory counters are not available\n");
}

/* Reports a failed CUPTI call; 1 when it failed. */
static int failed(CUptiResult result, const char *what) {
    if (result == CUPTI_SUCCESS) return 0;
    const char *message = NULL;
    cuptiGetResultString(result, &message);
    fprintf(stderr, "cupti_trace: %s failed: %s\n", what, message ? message : "?");
    return 1;
}

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("LMX_TRACE_OUT");
    if (!path || !*path) return;
    /* A child process (the anchor's Python, a compiler) must not write over the parent's. */
    unsetenv("LMX_TRACE_OUT");
    unsetenv("LD_PRELOAD");
    out = fopen(path, "w");
    if (!out) {
        perror("cupti_trace: cannot open LMX_TRACE_OUT");
        return;
    }
    if (!failed(cuptiSubscribe(&subscriber, on_resource, NULL), "cuptiSubscribe"))
        failed(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                                   CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
               "the context-destroy callback");
    int broken = failed(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                        "cuptiActivityRegisterCallbacks");
    const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_DRIVER,
        CUPTI_ACTIVITY_KIND_RUNTIME,
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        broken |= failed(cuptiActivityEnable(kinds[i]), "cuptiActivityEnable");
    if (broken) fprintf(stderr, "cupti_trace: the trace in %s is incomplete\n", path);
    enable_unified_memory_counters();
}

__attribute__((destructor)) static void stop(void) {
    if (!out) return;
    cuptiActivityFlushAll(1);
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped);
    pthread_mutex_lock(&out_lock);
    fprintf(out, "# dropped %zu\n", dropped);
    if (dropped) fprintf(stderr, "cupti_trace: CUPTI dropped %zu records\n", dropped);
    fclose(out);
    out = NULL;
    pthread_mutex_unlock(&out_lock);
}

// A CUPTI injection library: every kernel's start, end, stream and name
// (and every memset's and copy's), one CSV line each, to $KTRACE_OUT.<pid>. Loaded by the driver through
// CUDA_INJECTION64_PATH; flushed by a thread of its own every 50 ms, since
// a Go process exits without running atexit handlers.
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif

static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI req(uint8_t **buf, size_t *size, size_t *max) {
    *size = 16 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max = 0;
}

static void CUPTIAPI done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&mu);
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            KREC *k = (KREC *)r;
            fprintf(out, "%llu,%llu,%u,%d,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                    k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->registersPerThread, k->name);
        }
#ifdef MSREC
        // Memsets and copies, as pseudo-kernels named [memset N] and
        // [memcpy N] (N bytes): graph nodes too, which a kernel-only
        // timeline shows as gaps.
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            MSREC *m = (MSREC *)r;
            fprintf(out, "%llu,%llu,%u,0,0,0,[memset %llu]\n", (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                    (unsigned long long)m->bytes);
        }
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            MCREC *m = (MCREC *)r;
            fprintf(out, "%llu,%llu,%u,0,0,0,[memcpy %llu]\n", (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                    (unsigned long long)m->bytes);
        }
#endif
    }
    fflush(out);
    pthread_mutex_unlock(&mu);
    free(buf);
}

static void *flusher(void *arg) {
    for (;;) {
        usleep(50000);
        cuptiActivityFlushAll(0);
    }
    return NULL;
}

int InitializeInjection(void) {
    const char *p = getenv("KTRACE_OUT");
    char name[512];
    snprintf(name, sizeof name, "%s.%d", p ? p : "/tmp/ktrace.csv", (int)getpid());
    out = fopen(name, "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(req, done) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
#ifdef MSREC
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
#endif
    pthread_t t;
    pthread_create(&t, NULL, flusher, NULL);
    pthread_detach(t);
    return 1;
}

/* tests/fakecuda/nvtx3/nvToolsExt.h - the part of NVTX that pipeline_cuda.h uses under PP_NVTX
   (nvtxRangePushEx, nvtxRangePop), for host builds over the CUDA imitation. Each thread keeps
   its own stack of range names, as a profiler would see them; fakenvtx_log() reads what was
   pushed (in order, up to FAKENVTX_LOG), and the counters say how many pushes, pops, pops of an
   empty stack, and ranges still open when their thread ended. Header-only, one process.
   Imitated from the CUDA toolkit's nvtx3/nvToolsExt.h (NVTX 3): nvtxEventAttributes_t (its
   version, size, colorType/color, messageType/message fields, as the real v2 struct names
   them), nvtxRangePushEx and nvtxRangePop, whose documented rule is a per-thread stack (a pop
   ends the range its own thread pushed last); check-nvtx compiles pipeline_cuda.h against the
   real header. */
#ifndef FAKE_NVTX3_NVTOOLSEXT_H
#define FAKE_NVTX3_NVTOOLSEXT_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define NVTX_VERSION 3
#define NVTX_COLOR_ARGB 1
#define NVTX_MESSAGE_TYPE_ASCII 1
#define NVTX_NO_PUSH_POP_TRACKING (-2)

typedef union nvtxMessageValue_t {
    const char* ascii;
    const void* unicode;
} nvtxMessageValue_t;

typedef struct nvtxEventAttributes_t {
    uint16_t version, size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType, reserved0;
    uint64_t payload;
    int32_t messageType;
    nvtxMessageValue_t message;
} nvtxEventAttributes_t;
#define NVTX_EVENT_ATTRIB_STRUCT_SIZE ((uint16_t)sizeof(nvtxEventAttributes_t))

#ifndef FAKENVTX_LOG
#define FAKENVTX_LOG 4096
#endif
#define FAKENVTX_DEPTH 16

typedef struct fakenvtx_stack {
    int depth;
    char name[FAKENVTX_DEPTH][48];
} fakenvtx_stack;

static pthread_mutex_t fakenvtx_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fakenvtx_once = PTHREAD_ONCE_INIT;
static pthread_key_t fakenvtx_key;
static char fakenvtx_names[FAKENVTX_LOG][48];
static uint32_t fakenvtx_colors[FAKENVTX_LOG];
static int fakenvtx_n, fakenvtx_pushes, fakenvtx_pops, fakenvtx_bad_pops, fakenvtx_left_open;

static void fakenvtx_thread_end(void* p) { /* the thread ended with its stack as it was */
    fakenvtx_stack* s = (fakenvtx_stack*)p;
    pthread_mutex_lock(&fakenvtx_mu);
    fakenvtx_left_open += s->depth;
    pthread_mutex_unlock(&fakenvtx_mu);
    free(s);
}
static void fakenvtx_init(void) { (void)pthread_key_create(&fakenvtx_key, fakenvtx_thread_end); }

static void fakenvtx_copy(char* dst, const char* src) { /* at most 47 characters and the 0 */
    int i = 0;
    for (; src[i] && i < 47; i++) dst[i] = src[i];
    dst[i] = 0;
}

static fakenvtx_stack* fakenvtx_mine(void) {
    fakenvtx_stack* s;
    (void)pthread_once(&fakenvtx_once, fakenvtx_init);
    if (!(s = (fakenvtx_stack*)pthread_getspecific(fakenvtx_key))) {
        s = (fakenvtx_stack*)calloc(1, sizeof *s);
        if (s) (void)pthread_setspecific(fakenvtx_key, s);
    }
    return s;
}

static inline int nvtxRangePushEx(const nvtxEventAttributes_t* ea) {
    fakenvtx_stack* s = fakenvtx_mine();
    const char* m = ea && ea->messageType == NVTX_MESSAGE_TYPE_ASCII && ea->message.ascii ? ea->message.ascii : "?";
    if (!s) return NVTX_NO_PUSH_POP_TRACKING;
    if (s->depth < FAKENVTX_DEPTH) fakenvtx_copy(s->name[s->depth], m);
    pthread_mutex_lock(&fakenvtx_mu);
    fakenvtx_pushes++;
    if (fakenvtx_n < FAKENVTX_LOG) {
        fakenvtx_copy(fakenvtx_names[fakenvtx_n], m);
        fakenvtx_colors[fakenvtx_n++] = ea ? ea->color : 0;
    }
    pthread_mutex_unlock(&fakenvtx_mu);
    return s->depth++;
}

static inline int nvtxRangePop(void) {
    fakenvtx_stack* s = fakenvtx_mine();
    int bad = !s || s->depth == 0;
    pthread_mutex_lock(&fakenvtx_mu);
    if (bad) fakenvtx_bad_pops++;
    else fakenvtx_pops++;
    pthread_mutex_unlock(&fakenvtx_mu);
    return bad ? -1 : --s->depth;
}

/* the i-th range pushed since the start (NULL past the end), and its colour */
static inline const char* fakenvtx_log(int i, uint32_t* color) {
    const char* n = NULL;
    pthread_mutex_lock(&fakenvtx_mu);
    if (i >= 0 && i < fakenvtx_n) {
        n = fakenvtx_names[i];
        if (color) *color = fakenvtx_colors[i];
    }
    pthread_mutex_unlock(&fakenvtx_mu);
    return n;
}

/* pushes, pops, pops with nothing open on their thread, ranges open when their thread ended */
static inline void fakenvtx_counts(int* pushes, int* pops, int* bad_pops, int* left_open) {
    pthread_mutex_lock(&fakenvtx_mu);
    *pushes = fakenvtx_pushes;
    *pops = fakenvtx_pops;
    *bad_pops = fakenvtx_bad_pops;
    *left_open = fakenvtx_left_open;
    pthread_mutex_unlock(&fakenvtx_mu);
}

static inline void fakenvtx_clear(void) {
    pthread_mutex_lock(&fakenvtx_mu);
    fakenvtx_n = fakenvtx_pushes = fakenvtx_pops = fakenvtx_bad_pops = fakenvtx_left_open = 0;
    pthread_mutex_unlock(&fakenvtx_mu);
}

#endif

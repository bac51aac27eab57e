/* tools/conn_probe.cu - do CUDA streams beyond CUDA_DEVICE_MAX_CONNECTIONS share a hardware work
   queue, so that one stream's wait holds up another's kernel (a "false dependency")?

   tests/fakecuda models it (FAKECUDA_MAX_CONNECTIONS): streams round-robin onto the queues, and
   a queue runs its operations in enqueue order whatever their stream. Under that model
   pipeline_nccl.h needs its channels' streams and the compute stream on separate queues. This
   probe asks the GPU. It makes N streams (default 16); for each k >= 2: stream 1 runs a kernel
   that spins until a flag is set (at most about a second), stream 0 waits for it (an event),
   then stream k runs the kernel that sets the flag. On queues of their own, k's kernel runs at
   once and releases the spin; if k shares stream 0's queue, it waits behind stream 0's wait,
   which waits for the spin: it finishes only when the spin gives up (so does it behind the spin
   itself, sharing stream 1's). Prints, for each k, how long its kernel took, and "shares a
   queue" when it waited for the spin.
     build/conn_probe [N]      CUDA_DEVICE_MAX_CONNECTIONS=32 build/conn_probe 16 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__global__ void spin(volatile int* flag, long long limit) {
    long long t0 = clock64();
    while (*flag == 0 && clock64() - t0 < limit) {
    }
}

__global__ void set_flag(int* flag) { atomicExch(flag, 1); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "conn_probe: %s: %s\n", #x, cudaGetErrorString(e_));               \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 16, k, clock_khz = 0, shared = 0;
    const char* env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    cudaStream_t s[64];
    cudaEvent_t spun, done;
    int* flag;
    long long limit;
    if (n < 3 || n > 64) n = 16;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    limit = (long long)clock_khz * 1000LL; /* about a second of spinning */
    for (k = 0; k < n; k++) CK(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&spun, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaMalloc(&flag, sizeof(int)));
    printf("conn_probe: %d streams, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", n, env ? env : "(unset: 8)");
    for (k = 2; k < n; k++) {
        double t0, dt;
        CK(cudaMemset(flag, 0, sizeof(int)));
        CK(cudaDeviceSynchronize());
        spin<<<1, 1, 0, s[1]>>>(flag, limit);
        CK(cudaEventRecord(spun, s[1]));
        CK(cudaStreamWaitEvent(s[0], spun, 0));
        t0 = now_s();
        set_flag<<<1, 1, 0, s[k]>>>(flag);
        CK(cudaEventRecord(done, s[k]));
        CK(cudaEventSynchronize(done));
        dt = now_s() - t0;
        CK(cudaDeviceSynchronize());
        printf("stream %2d: its kernel done after %8.3f ms%s\n", k, 1e3 * dt, dt > 0.3 ? "  shares a queue with stream 0 or 1" : "");
        shared += dt > 0.3;
    }
    printf("conn_probe: %d of %d streams waited behind stream 0's wait or stream 1's spin (false dependencies)\n", shared, n - 2);
    return 0;
}

/* tests/fuzz/fuzz.h - shared pieces of the fuzz targets: a byte reader, a check that traps (so
   libFuzzer reports it with the input), and, with -DPP_FUZZ_STANDALONE, a main() that replays
   the seed corpus and a fixed number of pseudo-random inputs without libFuzzer (make test runs
   it under ASan+UBSan with gcc; make fuzz runs the real fuzzer with clang).
   Include after pipeline.h; define FUZZ_NAME ("fuzz_split") first. */
#ifndef PP_FUZZ_H
#define PP_FUZZ_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz {
    const uint8_t* p;
    size_t n, at;
} fz;

static inline uint32_t fz_u8(fz* f) { return f->at < f->n ? f->p[f->at++] : 0; }
static inline uint32_t fz_u16(fz* f) { return fz_u8(f) | (fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz* f) { return fz_u16(f) | (fz_u16(f) << 16); }
static inline int fz_left(const fz* f) { return f->at < f->n; }

/* A failed invariant: say which, then trap so the fuzzer keeps the input. */
#define FZ_CHECK(cond, ...)                                                   \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            __builtin_trap();                                                 \
        }                                                                     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#ifdef PP_FUZZ_STANDALONE
#include <dirent.h>

#ifndef FUZZ_RANDOM_RUNS
#define FUZZ_RANDOM_RUNS 3000
#endif

static size_t fz_replay_file(const char* path) {
    FILE* f = fopen(path, "rb");
    uint8_t buf[1 << 16];
    size_t n;
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    return 1;
}

/* Usage: fuzz-run [corpus dir or file ...] [-runs=N]; no argument replays
   tests/fuzz/corpus/FUZZ_NAME and FUZZ_RANDOM_RUNS random inputs. */
int main(int argc, char** argv) {
    const char* dirs[64];
    int nd = 0, i;
    long runs = FUZZ_RANDOM_RUNS, k;
    size_t files = 0;
    uint64_t s = 0x243F6A8885A308D3ull;
    char path[1024];
    for (i = 1; i < argc && nd < 64; i++) {
        if (strncmp(argv[i], "-runs=", 6) == 0)
            runs = atol(argv[i] + 6);
        else
            dirs[nd++] = argv[i];
    }
    if (nd == 0) dirs[nd++] = "tests/fuzz/corpus/" FUZZ_NAME;
    for (i = 0; i < nd; i++) {
        DIR* d = opendir(dirs[i]);
        struct dirent* e;
        if (!d) {
            files += fz_replay_file(dirs[i]);
            continue;
        }
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", dirs[i], e->d_name);
            files += fz_replay_file(path);
        }
        closedir(d);
    }
    for (k = 0; k < runs; k++) {
        uint8_t buf[512];
        size_t n, j;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        n = (size_t)(s >> 33) % sizeof buf;
        for (j = 0; j < n; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            buf[j] = (uint8_t)(s >> 56);
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("%s: replayed %zu corpus files and %ld random inputs without a finding\n", FUZZ_NAME, files, runs);
    printf("%s: %ld passed, 0 failed\n", FUZZ_NAME, (long)files + runs);
    return 0;
}
#endif
#endif

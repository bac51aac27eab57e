/* tests/consumer/companions.c - compiles and links one companion header with its implementation
   through its CMake target (pipeline::cuda, ::nccl or ::mpi), and runs without calling into CUDA,
   NCCL or MPI: the target's include directories, libraries and the headers' versions agree. */
#define PIPELINE_IMPLEMENTATION
#if defined(PP_CONSUMER_CUDA)
#include "pipeline_cuda.h"
#define WHAT "pipeline_cuda.h", PP_CUDA_VERSION
#elif defined(PP_CONSUMER_NCCL)
#include "pipeline_nccl.h"
#define WHAT "pipeline_nccl.h", PP_NCCL_VERSION
#else
#include "pipeline_mpi.h"
#define WHAT "pipeline_mpi.h", PP_MPI_VERSION
#endif
#include <stdio.h>

static int report(const char* header, int version) {
    printf("companion: %s %d with pipeline.h %s: %s\n", header, version, PP_VERSION_STRING,
           version == PP_VERSION ? "same release" : "DIFFERENT");
    return version != PP_VERSION;
}

int main(void) { return report(WHAT); }

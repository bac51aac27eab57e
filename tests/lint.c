/* tests/lint.c - the translation unit make lint hands to clang-tidy: every header, implementation included. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"

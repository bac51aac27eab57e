/* The implementation file of the link check (make check-abi): built once with the defaults and
   once with PP_MAX_TENSORS=8; tests/abi_user.c, built with the defaults, links only with the
   first. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"

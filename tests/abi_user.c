/* A file of the program that includes pipeline.h with the default configuration and calls
   pp_stage_create (make check-abi). */
#include "../pipeline.h"

int main(void) {
    pp_error err;
    pp_stage* st = NULL;
    return pp_stage_create(NULL, &st, &err) == PP_ERR_INVALID ? 0 : 1;
}

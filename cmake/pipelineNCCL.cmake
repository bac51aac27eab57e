# cmake/pipelineNCCL.cmake - finds NCCL for pipeline::nccl and makes the imported target
# NCCL::nccl (unless one exists already). Used by CMakeLists.txt and, installed beside it, by
# pipelineConfig.cmake. Where it looks, in order: NCCL_HOME and NCCL_ROOT (CMake or environment
# variables), the NCCL of the Python wheel (nvidia-nccl-cu12 and the like: site-packages/nvidia/nccl,
# whose library is only libnccl.so.2), the CUDA toolkit, the system. Sets PIPELINE_NCCL_FOUND,
# PIPELINE_NCCL_INCLUDE_DIR and PIPELINE_NCCL_LIBRARY (cache: set them to choose another NCCL).
# pipeline_find_nccl([GLOBAL] [HINTS dir...])
function(pipeline_find_nccl)
  cmake_parse_arguments(arg "GLOBAL" "" "HINTS" ${ARGN})
  set(PIPELINE_NCCL_FOUND FALSE PARENT_SCOPE)
  if(TARGET NCCL::nccl)
    set(PIPELINE_NCCL_FOUND TRUE PARENT_SCOPE)
    return()
  endif()
  set(hints ${NCCL_HOME} ${NCCL_ROOT} $ENV{NCCL_HOME} $ENV{NCCL_ROOT} ${arg_HINTS})
  if(NOT PIPELINE_NCCL_INCLUDE_DIR OR NOT PIPELINE_NCCL_LIBRARY)
    find_program(_pipeline_python NAMES python3 python)
    if(_pipeline_python)
      execute_process(COMMAND "${_pipeline_python}" -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
                      OUTPUT_VARIABLE wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND wheel)
        list(APPEND hints "${wheel}")
      endif()
    endif()
  endif()
  set(cuda_dirs "")
  if(CUDAToolkit_INCLUDE_DIRS)
    list(APPEND cuda_dirs ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_DIR}/..")
  endif()
  find_path(PIPELINE_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} PATH_SUFFIXES include PATHS ${cuda_dirs}
            DOC "the directory of NCCL's nccl.h")
  find_library(PIPELINE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${hints} PATH_SUFFIXES lib lib64
               PATHS ${cuda_dirs} DOC "NCCL's library (libnccl.so or libnccl.so.2)")
  if(PIPELINE_NCCL_INCLUDE_DIR AND PIPELINE_NCCL_LIBRARY)
    if(arg_GLOBAL)
      add_library(NCCL::nccl UNKNOWN IMPORTED GLOBAL)
    else()
      add_library(NCCL::nccl UNKNOWN IMPORTED)
    endif()
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${PIPELINE_NCCL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${PIPELINE_NCCL_INCLUDE_DIR}")
    set(PIPELINE_NCCL_FOUND TRUE PARENT_SCOPE)
  endif()
endfunction()

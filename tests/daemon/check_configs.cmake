# cmake -DKVTIERD=<exe> -DCONFIGS=<dir> -P check_configs.cmake
# Every *.yaml in CONFIGS and CONFIGS/examples passes `kvtierd --check-config`
# (which only parses, so a cuda config validates without a GPU), and every key
# kvtierd prints for the default configuration is documented in kvtierd.yaml.
file(GLOB _configs "${CONFIGS}/*.yaml" "${CONFIGS}/examples/*.yaml")
list(LENGTH _configs _n)
if(_n LESS 3)
  message(FATAL_ERROR "expected kvtierd.yaml and the examples in ${CONFIGS}, found: ${_configs}")
endif()
foreach(_config IN LISTS _configs)
  execute_process(COMMAND "${KVTIERD}" --check-config --config "${_config}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "kvtierd --check-config --config ${_config} exited with ${_rc}:\n${_err}")
  endif()
  message(STATUS "ok: ${_config}")
  if(_config STREQUAL "${CONFIGS}/kvtierd.yaml")
    set(_effective "${_out}")
  endif()
endforeach()

# --check-config prints the effective configuration, one key per line.
file(READ "${CONFIGS}/kvtierd.yaml" _documented)
string(REGEX MATCHALL "(^|\n)[ -]*[a-z_]+:" _keys "${_effective}")
set(_undocumented)
foreach(_key IN LISTS _keys)
  string(REGEX MATCH "[a-z_]+" _key "${_key}")
  if(NOT _documented MATCHES "(^|[ \n#(-])${_key}:")
    list(APPEND _undocumented ${_key})
  endif()
endforeach()
if(_undocumented)
  list(REMOVE_DUPLICATES _undocumented)
  message(FATAL_ERROR "${CONFIGS}/kvtierd.yaml does not document: ${_undocumented}")
endif()

# kvtier_add_test(NAME name SOURCES a.cc b.cc LIBS lib... [LABELS l...] [TIMEOUT s] [ARGS a...])
# One GoogleTest executable registered as one CTest test, with a timeout and labels;
# ARGS are passed to it (e.g. a --gtest_filter leaving cases to a test of their own).
function(kvtier_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main kvtier_build_flags)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

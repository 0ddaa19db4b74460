# Compiler warnings and sanitizer flags shared by every kvtier target.
add_library(kvtier_build_flags INTERFACE)
target_compile_options(kvtier_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>)

if(KVTIER_SANITIZE)
  if(KVTIER_SANITIZE STREQUAL "thread")
    set(_san_flags -fsanitize=thread)
  elseif(KVTIER_SANITIZE MATCHES "^(address|undefined|address,undefined|undefined,address)$")
    set(_san_flags -fsanitize=${KVTIER_SANITIZE} -fno-sanitize-recover=undefined)
  else()
    message(FATAL_ERROR "KVTIER_SANITIZE must be 'address,undefined' or 'thread', got '${KVTIER_SANITIZE}'")
  endif()
  # -O1 and line tables only (after the build type's -O2 -g, so they win): what
  # the sanitizers' own documentation builds with; reports keep their file:line
  # frames, and a from-scratch sanitizer build takes about half the time.
  add_compile_options(${_san_flags} -fno-omit-frame-pointer -O1 -g1)
  add_link_options(${_san_flags})
endif()

# kvtier_tsan_libzmq(target): a program linking libzmq ignores what libzmq does
# in ThreadSanitizer builds (cmake/tsan_libzmq.cc says why); nothing otherwise.
function(kvtier_tsan_libzmq target)
  if(KVTIER_SANITIZE STREQUAL "thread")
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/tsan_libzmq.cc)
  endif()
endfunction()

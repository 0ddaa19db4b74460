# Install rules: kvtierd, cachectl, libkvtier with its headers and a CMake
# package (find_package(kvtier) -> kvtier::client), the configurations, the
# documentation and, where the systemd/ sources are present, the service unit
# and sysusers entry.
# Everything lands in GNUInstallDirs locations relative to the install prefix,
# so `cmake --install build --prefix DIR` stages a complete tree anywhere.
# Components, for the packages (cmake/KvtierPackage.cmake) and --component:
#   programs  kvtierd, cachectl          doc      README, docs/, example configurations
#   service   the configuration, the unit and the sysusers entry, at the prefix's paths
#   dev       libkvtier, its headers and its CMake package
# A plain `cmake --install` installs them all (and not the Debian package's own
# component, deb, which is excluded from it).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Relative paths are under the install prefix: a prefix of /usr gives the
# distribution's directories, /usr/local the administrator's (systemd searches
# both), and a staging prefix keeps the whole install inside it.
set(KVTIER_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where kvtierd.service is installed (relative: under the install prefix)")
set(KVTIER_SYSUSERS_DIR "lib/sysusers.d" CACHE STRING
    "Where the kvtier system user is declared (relative: under the install prefix)")
set(KVTIER_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/kvtier" CACHE STRING
    "Where kvtierConfig.cmake is installed (relative: under the install prefix)")

install(TARGETS kvtierd cachectl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)

# libkvtier and the kvtier::proto archive it needs (docs/design.md, "Installed
# files"). Their include directories already name `include` for the installed tree.
install(TARGETS kvtier_client kvtier_proto EXPORT kvtierTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)

# client.h and the proto headers it includes, directly or through one another.
# The wire format, the index layout and shm_segment.h are proto's but only
# libkvtier's sources use them, so workers never see them. The install test
# compiles a worker against these alone, so a header missing here fails it.
set(KVTIER_PUBLIC_HEADERS
  client/include/kvtier/client.h
  client/include/kvtier/client_options.h
  proto/include/kvtier/block_key.h
  proto/include/kvtier/fence_layout.h
  proto/include/kvtier/model_profile.h
  proto/include/kvtier/session_summary.h
  proto/include/kvtier/status.h
  proto/include/kvtier/tier.h
)
install(FILES ${KVTIER_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier COMPONENT dev)

install(EXPORT kvtierTargets NAMESPACE kvtier:: FILE kvtierTargets.cmake
        DESTINATION ${KVTIER_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvtierConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvtierConfig.cmake INSTALL_DESTINATION ${KVTIER_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the client API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvtierConfig.cmake ${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
        DESTINATION ${KVTIER_INSTALL_CMAKEDIR} COMPONENT dev)

# With a /usr prefix, packagers pass -DCMAKE_INSTALL_SYSCONFDIR=/etc (GNUInstallDirs
# keeps it relative, i.e. /usr/etc, otherwise).
install(FILES configs/kvtierd.yaml DESTINATION ${CMAKE_INSTALL_SYSCONFDIR}/kvtier COMPONENT service)
install(DIRECTORY configs/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT doc FILES_MATCHING PATTERN "*.yaml")

# The README and the pages it links to (docs/*.md), so that its links work where it is installed.
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT doc FILES_MATCHING PATTERN "*.md")

# systemd/CMakeLists.txt generates the unit from systemd/kvtierd.service.in; the
# guard is on the source, so a unit that was not generated fails the install.
set(KVTIER_INSTALLS_SYSTEMD_UNIT OFF)
if(EXISTS ${PROJECT_SOURCE_DIR}/systemd/kvtierd.service.in)
  set(KVTIER_INSTALLS_SYSTEMD_UNIT ON)
  install(FILES ${PROJECT_BINARY_DIR}/systemd/kvtierd.service DESTINATION ${KVTIER_SYSTEMD_UNIT_DIR} COMPONENT service)
endif()
set(KVTIER_INSTALLS_SYSUSERS OFF)
if(EXISTS ${PROJECT_SOURCE_DIR}/systemd/kvtier.sysusers)
  set(KVTIER_INSTALLS_SYSUSERS ON)
  install(FILES systemd/kvtier.sysusers DESTINATION ${KVTIER_SYSUSERS_DIR} RENAME kvtier.conf COMPONENT service)
endif()

if(KVTIER_BUILD_TESTS)
  # Installs this build into a scratch prefix, checks the tree, and builds and
  # runs tests/consumer (a worker project) against it with the installed kvtierd.
  set(_kvtier_expected
    ${CMAKE_INSTALL_BINDIR}/kvtierd
    ${CMAKE_INSTALL_BINDIR}/cachectl
    ${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:kvtier_client>
    ${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:kvtier_proto>
    ${KVTIER_INSTALL_CMAKEDIR}/kvtierConfig.cmake
    ${KVTIER_INSTALL_CMAKEDIR}/kvtierConfigVersion.cmake
    ${KVTIER_INSTALL_CMAKEDIR}/kvtierTargets.cmake
    ${CMAKE_INSTALL_SYSCONFDIR}/kvtier/kvtierd.yaml
    ${CMAKE_INSTALL_DOCDIR}/README.md
    ${CMAKE_INSTALL_DOCDIR}/docs/design.md
    ${CMAKE_INSTALL_DOCDIR}/docs/vllm.md
    ${CMAKE_INSTALL_DOCDIR}/examples/dev-no-gpu.yaml
  )
  foreach(_h IN LISTS KVTIER_PUBLIC_HEADERS)
    get_filename_component(_name ${_h} NAME)
    list(APPEND _kvtier_expected ${CMAKE_INSTALL_INCLUDEDIR}/kvtier/${_name})
    list(APPEND _kvtier_headers ${CMAKE_INSTALL_INCLUDEDIR}/kvtier/${_name})
  endforeach()
  # The unit names kvtierd and its configuration by absolute path: they must be
  # where this build installs them (relative destinations are under the prefix).
  set(_kvtier_unit "")
  if(KVTIER_INSTALLS_SYSTEMD_UNIT)
    list(APPEND _kvtier_expected ${KVTIER_SYSTEMD_UNIT_DIR}/kvtierd.service)
    set(_kvtier_unit ${KVTIER_SYSTEMD_UNIT_DIR}/kvtierd.service)
    foreach(_dir BINDIR SYSCONFDIR)
      set(_kvtier_${_dir} ${CMAKE_INSTALL_${_dir}})
      if(NOT IS_ABSOLUTE ${_kvtier_${_dir}})
        set(_kvtier_${_dir} ${CMAKE_INSTALL_PREFIX}/${_kvtier_${_dir}})
      endif()
    endforeach()
  endif()
  if(KVTIER_INSTALLS_SYSUSERS)
    list(APPEND _kvtier_expected ${KVTIER_SYSUSERS_DIR}/kvtier.conf)
  endif()
  # Sanitized archives need the sanitizer runtime in the worker's link too.
  set(_kvtier_consumer_flags "")
  if(KVTIER_SANITIZE)
    set(_kvtier_consumer_flags "-fsanitize=${KVTIER_SANITIZE}")
  endif()
  string(REPLACE ";" " " _kvtier_expected "${_kvtier_expected}")
  string(REPLACE ";" " " _kvtier_headers "${_kvtier_headers}")
  add_test(NAME install_consumer
    COMMAND ${CMAKE_COMMAND} -E env
      "KVTIER_EXPECT=${_kvtier_expected}"
      "KVTIER_HEADERS=${_kvtier_headers}"
      "KVTIER_INCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}"
      "KVTIER_BINDIR=${CMAKE_INSTALL_BINDIR}"
      "KVTIER_CONFIG_FILE=${CMAKE_INSTALL_SYSCONFDIR}/kvtier/kvtierd.yaml"
      "KVTIER_VERSION=${PROJECT_VERSION}"
      "KVTIER_UNIT=${_kvtier_unit}"
      "KVTIER_UNIT_EXEC=${_kvtier_BINDIR}/kvtierd"
      "KVTIER_UNIT_CONFIG=${_kvtier_SYSCONFDIR}/kvtier/kvtierd.yaml"
      "KVTIER_GENERATOR=${CMAKE_GENERATOR}"
      "KVTIER_CXX=${CMAKE_CXX_COMPILER}"
      "KVTIER_CXX_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}"
      "KVTIER_CXX_FLAGS=${_kvtier_consumer_flags}"
      "KVTIER_BUILD_TYPE=$<CONFIG>"
      bash ${PROJECT_SOURCE_DIR}/tests/install/install_test.sh
        ${PROJECT_BINARY_DIR} ${PROJECT_BINARY_DIR}/install-test ${PROJECT_SOURCE_DIR}/tests/consumer)
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 300 LABELS install)
endif()

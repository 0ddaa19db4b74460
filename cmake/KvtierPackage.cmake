# The Debian package, kvtier_<version>_<arch>.deb, made by CPack from this build
# (docs/install.md):
#   cpack --config build/CPackConfig.cmake -B DIR
# It holds the components programs and doc (cmake/KvtierInstall.cmake) under
# /usr, and its own component deb: the configuration in /etc/kvtier (a
# conffile), the unit with /usr/bin/kvtierd and /etc/kvtier/kvtierd.yaml in it,
# and the sysusers entry. Its runtime dependencies are what dpkg-shlibdeps finds
# the programs load; packaging/deb/ holds the maintainer scripts (the user, the
# unit's enablement) and the conffile list. Not libkvtier and its headers (the
# dev component): workers build against a `cmake --install` or the source.
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR kvtier)
set(CPACK_PACKAGE_CONTACT "kvtier developers <kvtier@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "KV-cache daemon shared by the LLM model workers of a GPU host")
set(CPACK_PACKAGE_DESCRIPTION
  "kvtierd keeps attention key/value blocks in a GPU tier and a pinned host tier, finds cached
prefixes by exact token IDs, and lets several model-worker processes (vLLM engines, Python and
C++ workers) share them over a Unix socket and shared memory. cachectl is its operator command.
The package runs kvtierd as the systemd service kvtierd.service, as user kvtier.")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL programs doc deb)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEBIAN_PACKAGE_NAME kvtier)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# Depends: dpkg-shlibdeps' list for kvtierd and cachectl; procps for the unit's
# ExecReload=/bin/kill; passwd, whose useradd the postinst calls where
# systemd-sysusers is not installed.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd, procps")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/deb/conffiles ${PROJECT_SOURCE_DIR}/packaging/deb/postinst
  ${PROJECT_SOURCE_DIR}/packaging/deb/prerm ${PROJECT_SOURCE_DIR}/packaging/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# The deb component: excluded from a plain `cmake --install` (the configuration's
# path is absolute); cpack installs it into its staging tree alone.
install(FILES configs/kvtierd.yaml DESTINATION /etc/kvtier COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_BINARY_DIR}/systemd/deb/kvtierd.service DESTINATION lib/systemd/system
        COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES systemd/kvtier.sysusers DESTINATION lib/sysusers.d RENAME kvtier.conf COMPONENT deb EXCLUDE_FROM_ALL)

include(CPack)

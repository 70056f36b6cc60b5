# Install rules, pkg-config files, the CMake package and the Debian package.
#
#   cmake --install build --prefix P     (or make install PREFIX=P)
#   cd build && cpack -G DEB             (or make deb)
#
# Every file written for the install finds the others relative to itself
# (pkg-config's ${pcfiledir}, CMake's PACKAGE_PREFIX_DIR, the command's
# CORAL_REL_LIBDIR), so an install moved to another prefix, or installed with
# --prefix other than the configured one, still works.
include(CMakePackageConfigHelpers)

set_target_properties(coralloc PROPERTIES VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})

install(TARGETS coralloc coralloc_static coralloc_profile
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET coralloc_secure)
  install(TARGETS coralloc_secure LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(FILES include/coralloc.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS coralloc_command RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES docs/man/coralloc.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES docs/man/coralloc.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)

# pkg-config: coralloc (shared) and coralloc-static.
file(RELATIVE_PATH CORAL_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
set(CORAL_PC_LIBDIR ${CMAKE_INSTALL_LIBDIR})
set(CORAL_PC_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
foreach(pc coralloc coralloc-static)
  configure_file(cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# CMake package: find_package(coralloc CONFIG REQUIRED) gives coralloc::coralloc
# and coralloc::coralloc-static (imported targets written by hand: the build
# targets carry source-tree include paths that install(EXPORT) refuses).
set(CORAL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coralloc)
set(CORAL_SONAME libcoralloc.so.${PROJECT_VERSION_MAJOR})
configure_package_config_file(cmake/corallocConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/corallocConfig.cmake
  INSTALL_DESTINATION ${CORAL_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/corallocConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/corallocConfig.cmake
              ${CMAKE_BINARY_DIR}/cmake/corallocConfigVersion.cmake
        DESTINATION ${CORAL_CMAKE_DIR})

# `make uninstall` (the Makefile's) removes what build/install_manifest.txt lists.

# Debian package: cd build && cpack -G DEB -> coralloc_<version>_<arch>.deb,
# installed under /usr (apt-get install ./coralloc_*.deb).
set(CPACK_PACKAGE_NAME coralloc)
set(CPACK_PACKAGE_VENDOR coralloc)
set(CPACK_PACKAGE_CONTACT "coralloc developers <coralloc@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "general-purpose memory allocator (drop-in malloc, extended API, coralloc command)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.34)")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/coralloc")
include(CPack)

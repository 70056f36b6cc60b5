# Where users are (issue 18): the `coralloc` command, install rules,
# pkg-config and CMake package files, the Debian package, and the tests of
# all of them. Included by the top-level CMakeLists.txt once the library
# targets exist; refers to them by name only (coralloc, coralloc_static, and
# coralloc_secure when a secure build exists).

# The header's version must be the project's: coral_version(), the soname and
# the packages all say it.
file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/include/coralloc.h CORAL_HEADER_VERSION
     REGEX "^#define CORALLOC_VERSION \"")
string(REGEX REPLACE ".*\"(.*)\".*" "\\1" CORAL_HEADER_VERSION "${CORAL_HEADER_VERSION}")
if(NOT CORAL_HEADER_VERSION STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/coralloc.h says version ${CORAL_HEADER_VERSION}, "
                      "CMakeLists.txt says ${PROJECT_VERSION}: make them agree")
endif()

include(GNUInstallDirs)

if(TARGET coralloc)
  include(${CMAKE_CURRENT_LIST_DIR}/command.cmake)
  include(${CMAKE_CURRENT_LIST_DIR}/install.cmake)
  # Their tests run host tools on the build's programs: not in a cross build.
  if(NOT CMAKE_CROSSCOMPILING)
    enable_testing()
    add_subdirectory(${CMAKE_CURRENT_SOURCE_DIR}/tests/reach ${CMAKE_BINARY_DIR}/tests/reach)
  endif()
endif()

# The `coralloc` command (tools/coralloc.c), built beside libcoralloc.so in
# the build tree's top folder, so that it finds the library there; installed
# in bin/, where it finds it through the relative path to lib/.
file(RELATIVE_PATH CORAL_REL_LIBDIR /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBDIR})

add_executable(coralloc_command tools/coralloc.c tools/profile_report.c)
set_target_properties(coralloc_command PROPERTIES OUTPUT_NAME coralloc
                      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
target_include_directories(coralloc_command PRIVATE include)
target_compile_definitions(coralloc_command PRIVATE CORAL_REL_LIBDIR="${CORAL_REL_LIBDIR}")
target_compile_options(coralloc_command PRIVATE ${CORAL_WARNINGS})
target_link_libraries(coralloc_command PRIVATE ${CMAKE_DL_LIBS})
# `coralloc run` needs the library to be there.
add_dependencies(coralloc_command coralloc coralloc_profile)
if(TARGET coralloc_secure)
  add_dependencies(coralloc_command coralloc_secure)
endif()

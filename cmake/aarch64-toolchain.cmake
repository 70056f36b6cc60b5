# Cross build for Linux arm64 with Debian's gcc-aarch64-linux-gnu; tests run
# under qemu-user (make test-arm64):
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-toolchain.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CORAL_AARCH64_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "arm64 libraries for qemu")
set(CMAKE_FIND_ROOT_PATH ${CORAL_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# ctest runs each test program through qemu; -L: where the arm64 ld.so and libc are.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${CORAL_AARCH64_SYSROOT})
# src/ still calls two x86-only builtins (see the header): their arm64
# equivalents, until src/base wraps them portably.
set(CMAKE_C_FLAGS_INIT "-include ${CMAKE_CURRENT_LIST_DIR}/aarch64-x86-shims.h")

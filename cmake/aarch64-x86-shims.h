/* Forced into every C file of the arm64 cross build (cmake/aarch64-toolchain.cmake).
 * TEMPORARY: src/ calls two x86-only builtins (a spin-wait pause in page.c and
 * segment.c, a cycle counter in stash.c), which do not exist on arm64. Until
 * src/base gains portable wrappers for them (reported to the lead: src/ is
 * being moved), these give their arm64 equivalents. */
#ifndef CORAL_AARCH64_X86_SHIMS_H
#define CORAL_AARCH64_X86_SHIMS_H
#if defined(__aarch64__)
#define __builtin_ia32_pause() __asm__ __volatile__("yield" ::: "memory")
#define __builtin_ia32_rdtsc()                                                                     \
    __extension__({                                                                                \
        unsigned long long coral_cntvct_;                                                          \
        __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(coral_cntvct_));                          \
        coral_cntvct_;                                                                             \
    })
#endif
#endif

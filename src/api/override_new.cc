// C++ operators new and delete, for programs that link libcoralloc.a.
// (Under LD_PRELOAD, libstdc++'s new and plain delete call malloc/free,
// which are ours; the sized and aligned deletes are override.c's.)
#include <cerrno>
#include <cstddef>
#include <new>

#include "coralloc.h"

namespace {

// Plain new: retry through the new-handler, then throw.
void *new_or_throw(std::size_t size) {
    for (;;) {
        void *p = coral_malloc(size);
        if (p) return p;
        std::new_handler handler = std::get_new_handler();
        if (!handler) throw std::bad_alloc();
        handler();
    }
}

void *new_aligned_or_throw(std::size_t size, std::align_val_t al) {
    for (;;) {
        void *p = coral_aligned_alloc(static_cast<std::size_t>(al), size);
        if (p) return p;
        std::new_handler handler = std::get_new_handler();
        if (!handler) throw std::bad_alloc();
        handler();
    }
}

void *new_nothrow(std::size_t size) noexcept {
    try {
        return new_or_throw(size);
    } catch (...) {
        return nullptr;
    }
}

void *new_aligned_nothrow(std::size_t size, std::align_val_t al) noexcept {
    try {
        return new_aligned_or_throw(size, al);
    } catch (...) {
        return nullptr;
    }
}

} // namespace

void *operator new(std::size_t n) { return new_or_throw(n); }
void *operator new[](std::size_t n) { return new_or_throw(n); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return new_nothrow(n); }
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return new_nothrow(n); }
void *operator new(std::size_t n, std::align_val_t al) { return new_aligned_or_throw(n, al); }
void *operator new[](std::size_t n, std::align_val_t al) { return new_aligned_or_throw(n, al); }
void *operator new(std::size_t n, std::align_val_t al, const std::nothrow_t &) noexcept {
    return new_aligned_nothrow(n, al);
}
void *operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t &) noexcept {
    return new_aligned_nothrow(n, al);
}

// (The sized ones are defined in override.c, which the compiler cannot see.)
#pragma GCC diagnostic ignored "-Wsized-deallocation"
void operator delete(void *p) noexcept { coral_free(p); }
void operator delete[](void *p) noexcept { coral_free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { coral_free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { coral_free(p); }
// The sized and aligned deletes (which check what they are told, as
// free_sized and free_aligned_sized do) are in override.c, by their mangled
// names, for the shared library too; the nothrow aligned ones here.
void operator delete(void *p, std::align_val_t al, const std::nothrow_t &) noexcept {
    coral_free_aligned_sized(p, static_cast<std::size_t>(al), 0);
}
void operator delete[](void *p, std::align_val_t al, const std::nothrow_t &) noexcept {
    coral_free_aligned_sized(p, static_cast<std::size_t>(al), 0);
}

// test_cxx: the C++ operators new/delete of libcoralloc.a (release build
// only; links coralloc_static), and as cxx_shared of libcoralloc.so, whose
// plain, array and nothrow new and unsized delete hand a failed new to
// libstdc++'s (src/api/override.c).
//
// The program's plain/array/nothrow new and unsized delete are coralloc's
// own definitions (the object that defines coral_malloc), not a C++
// runtime's that calls malloc.
// Every form of operator new (plain, array, nothrow, aligned, aligned
// nothrow) returns coralloc memory with the right alignment; every form of
// delete (plain, array, sized, aligned, aligned sized, nothrow) takes it back;
// an impossible size gives nullptr from the nothrow forms and std::bad_alloc
// from the others, after calling the installed new_handler; and a threaded
// std::vector / std::string workload runs on coralloc memory.
#include "coralloc.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "testutil.h"

namespace {

volatile size_t v_size_max = SIZE_MAX;

void check_ours(void *p, size_t size, size_t align, const char *what) {
    CHECK_MSG(p != nullptr, "%s returned nullptr\n", what);
    p = opaque(p);
    CHECK_MSG(coral_owns(p), "%s: %p is not coralloc's\n", what, p);
    CHECK_ALIGNED(p, align);
    CHECK_GE(coral_malloc_usable_size(p), size);
    fill_pattern(p, size, size);
    CHECK_PATTERN(p, size, size);
}

struct alignas(64) A64 {
    unsigned char b[64];
};
struct alignas(4096) A4096 {
    unsigned char b[100];
};
struct alignas(2 * 1024 * 1024) A2M {
    unsigned char b[10];
};

struct Counted {
    static std::atomic<int> live;
    uint64_t v[5];
    Counted() { live++; }
    ~Counted() { live--; }
};
std::atomic<int> Counted::live{0};

void test_plain_array_nothrow() {
    for (size_t n : {size_t(0), size_t(1), size_t(24), size_t(1000), size_t(70000), size_t(3) << 20,
                     size_t(20) << 20}) {
        void *p = ::operator new(n);
        check_ours(p, n, 16, "operator new");
        ::operator delete(p);

        p = ::operator new(n);
        check_ours(p, n, 16, "operator new (sized delete)");
        ::operator delete(p, n);

        p = ::operator new[](n);
        check_ours(p, n, 16, "operator new[]");
        ::operator delete[](p);

        p = ::operator new[](n);
        check_ours(p, n, 16, "operator new[] (sized delete)");
        ::operator delete[](p, n);

        p = ::operator new(n, std::nothrow);
        check_ours(p, n, 16, "operator new nothrow");
        ::operator delete(p, std::nothrow);

        p = ::operator new[](n, std::nothrow);
        check_ours(p, n, 16, "operator new[] nothrow");
        ::operator delete[](p, std::nothrow);
    }

    // new-expressions (the compiler picks the sized forms of delete)
    int *i = new int(42);
    check_ours(i, sizeof *i, 16, "new int");
    *i = 42;
    CHECK_EQ(*static_cast<int *>(opaque(i)), 42);
    delete i;

    Counted *c = new Counted[100];
    CHECK(coral_owns(opaque(c)));
    CHECK_EQ(Counted::live.load(), 100);
    delete[] c;
    CHECK_EQ(Counted::live.load(), 0);

    Counted *one = new Counted;
    CHECK(coral_owns(opaque(one)));
    delete one;

    char *buf = new (std::nothrow) char[5000];
    check_ours(buf, 5000, 16, "new (nothrow) char[]");
    delete[] buf;
}

void test_aligned() {
    A64 *a = new A64;
    check_ours(a, sizeof *a, 64, "new alignas(64)");
    delete a;

    A64 *aa = new A64[33];
    check_ours(aa, 33 * sizeof *aa, 64, "new alignas(64)[]");
    delete[] aa;

    A4096 *b = new A4096;
    check_ours(b, sizeof *b, 4096, "new alignas(4096)");
    delete b;

    A4096 *bb = new A4096[7];
    check_ours(bb, 7 * sizeof *bb, 4096, "new alignas(4096)[]");
    delete[] bb;

    A2M *h = new A2M;
    check_ours(h, sizeof *h, 2 * 1024 * 1024, "new alignas(2 MiB)");
    delete h;

    A4096 *nb = new (std::nothrow) A4096;
    check_ours(nb, sizeof *nb, 4096, "new (nothrow) alignas(4096)");
    delete nb;

    for (size_t al = 16; al <= (size_t(16) << 20); al <<= 1) {
        std::align_val_t av{al};
        for (size_t n : {size_t(1), al - 1, al, 3 * al + 1}) {
            void *p = ::operator new(n, av);
            check_ours(p, n, al, "operator new(align_val_t)");
            ::operator delete(p, av);

            p = ::operator new(n, av);
            check_ours(p, n, al, "operator new(align_val_t) sized delete");
            ::operator delete(p, n, av);

            p = ::operator new[](n, av);
            check_ours(p, n, al, "operator new[](align_val_t)");
            ::operator delete[](p, av);

            p = ::operator new[](n, av);
            check_ours(p, n, al, "operator new[](align_val_t) sized delete");
            ::operator delete[](p, n, av);

            p = ::operator new(n, av, std::nothrow);
            check_ours(p, n, al, "operator new(align_val_t, nothrow)");
            ::operator delete(p, av, std::nothrow);

            p = ::operator new[](n, av, std::nothrow);
            check_ours(p, n, al, "operator new[](align_val_t, nothrow)");
            ::operator delete[](p, av, std::nothrow);
        }
    }
}

int handler_calls;
void counting_handler() {
    handler_calls++;
    std::set_new_handler(nullptr); // the next failure throws
}

// The object that defines the function at f (the program's own name for
// an executable).
const char *object_of(void *f, const char *what) {
    Dl_info info;
    CHECK_MSG(dladdr(f, &info) != 0 && info.dli_fname != nullptr, "%s: no object\n", what);
    return info.dli_fname;
}

using new_fn = void *(*)(std::size_t);
using new_nothrow_fn = void *(*)(std::size_t, const std::nothrow_t &) noexcept;
using delete_fn = void (*)(void *) noexcept;
using delete_nothrow_fn = void (*)(void *, const std::nothrow_t &) noexcept;

void check_is_ours(void *f, const char *what) {
    const char *ours = object_of(reinterpret_cast<void *>(&coral_malloc), "coral_malloc");
    const char *obj = object_of(f, what);
    CHECK_MSG(std::strcmp(obj, ours) == 0, "%s is %s's, not coralloc's (%s)\n", what, obj, ours);
}

// The addresses the program calls (through the GOT when coralloc is a
// shared library).
void test_new_is_ours() {
    check_is_ours(reinterpret_cast<void *>(static_cast<new_fn>(&::operator new)), "new");
    check_is_ours(reinterpret_cast<void *>(static_cast<new_fn>(&::operator new[])), "new[]");
    check_is_ours(reinterpret_cast<void *>(static_cast<new_nothrow_fn>(&::operator new)),
                  "new(nothrow)");
    check_is_ours(reinterpret_cast<void *>(static_cast<new_nothrow_fn>(&::operator new[])),
                  "new[](nothrow)");
    check_is_ours(reinterpret_cast<void *>(static_cast<delete_fn>(&::operator delete)), "delete");
    check_is_ours(reinterpret_cast<void *>(static_cast<delete_fn>(&::operator delete[])),
                  "delete[]");
    check_is_ours(reinterpret_cast<void *>(static_cast<delete_nothrow_fn>(&::operator delete)),
                  "delete(nothrow)");
    check_is_ours(reinterpret_cast<void *>(static_cast<delete_nothrow_fn>(&::operator delete[])),
                  "delete[](nothrow)");
}

void test_absurd() {
    size_t huge = v_size_max;
    size_t half = huge / 2 + 1;

    CHECK(::operator new(huge, std::nothrow) == nullptr);
    CHECK(::operator new[](huge, std::nothrow) == nullptr);
    CHECK(::operator new (half, std::align_val_t{64}, std::nothrow) == nullptr);
    CHECK(::operator new[](half, std::align_val_t{4096}, std::nothrow) == nullptr);

#define EXPECT_BAD_ALLOC(stmt)                                                                     \
    do {                                                                                           \
        bool thrown_ = false;                                                                      \
        try {                                                                                      \
            stmt;                                                                                  \
        } catch (const std::bad_alloc &) {                                                         \
            thrown_ = true;                                                                        \
        }                                                                                          \
        CHECK_MSG(thrown_, "%s did not throw std::bad_alloc\n", #stmt);                            \
    } while (0)

    EXPECT_BAD_ALLOC(::operator delete(opaque(::operator new(huge))));
    EXPECT_BAD_ALLOC(::operator delete[](opaque(::operator new[](half))));
    // libcoralloc.so leaves aligned new to libstdc++, whose rounding of
    // SIZE_MAX up to the alignment wraps to 0 (a block): an absurd size
    // that does not wrap there.
#ifdef CXX_SHARED
    size_t aligned_absurd = half;
#else
    size_t aligned_absurd = huge;
#endif
    EXPECT_BAD_ALLOC(::operator delete (
        opaque(::operator new (aligned_absurd, std::align_val_t{256})), std::align_val_t{256}));
    EXPECT_BAD_ALLOC(::operator delete[](opaque(::operator new[](half, std::align_val_t{64})),
                                         std::align_val_t{64}));
    volatile size_t quarter = huge / 4; // an absurd array new-expression
    EXPECT_BAD_ALLOC(delete[] static_cast<char *>(opaque(new char[quarter])));

    // The new_handler is called before bad_alloc is thrown.
    handler_calls = 0;
    std::set_new_handler(counting_handler);
    try {
        void *p = ::operator new(half);
        ::operator delete(opaque(p));
        CHECK_MSG(false, "operator new(2^63) did not throw\n");
    } catch (const std::bad_alloc &) {
    }
    CHECK_EQ(handler_calls, 1);
    std::set_new_handler(nullptr);
}

void test_threads() {
    enum { T = 6 };
    std::vector<std::thread> threads;
    std::vector<std::vector<std::string>> out(T);
    std::vector<uint64_t> sums(T, 0);
    for (int t = 0; t < T; t++) {
        threads.emplace_back([t, &out, &sums] {
            std::vector<std::string> v;
            uint64_t sum = 0;
            for (int i = 0; i < 20000; i++) {
                std::string s = "thread " + std::to_string(t) + " item " + std::to_string(i) +
                                std::string(size_t(i % 300), 'x');
                sum += s.size();
                v.push_back(std::move(s));
                if (i % 7 == 0) v.erase(v.begin() + (i % v.size()));
            }
            std::vector<std::vector<int>> nested;
            for (int i = 0; i < 2000; i++) nested.emplace_back(size_t(i % 500), i);
            for (int i = 0; i < 2000; i++)
                for (int x : nested[size_t(i)]) CHECK_EQ(x, i);
            CHECK(coral_owns(v.data()));
            sums[size_t(t)] = sum;
            out[size_t(t)] = std::move(v); // freed later on the main thread
        });
    }
    for (auto &th : threads) th.join();
    for (int t = 0; t < T; t++) {
        uint64_t want = 0;
        for (int i = 0; i < 20000; i++)
            want += ("thread " + std::to_string(t) + " item " + std::to_string(i)).size() +
                    size_t(i % 300);
        CHECK_EQ(sums[size_t(t)], want);
        for (const std::string &s : out[size_t(t)]) {
            std::string prefix = "thread " + std::to_string(t) + " item ";
            CHECK(s.compare(0, prefix.size(), prefix) == 0);
            if (s.capacity() > 15) // not in the small-string buffer
                CHECK(coral_owns(s.data()));
        }
    }
    out.clear(); // cross-thread frees of every string
}

} // namespace

int main() {
    double t0 = now_seconds();
    test_new_is_ours();
    std::puts("new and delete are coralloc's");
    test_plain_array_nothrow();
    std::puts("plain/array/nothrow ok");
    test_aligned();
    std::puts("aligned ok");
    test_absurd();
    std::puts("absurd sizes ok");
    test_threads();
    std::puts("threads ok");
    std::printf("test_cxx: all passed in %.2f s\n", now_seconds() - t0);
    return 0;
}

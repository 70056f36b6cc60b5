// A C++ program built against an installed coralloc: new/delete are served
// by coralloc (coral_owns, and the statistics count new[]'s huge blocks),
// standard containers work, and so does the extended API.
#include <coralloc.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "served.h"

int main() {
    auto *one = new int(42);
    SERVED_CHECK(coral_owns(one));
    delete one;

    long long huge_before = served_stat("huge_allocs");
    SERVED_CHECK(huge_before >= 0);
    const std::size_t huge_size = std::size_t(64) << 20;
    for (int i = 0; i < 2; i++) {
        auto *block = new char[huge_size];
        SERVED_CHECK(coral_owns(block));
        block[huge_size - 1] = 1;
        delete[] block;
    }
    SERVED_CHECK(served_stat("huge_allocs") - huge_before == 2);

    std::map<std::string, std::vector<int>> words;
    for (int i = 0; i < 1000; i++) words["word" + std::to_string(i % 50)].push_back(i);
    SERVED_CHECK(words.size() == 50 && words["word7"].size() == 20);
    SERVED_CHECK(coral_owns(words["word7"].data()));

    auto unique = std::make_unique<std::string>(100, 'x');
    SERVED_CHECK(coral_owns(unique->data()));

    coral_heap_t *heap = coral_heap_new();
    SERVED_CHECK(heap != nullptr);
    SERVED_CHECK(coral_heap_malloc(heap, 64) != nullptr);
    coral_heap_destroy(heap);

    std::printf("C++: new/delete counted by coralloc %s\n", coral_version());
    return 0;
}

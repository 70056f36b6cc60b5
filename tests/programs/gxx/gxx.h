// A small multi-file C++ program that run_programs.py compiles with g++ and
// runs, each time under the allocator under test and under glibc: its output
// must be the same. Every part allocates a lot through the standard library
// and prints only deterministic results (checksums, sorted tables).
#pragma once

#include <cstdint>
#include <string>

namespace gxx {

// A deterministic generator (the same numbers on every run and platform).
struct Lcg {
    std::uint64_t state;
    std::uint32_t next() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return static_cast<std::uint32_t>(state >> 33);
    }
    std::uint32_t below(std::uint32_t n) { return next() % n; }
};

// words.cc: word counts in generated text (std::string, unordered_map, sort).
std::string words_report(std::uint64_t seed, int words);
// graph.cc: shortest paths in a generated graph (vectors, priority_queue).
std::string graph_report(std::uint64_t seed, int nodes, int edges_per_node);
// shapes.cc: polymorphic objects through unique_ptr/shared_ptr, list, map.
std::string shapes_report(std::uint64_t seed, int count);

} // namespace gxx

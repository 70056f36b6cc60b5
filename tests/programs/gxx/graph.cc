#include <limits>
#include <queue>
#include <sstream>
#include <vector>

#include "gxx.h"

namespace gxx {

std::string graph_report(std::uint64_t seed, int nodes, int edges_per_node) {
    struct Edge {
        int to;
        std::uint32_t weight;
    };
    Lcg rng{seed};
    std::vector<std::vector<Edge>> adjacent(static_cast<std::size_t>(nodes));
    for (int from = 0; from < nodes; from++)
        for (int e = 0; e < edges_per_node; e++)
            adjacent[static_cast<std::size_t>(from)].push_back(
                {static_cast<int>(rng.below(static_cast<std::uint32_t>(nodes))),
                 1 + rng.below(1000)});
    const std::uint64_t unreached = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::uint64_t> dist(static_cast<std::size_t>(nodes), unreached);
    using Item = std::pair<std::uint64_t, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
    dist[0] = 0;
    queue.push({0, 0});
    while (!queue.empty()) {
        auto [d, node] = queue.top();
        queue.pop();
        if (d != dist[static_cast<std::size_t>(node)]) continue;
        for (const Edge &e : adjacent[static_cast<std::size_t>(node)]) {
            std::uint64_t nd = d + e.weight;
            if (nd < dist[static_cast<std::size_t>(e.to)]) {
                dist[static_cast<std::size_t>(e.to)] = nd;
                queue.push({nd, e.to});
            }
        }
    }
    std::uint64_t reached = 0, sum = 0, longest = 0;
    for (std::uint64_t d : dist)
        if (d != unreached) {
            reached++;
            sum += d;
            longest = d > longest ? d : longest;
        }
    std::ostringstream out;
    out << "graph: " << nodes << " nodes, " << nodes * edges_per_node << " edges, " << reached
        << " reached, distance sum " << sum << ", longest " << longest << "\n";
    return out.str();
}

} // namespace gxx

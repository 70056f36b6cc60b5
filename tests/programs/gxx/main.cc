// gxx_prog: the parts, each also in four threads at once (every thread's
// report must be the single-threaded one), and a checksum of the whole.
#include <iostream>
#include <thread>
#include <vector>

#include "gxx.h"

int main() {
    using namespace gxx;
    std::string whole =
        words_report(1, 200000) + graph_report(2, 50000, 6) + shapes_report(3, 100000);
    std::vector<std::string> results(4);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < results.size(); t++)
        threads.emplace_back([&results, t] {
            results[t] =
                words_report(1, 200000) + graph_report(2, 50000, 6) + shapes_report(3, 100000);
        });
    for (auto &t : threads) t.join();
    int same = 0;
    for (const auto &r : results) same += r == whole;
    std::uint64_t sum = 1469598103934665603ULL; // FNV-1a
    for (unsigned char c : whole) sum = (sum ^ c) * 1099511628211ULL;
    std::cout << whole << "threads agreeing: " << same << " of " << results.size() << "\n"
              << "checksum: " << std::hex << sum << "\n";
    return same == static_cast<int>(results.size()) ? 0 : 1;
}

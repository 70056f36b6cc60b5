// smoke_cxx: a small C++ program (iostreams, std::thread, containers) that
// preload_smoke.sh runs with and without LD_PRELOAD=libcoralloc.so; its
// output must be the same. Not linked with coralloc.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

static std::string work(int t) {
    std::map<std::string, std::vector<int>> m;
    std::vector<std::unique_ptr<std::string>> owned;
    for (int i = 0; i < 30000; i++) {
        std::string key = "k" + std::to_string((i * 7919 + t) % 4099);
        m[key].push_back(i);
        owned.push_back(std::make_unique<std::string>(size_t(i % 200), char('a' + i % 26)));
        if (owned.size() > 500) owned.erase(owned.begin(), owned.begin() + 250);
    }
    uint64_t h = 1469598103934665603ull;
    for (const auto &kv : m) {
        for (char ch : kv.first) h = (h ^ uint8_t(ch)) * 1099511628211ull;
        for (int v : kv.second) h = (h ^ uint64_t(v)) * 1099511628211ull;
    }
    for (const auto &s : owned) h = (h ^ s->size()) * 1099511628211ull;
    std::ostringstream os;
    os << "thread " << t << ": " << m.size() << " keys, hash " << std::hex << h;
    return os.str();
}

int main() {
    const int T = 6;
    std::vector<std::string> results(T);
    std::vector<std::thread> threads;
    for (int t = 0; t < T; t++)
        threads.emplace_back([t, &results] { results[size_t(t)] = work(t); });
    for (auto &th : threads) th.join();
    for (const auto &r : results) std::cout << r << '\n';
    std::cout << "done" << std::endl;
    return 0;
}

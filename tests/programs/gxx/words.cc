#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "gxx.h"

namespace gxx {

std::string words_report(std::uint64_t seed, int words) {
    static const char *const syllables[] = {"co",   "ral", "lo",   "ca",   "tor",  "heap",
                                            "page", "seg", "ment", "free", "list", "bulk"};
    Lcg rng{seed};
    std::string text;
    for (int i = 0; i < words; i++) {
        // Zipf-like: short words are frequent
        int parts = 1 + static_cast<int>(rng.below(4) * rng.below(4) / 3);
        for (int p = 0; p < parts; p++) text += syllables[rng.below(12)];
        text += (i % 17 == 16) ? '\n' : ' ';
    }
    std::unordered_map<std::string, int> counts;
    std::map<std::size_t, int> by_length;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
        counts[word]++;
        by_length[word.size()]++;
    }
    std::vector<std::pair<std::string, int>> top(counts.begin(), counts.end());
    std::sort(top.begin(), top.end(), [](const auto &a, const auto &b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    std::ostringstream out;
    out << "words: " << words << " words, " << counts.size() << " distinct, " << text.size()
        << " bytes\n";
    for (std::size_t i = 0; i < 8 && i < top.size(); i++)
        out << "  " << top[i].first << " " << top[i].second << "\n";
    out << "  lengths:";
    for (const auto &[length, n] : by_length) out << " " << length << ":" << n;
    out << "\n";
    return out.str();
}

} // namespace gxx

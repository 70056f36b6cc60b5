#include <functional>
#include <iomanip>
#include <list>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "gxx.h"

namespace gxx {

namespace {

struct Shape {
    virtual ~Shape() = default;
    virtual double area() const = 0;
    virtual std::string kind() const = 0;
};

struct Rect : Shape {
    double w, h;
    Rect(double w_, double h_) : w(w_), h(h_) {}
    double area() const override { return w * h; }
    std::string kind() const override { return "rect"; }
};

struct Circle : Shape {
    double r;
    explicit Circle(double r_) : r(r_) {}
    double area() const override { return 3.141592653589793 * r * r; }
    std::string kind() const override { return "circle"; }
};

struct Group : Shape {
    std::vector<std::shared_ptr<Shape>> parts;
    double area() const override {
        double a = 0;
        for (const auto &p : parts) a += p->area();
        return a;
    }
    std::string kind() const override { return "group"; }
};

} // namespace

std::string shapes_report(std::uint64_t seed, int count) {
    Lcg rng{seed};
    std::vector<std::unique_ptr<Shape>> shapes;
    std::list<std::shared_ptr<Shape>> pool;
    for (int i = 0; i < count; i++) {
        switch (rng.below(3)) {
        case 0:
            shapes.push_back(std::make_unique<Rect>(1 + rng.below(50), 1 + rng.below(50)));
            break;
        case 1:
            shapes.push_back(std::make_unique<Circle>(1 + rng.below(30)));
            break;
        default: {
            auto group = std::make_unique<Group>();
            for (std::uint32_t k = rng.below(6); k > 0; k--) {
                pool.push_back(std::make_shared<Rect>(k, k + 1));
                group->parts.push_back(pool.back());
            }
            shapes.push_back(std::move(group));
        }
        }
        if (pool.size() > 500) pool.pop_front(); // groups keep their parts alive
    }
    std::map<std::string, std::pair<int, double>> by_kind;
    std::vector<std::function<double()>> deferred;
    for (const auto &s : shapes) {
        auto &entry = by_kind[s->kind()];
        entry.first++;
        entry.second += s->area();
        const Shape *raw = s.get();
        deferred.push_back([raw] { return raw->area() / 2; });
    }
    double half = 0;
    for (const auto &f : deferred) half += f();
    std::ostringstream out;
    out << std::fixed << std::setprecision(3);
    out << "shapes: " << count << ", half area " << half << "\n";
    for (const auto &[kind, v] : by_kind)
        out << "  " << kind << " " << v.first << " " << v.second << "\n";
    return out.str();
}

} // namespace gxx

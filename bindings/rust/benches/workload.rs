// The workload of the three allocator benchmarks (alloc_system.rs,
// alloc_coralloc.rs, alloc_mimalloc.rs), included by each: one binary per
// allocator, since a process has one #[global_allocator].
use criterion::{black_box, Criterion};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Many small vectors pushed to and dropped.
fn vecs(n: usize) -> usize {
    let mut outer: Vec<Vec<u32>> = Vec::new();
    for i in 0..n {
        let mut v = Vec::new();
        for k in 0..(i % 32) as u32 {
            v.push(k);
        }
        outer.push(v);
    }
    outer.iter().map(Vec::len).sum()
}

/// Words counted in a HashMap<String, Vec<usize>>, half of them removed.
fn hashmap(n: usize) -> usize {
    let mut map: HashMap<String, Vec<usize>> = HashMap::new();
    for i in 0..n {
        map.entry(format!("key-{}", i % (n / 4 + 1))).or_default().push(i);
    }
    let keys: Vec<String> = map.keys().filter(|k| k.len() % 2 == 0).cloned().collect();
    for k in &keys {
        map.remove(k);
    }
    map.len()
}

/// Strings built, joined, split and cloned.
fn strings(n: usize) -> usize {
    let parts: Vec<String> = (0..n).map(|i| format!("part{i}-{}", "x".repeat(i % 40))).collect();
    let joined = parts.join(",");
    let back: Vec<String> = joined.split(',').map(str::to_owned).collect();
    back.iter().map(String::len).sum::<usize>() + joined.len()
}

/// A BTreeMap<u64, String> filled, probed and drained.
fn btree(n: usize) -> usize {
    let mut tree = BTreeMap::new();
    for i in 0..n as u64 {
        tree.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i.to_string());
    }
    let hits = (0..n as u64).filter(|i| tree.contains_key(&(i * 7))).count();
    while tree.len() > n / 2 {
        tree.pop_first();
    }
    hits + tree.len()
}

/// All four, interleaved: what a program that uses std's collections does.
fn mixed(n: usize) -> usize {
    vecs(n) + hashmap(n / 2) + strings(n / 2) + btree(n / 4)
}

pub fn workload(c: &mut Criterion, allocator: &str) {
    const N: usize = 10_000;
    let mut group = c.benchmark_group(allocator);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("vec", |b| b.iter(|| vecs(black_box(N))));
    group.bench_function("hashmap", |b| b.iter(|| hashmap(black_box(N))));
    group.bench_function("string", |b| b.iter(|| strings(black_box(N))));
    group.bench_function("btreemap", |b| b.iter(|| btree(black_box(N))));
    group.bench_function("mixed", |b| b.iter(|| mixed(black_box(N))));
    group.finish();
}

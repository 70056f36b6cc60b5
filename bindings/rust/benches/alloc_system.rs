//! The std-collections workload (workload.rs) with the system allocator.
#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

mod workload;

fn bench(c: &mut criterion::Criterion) {
    workload::workload(c, "system");
}

criterion::criterion_group!(benches, bench);
criterion::criterion_main!(benches);

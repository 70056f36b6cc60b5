//! The std-collections workload (workload.rs) with the coralloc allocator.
#[global_allocator]
static GLOBAL: coralloc::Coralloc = coralloc::Coralloc;

mod workload;

fn bench(c: &mut criterion::Criterion) {
    workload::workload(c, "coralloc");
}

criterion::criterion_group!(benches, bench);
criterion::criterion_main!(benches);

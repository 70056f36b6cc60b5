//! The std-collections workload (workload.rs) with the mimalloc allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod workload;

fn bench(c: &mut criterion::Criterion) {
    workload::workload(c, "mimalloc");
}

criterion::criterion_group!(benches, bench);
criterion::criterion_main!(benches);

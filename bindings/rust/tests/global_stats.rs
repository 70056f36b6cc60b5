//! With `Coralloc` as the global allocator, coralloc's statistics count the
//! program's allocations. Alone in its test binary: other tests running in
//! parallel would make huge blocks of their own.
use coralloc::Coralloc;

#[global_allocator]
static GLOBAL: Coralloc = Coralloc;

#[test]
fn huge_vectors_are_counted() {
    let before = coralloc::stat("huge_allocs").expect("huge_allocs in the statistics");
    let big: Vec<Vec<u8>> = (0..3).map(|i| vec![i; 64 << 20]).collect();
    assert_eq!(coralloc::stat("huge_allocs").unwrap() - before, 3);
    assert!(big.iter().all(|v| coralloc::owns(v.as_ptr())));
}

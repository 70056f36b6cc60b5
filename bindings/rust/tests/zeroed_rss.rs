//! A large zeroed block at an alignment above `MIN_ALIGN` costs what
//! `calloc` costs: memory fresh from the OS is already zero and is not
//! written, so it stays out of the resident set until the program writes it.
//! Alone in its test binary: a fresh process (no other test's blocks, no
//! populate decision made from earlier big blocks, os/populate.c).
use coralloc::Coralloc;
use std::alloc::{GlobalAlloc, Layout};

/// Resident memory of this process, in MiB (VmRSS of /proc/self/status).
fn rss_mib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib >> 10
}

#[test]
fn a_gib_zeroed_at_alignment_32_is_not_resident() {
    const GIB: usize = 1 << 30;
    let layout = Layout::from_size_align(GIB, 32).unwrap();
    let before = rss_mib();
    // SAFETY: a non-zero size; freed below with the same layout.
    let p = unsafe { Coralloc.alloc_zeroed(layout) };
    assert!(!p.is_null());
    let grown = rss_mib().saturating_sub(before);
    assert!(
        grown < 64,
        "a 1 GiB zeroed block at alignment 32 added {grown} MiB of RSS"
    );
    // It is zero all the same (reading untouched pages maps the zero page).
    for off in (0..GIB).step_by(4096) {
        // SAFETY: off < GIB, inside the block.
        assert_eq!(unsafe { p.add(off).read() }, 0, "byte {off}");
    }
    // SAFETY: the block and layout of alloc_zeroed above.
    unsafe { Coralloc.dealloc(p, layout) };
}

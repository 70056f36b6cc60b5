//! `Coralloc`'s `GlobalAlloc` methods called directly at every power-of-two
//! alignment from 1 to 1 MiB: `alloc` gives aligned, writable blocks,
//! `alloc_zeroed` gives zeroed ones (also on memory a dirtied block just gave
//! back), `realloc` keeps the alignment and the contents, growing and
//! shrinking.
use coralloc::Coralloc;
use std::alloc::{GlobalAlloc, Layout};

const MAX_ALIGN: usize = 1 << 20;

/// The alignments 1, 2, 4, ... 1 MiB.
fn alignments() -> impl Iterator<Item = usize> {
    (0..=MAX_ALIGN.trailing_zeros()).map(|k| 1usize << k)
}

/// Sizes around the alignment, a skewed class and a large block.
fn sizes(align: usize) -> Vec<usize> {
    let mut s = vec![1, 24, align, align + 1, 3 * align + 5, 10 << 10, 300 << 10];
    if align > 1 {
        s.push(align - 1);
    }
    s
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).expect("a valid layout")
}

/// `p` is non-null and aligned to `align`.
fn check_aligned(p: *mut u8, size: usize, align: usize, what: &str) {
    assert!(!p.is_null(), "{what}({size}, align {align}) failed");
    assert_eq!(
        p as usize % align,
        0,
        "{what}({size}, align {align}) gave {p:p}"
    );
    assert!(
        coralloc::owns(p),
        "{what}({size}, align {align}): not coralloc's"
    );
}

fn fill(p: *mut u8, size: usize, seed: u8) {
    for i in 0..size {
        // SAFETY: p is a live block of at least size bytes.
        unsafe {
            p.add(i)
                .write((i as u8).wrapping_mul(31).wrapping_add(seed))
        };
    }
}

fn check_filled(p: *const u8, size: usize, seed: u8, what: &str) {
    for i in 0..size {
        // SAFETY: p is a live block of at least size bytes.
        let b = unsafe { p.add(i).read() };
        assert_eq!(
            b,
            (i as u8).wrapping_mul(31).wrapping_add(seed),
            "{what}: byte {i}"
        );
    }
}

#[test]
fn alloc_is_aligned_at_every_alignment() {
    for align in alignments() {
        for size in sizes(align) {
            let l = layout(size, align);
            // SAFETY: a non-zero size; freed with the same layout.
            unsafe {
                let p = Coralloc.alloc(l);
                check_aligned(p, size, align, "alloc");
                fill(p, size, 7);
                check_filled(p, size, 7, "alloc");
                Coralloc.dealloc(p, l);
            }
        }
    }
}

#[test]
fn alloc_zeroed_is_zero_at_every_alignment() {
    for align in alignments() {
        for size in sizes(align) {
            let l = layout(size, align);
            // SAFETY: as above; every byte read lies in the block.
            unsafe {
                // A dirtied block of the same layout goes first, so that the
                // zeroed one may reuse its memory.
                let dirty = Coralloc.alloc(l);
                check_aligned(dirty, size, align, "alloc");
                std::ptr::write_bytes(dirty, 0xa5, size);
                Coralloc.dealloc(dirty, l);
                let p = Coralloc.alloc_zeroed(l);
                check_aligned(p, size, align, "alloc_zeroed");
                let bytes = std::slice::from_raw_parts(p, size);
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "alloc_zeroed({size}, align {align}) is not zero"
                );
                Coralloc.dealloc(p, l);
            }
        }
    }
}

#[test]
fn realloc_keeps_alignment_and_contents_at_every_alignment() {
    for align in alignments() {
        for size in sizes(align) {
            // Grows by a little, then a lot, then shrinks a little and a lot.
            let steps = [size + 1, size * 3 + 100, size * 3, size / 2 + 1, 1];
            // SAFETY: each realloc is given the layout its block has now.
            unsafe {
                let mut l = layout(size, align);
                let mut p = Coralloc.alloc(l);
                check_aligned(p, size, align, "alloc");
                fill(p, size, 3);
                let mut valid = size;
                for &new_size in &steps {
                    let q = Coralloc.realloc(p, l, new_size);
                    check_aligned(q, new_size, align, "realloc");
                    valid = valid.min(new_size);
                    check_filled(
                        q,
                        valid,
                        3,
                        &format!("realloc {size} -> {new_size}, align {align}"),
                    );
                    fill(q, new_size, 3);
                    valid = new_size;
                    p = q;
                    l = layout(new_size, align);
                }
                Coralloc.dealloc(p, l);
            }
        }
    }
}

//! coralloc as the test binary's `#[global_allocator]`: every allocation of
//! this process's Rust code (std's collections, threads' own) goes through
//! `Coralloc`, with several threads and blocks freed by threads other than
//! the one that allocated them.
use coralloc::Coralloc;
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::thread;

#[global_allocator]
static GLOBAL: Coralloc = Coralloc;

#[test]
fn std_collections_are_served_by_coralloc() {
    let v: Vec<u32> = (0..10_000).collect();
    let s = String::from("coralloc");
    let b = Box::new([0u8; 100]);
    assert!(coralloc::owns(v.as_ptr()));
    assert!(coralloc::owns(s.as_ptr()));
    assert!(coralloc::owns(b.as_ptr()));
    let on_stack = 5u8;
    assert!(!coralloc::owns(&on_stack as *const u8));
}

#[test]
fn over_aligned_layouts_are_aligned() {
    #[repr(align(4096))]
    struct Page([u8; 4096]);
    for _ in 0..8 {
        let p = Box::new(Page([7; 4096]));
        assert_eq!(&*p as *const Page as usize % 4096, 0);
        assert_eq!(p.0[4095], 7);
    }
    #[repr(align(64))]
    #[derive(Clone)]
    struct Line(u8);
    let lines = vec![Line(1); 1000];
    assert_eq!(lines.as_ptr() as usize % 64, 0);
    let grown: Vec<Line> = lines.iter().cloned().chain(lines.iter().cloned()).collect();
    assert_eq!(grown.as_ptr() as usize % 64, 0);
    assert!(grown.iter().all(|l| l.0 == 1));
}

#[test]
fn zeroed_allocations_are_zero() {
    for size in [1usize, 16, 1000, 100_000, 8 << 20] {
        let v = vec![0u64; size];
        assert!(v.iter().all(|&x| x == 0), "vec![0; {size}] not zero");
        drop(v);
        let dirty = vec![0xffu8; size]; // leaves dirty blocks for the next round
        drop(dirty);
    }
}

#[test]
fn realloc_keeps_contents() {
    let mut v: Vec<u64> = Vec::new();
    for i in 0..1_000_000u64 {
        v.push(i); // grows from a few bytes through huge blocks
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(v, (0..10).collect::<Vec<u64>>());
}

#[test]
fn threads_allocate_and_free_each_others_blocks() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 200;
    let (tx, rx) = mpsc::channel::<(Vec<String>, HashMap<u32, Vec<u8>>)>();
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let tx = tx.clone();
            thread::spawn(move || {
                for r in 0..ROUNDS {
                    let strings: Vec<String> = (0..50).map(|i| format!("t{t} r{r} s{i}")).collect();
                    let map: HashMap<u32, Vec<u8>> =
                        (0..20).map(|i| (i, vec![t as u8; 10 + i as usize * 7])).collect();
                    assert!(coralloc::owns(strings.as_ptr()));
                    tx.send((strings, map)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    // This thread frees every block the producers made.
    let mut tree = BTreeMap::new();
    let mut received = 0;
    for (strings, map) in rx {
        assert_eq!(strings.len(), 50);
        let t = strings[0].as_bytes()[1] - b'0';
        assert!(map.values().all(|v| v.iter().all(|&b| b == t)));
        tree.insert(strings[0].clone(), map.len());
        received += 1;
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(received, THREADS * ROUNDS);
    assert_eq!(tree.len(), THREADS * ROUNDS);
}

#[test]
fn blocks_outlive_the_thread_that_made_them() {
    let handles: Vec<_> = (0..4)
        .map(|t| thread::spawn(move || (0..1000).map(|i| vec![t as u8; i % 300 + 1]).collect::<Vec<_>>()))
        .collect();
    let all: Vec<Vec<Vec<u8>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (t, blocks) in all.iter().enumerate() {
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.len(), i % 300 + 1);
            assert!(b.iter().all(|&x| x == t as u8));
        }
    }
    drop(all); // the makers have exited: their pages were abandoned, now freed here
    coralloc::collect(true);
}

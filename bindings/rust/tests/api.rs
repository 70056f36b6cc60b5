//! The safe wrappers (bulk, heaps, statistics, options), with the system
//! allocator as Rust's global allocator: coralloc is used only through them.
use coralloc::{Bulk, Heap, OptionError};

#[test]
fn bulk_blocks_are_distinct_and_writable() {
    let mut bulk = Bulk::new(48, 1000).expect("1000 blocks");
    assert_eq!(bulk.len(), 1000);
    assert_eq!(bulk.block_size(), 48);
    let mut addrs: Vec<usize> = bulk.as_ptrs().iter().map(|&p| p as usize).collect();
    assert!(addrs.iter().all(|&a| a % coralloc::MIN_ALIGN == 0));
    for i in 0..bulk.len() {
        for b in bulk.block_mut(i) {
            b.write(i as u8);
        }
    }
    addrs.sort();
    assert!(addrs.windows(2).all(|w| w[1] - w[0] >= 48), "blocks overlap");
    assert!(bulk.as_ptrs().iter().all(|&p| coralloc::owns(p)));
}

#[test]
fn empty_bulk() {
    let bulk = Bulk::new(16, 0).unwrap();
    assert!(bulk.is_empty());
}

#[test]
fn free_bulk_frees_blocks_of_any_size() {
    let mut ptrs: Vec<*mut std::ffi::c_void> = (1..100)
        .map(|i| unsafe { coralloc::ffi::coral_malloc(i * 37) })
        .collect();
    ptrs.push(std::ptr::null_mut());
    unsafe { coralloc::free_bulk(&mut ptrs) };
}

#[test]
fn heap_values_live_until_the_heap_goes() {
    let heap = Heap::new().expect("heap");
    let n = heap.alloc(41u64).unwrap();
    *n += 1;
    let s = heap.alloc_str("in a heap").unwrap();
    s.make_ascii_uppercase();
    assert_eq!(*n, 42);
    assert_eq!(s, "IN A HEAP");
    assert!(coralloc::owns(n as *const u64));
}

#[test]
fn heap_refuses_over_aligned_types() {
    #[repr(align(64))]
    struct Wide(#[allow(dead_code)] u8);
    let heap = Heap::new().unwrap();
    assert!(heap.alloc(Wide(1)).is_err());
}

#[test]
fn heap_drop_frees_everything() {
    // Many blocks, then drop: the heap's pages go back at once, so the bytes
    // in pages return to where they were (the thread heap is untouched).
    let before = coralloc::stat("page_bytes").unwrap();
    {
        let heap = Heap::new().unwrap();
        for i in 0..100_000 {
            heap.alloc_bytes(64 + i % 64).unwrap();
        }
        assert!(coralloc::stat("page_bytes").unwrap() >= before + 100_000 * 64);
    }
    assert!(coralloc::stat("page_bytes").unwrap() < before + 100_000 * 64);
}

#[test]
fn heap_reset_keeps_the_heap() {
    let mut heap = Heap::new().unwrap();
    for _ in 0..3 {
        let z = heap.alloc_zeroed(1000).unwrap();
        let bytes = unsafe { std::slice::from_raw_parts(z.as_ptr(), 1000) };
        assert!(bytes.iter().all(|&b| b == 0));
        heap.alloc_str("x").unwrap();
        heap.reset();
    }
    let p = heap.alloc_bytes(10).unwrap();
    let q = unsafe { heap.realloc(p.as_ptr(), 100_000) }.unwrap();
    unsafe { heap.free(q.as_ptr()) };
}

#[test]
fn heap_blocks_may_be_freed_by_another_thread() {
    let heap = Heap::new().unwrap();
    let addr = heap.alloc_bytes(100).unwrap().as_ptr() as usize;
    std::thread::spawn(move || unsafe { coralloc::ffi::coral_free(addr as *mut _) })
        .join()
        .unwrap();
}

#[test]
fn stats_and_introspection() {
    let json = coralloc::stats_json();
    assert!(json.starts_with('{') && json.ends_with('}'), "{json}");
    assert!(coralloc::stat("mapped").is_some());
    assert_eq!(coralloc::stat("no_such_key"), None);
    assert!(coralloc::good_size(100) >= 100);
    assert_eq!(coralloc::version(), env!("CARGO_PKG_VERSION"));
    let p = unsafe { coralloc::ffi::coral_malloc(100) };
    assert!(unsafe { coralloc::usable_size(p) } >= 100);
    unsafe { coralloc::ffi::coral_free(p) };
}

#[test]
fn options() {
    assert_eq!(coralloc::option_set("purge_delay_ms", 300), Ok(()));
    assert_eq!(coralloc::option_get("CORALLOC_PURGE_DELAY_MS"), Ok(300));
    assert_eq!(coralloc::option_set("HUGE_PAGES", 1), Err(OptionError::StartUpOnly));
    assert_eq!(coralloc::option_set("PURGE_DELAY_MS", -1), Err(OptionError::Invalid));
    assert_eq!(coralloc::option_get("NO_SUCH"), Err(OptionError::Invalid));
    assert_eq!(coralloc::option_get("bad\0name"), Err(OptionError::Invalid));
}

#[test]
fn stat_answers_top_level_keys_only() {
    // "calls" and "bytes" are keys of the objects nested in "os" only.
    let json = coralloc::stats_json();
    assert!(json.contains("\"os\":{") && json.contains("\"calls\":"), "{json}");
    assert_eq!(coralloc::stat("calls"), None);
    assert_eq!(coralloc::stat("bytes"), None);
    assert_eq!(coralloc::stat("mmap"), None); // nested, and an object
    assert_eq!(coralloc::stat("os"), None); // top level, but an object
    assert_eq!(coralloc::stat("per_class"), None); // top level, but a boolean
    assert!(coralloc::stat("segments").is_some());
    // (A top-level number; its value depends on which test threads have
    // allocated through coralloc, so only its presence is checked.)
    assert!(coralloc::stat("threads").is_some());
}

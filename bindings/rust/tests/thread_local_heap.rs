//! A `Heap` kept in thread-local storage, dropped while its thread exits.
//! Alone in its test binary (its figures are the process's `page_bytes`),
//! and its tests take turns.
//!
//! On glibc, `thread_local!` destructors run (`__call_tls_dtors`) before
//! any pthread key destructor, coralloc's thread-exit cleanup among them: the
//! heap is destroyed while its thread's coralloc state is whole: the first
//! test. The second drops the heap from a pthread key destructor of a key
//! made after coralloc's (as `thread_local!` does on targets where Rust keeps
//! thread-locals in pthread keys): coralloc's cleanup waits one destructor
//! round while the thread holds user heaps, so the drop still frees them.
use coralloc::Heap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const BLOCKS: usize = 20_000;
const SIZE: usize = 64;

/// Fills `heap` with BLOCKS blocks of SIZE bytes, written.
fn fill(heap: &Heap) {
    for i in 0..BLOCKS {
        let p = heap.alloc_bytes(SIZE).expect("a block");
        // SAFETY: a fresh block of SIZE bytes.
        unsafe { std::ptr::write_bytes(p.as_ptr(), i as u8, SIZE) };
    }
}

fn page_bytes() -> i64 {
    coralloc::stat("page_bytes").expect("page_bytes in the statistics")
}

thread_local! {
    static HEAP: Heap = Heap::new().expect("a heap");
}

#[test]
fn a_heap_in_a_thread_local_is_destroyed_when_its_thread_exits() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = page_bytes();
    let grown = (BLOCKS * SIZE) as i64;
    std::thread::spawn(move || {
        HEAP.with(fill);
        assert!(
            page_bytes() >= before + grown,
            "the blocks are not in the heap's pages"
        );
    })
    .join()
    .unwrap();
    // Destroyed, its pages went back: not abandoned with the thread.
    assert!(
        page_bytes() < before + grown,
        "the heap outlived its thread"
    );
}

// pthread keys (glibc: pthread_key_t is an unsigned int).
extern "C" {
    fn pthread_key_create(
        key: *mut c_uint,
        dtor: Option<unsafe extern "C" fn(*mut c_void)>,
    ) -> c_int;
    fn pthread_setspecific(key: c_uint, value: *const c_void) -> c_int;
}

/// The key's destructor: drops the Box<Heap> the thread left in it.
unsafe extern "C" fn drop_heap(value: *mut c_void) {
    // SAFETY: the value is a Box<Heap> of this thread, given up by into_raw.
    drop(unsafe { Box::from_raw(value as *mut Heap) });
}

/// A heap dropped by a pthread key destructor that comes after coralloc's
/// own in the same round: glibc runs the keys' destructors in the order the
/// keys were made, and coralloc made its key at its start-up, before this
/// one. The drop frees the heap's pages at once.
#[test]
fn a_heap_dropped_after_coralloc_thread_cleanup() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    drop(Heap::new()); // coralloc is started: its key is made before ours
    let mut key: c_uint = 0;
    // SAFETY: a valid out pointer and destructor.
    assert_eq!(unsafe { pthread_key_create(&mut key, Some(drop_heap)) }, 0);
    let before = page_bytes();
    let grown = (BLOCKS * SIZE) as i64;
    std::thread::spawn(move || {
        let heap = Box::new(Heap::new().expect("a heap"));
        fill(&heap);
        // SAFETY: a live key; the destructor takes the Box back.
        assert_eq!(
            unsafe { pthread_setspecific(key, Box::into_raw(heap) as *const c_void) },
            0
        );
    })
    .join()
    .unwrap();
    assert!(
        page_bytes() < before + grown,
        "the heap outlived its thread"
    );
    // A thread made after it reuses what the exit released: still sound.
    std::thread::spawn(|| {
        let heap = Heap::new().expect("a heap");
        fill(&heap);
    })
    .join()
    .unwrap();
}

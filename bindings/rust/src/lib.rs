//! Rust bindings to coralloc, a general-purpose memory allocator.
//!
//! * [`Coralloc`]: a [`GlobalAlloc`] for `#[global_allocator]`.
//! * [`Bulk`]: many blocks of one size in one call, freed in one call.
//! * [`Heap`]: a first-class heap; dropping it frees everything in it at once.
//! * [`stats_json`], [`stat`], [`collect`], options and introspection.
//!
//! The C library is compiled by this crate's build script (no system install
//! needed). Only the `coral_` API is linked in: `malloc` in C code of the same
//! process stays the system's unless the `override` feature is on.
//!
//! ```
//! use coralloc::Coralloc;
//!
//! #[global_allocator]
//! static GLOBAL: Coralloc = Coralloc;
//!
//! fn main() {
//!     let v: Vec<u64> = (0..1000).collect();
//!     assert!(coralloc::owns(v.as_ptr()));
//! }
//! ```
#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_char, c_int, c_longlong, c_void, CStr, CString};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

pub mod ffi;

/// Every block from `coral_malloc` is aligned to this many bytes, whatever its size.
pub const MIN_ALIGN: usize = 16;

/// coralloc as Rust's global allocator.
///
/// Alignments up to [`MIN_ALIGN`] go through `coral_malloc` and are freed with
/// `coral_free_sized` (the size is checked, not trusted); larger ones through
/// `coral_aligned_alloc` and `coral_free_aligned_sized`. `alloc_zeroed` uses
/// `coral_calloc` (up to [`MIN_ALIGN`]) or `coral_aligned_calloc` (above):
/// neither clears memory known to be fresh from the OS, so a large zeroed
/// block costs no resident memory until it is written, at any alignment.
/// `realloc` up to [`MIN_ALIGN`] uses `coral_realloc` (in place when the size
/// class allows, `mremap` for huge blocks); above, a block that still holds
/// the new size keeps its place, and otherwise a new aligned block is
/// allocated, the bytes copied and the old block freed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Coralloc;

unsafe impl GlobalAlloc for Coralloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            ffi::coral_malloc(layout.size()) as *mut u8
        } else {
            ffi::coral_aligned_alloc(layout.align(), layout.size()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.align() <= MIN_ALIGN {
            ffi::coral_free_sized(ptr as *mut c_void, layout.size())
        } else {
            ffi::coral_free_aligned_sized(ptr as *mut c_void, layout.align(), layout.size())
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            ffi::coral_calloc(1, layout.size()) as *mut u8
        } else {
            ffi::coral_aligned_calloc(layout.align(), 1, layout.size()) as *mut u8
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            return ffi::coral_realloc(ptr as *mut c_void, new_size) as *mut u8;
        }
        // Shrinking by less than half, or growing within the block's usable
        // size: the block stays (its address is aligned; dealloc checks the
        // new size against the block, which holds it), as coral_realloc keeps
        // a block shrunk by less than half.
        let usable = ffi::coral_malloc_usable_size(ptr as *const c_void);
        if new_size <= usable && new_size >= usable / 2 {
            return ptr;
        }
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let p = self.alloc(new_layout);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        p
    }
}

/// True when `p` points into memory coralloc manages.
pub fn owns<T>(p: *const T) -> bool {
    // SAFETY: coral_owns reads only coralloc's own segment map, never *p.
    unsafe { ffi::coral_owns(p as *const c_void) != 0 }
}

/// The usable size `coral_malloc(size)` would give, without allocating; 0 when
/// `size` is too large to allocate.
pub fn good_size(size: usize) -> usize {
    // SAFETY: no pointer involved.
    unsafe { ffi::coral_good_size(size) }
}

/// The usable size of a block coralloc gave.
///
/// # Safety
/// `p` must be a live block from coralloc (or null).
pub unsafe fn usable_size<T>(p: *const T) -> usize {
    ffi::coral_malloc_usable_size(p as *const c_void)
}

/// Returns memory the process is not using to the OS now; `force` also
/// collects this thread's caches and abandoned memory first.
pub fn collect(force: bool) {
    // SAFETY: no pointer involved.
    unsafe { ffi::coral_collect(c_int::from(force)) }
}

/// The C library's version, e.g. `"0.1.0"`.
pub fn version() -> &'static str {
    // SAFETY: coral_version returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::coral_version()) }.to_str().unwrap_or("?")
}

// ---- statistics -----------------------------------------------------------------

/// coralloc's statistics as one JSON object (OS calls and bytes, mapped,
/// resident and in-page memory with their peaks, segments, threads, huge
/// blocks...), as `coral_stats_json` writes it.
pub fn stats_json() -> String {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // SAFETY: buf has buf.len() writable bytes; len 0 only sizes.
        let n = unsafe { ffi::coral_stats_json(buf.as_mut_ptr() as *mut c_char, buf.len()) };
        if n < buf.len() {
            buf.truncate(n);
            return String::from_utf8_lossy(&buf).into_owned();
        }
        buf = vec![0; n + 4096]; // figures may grow between calls
    }
}

/// One top-level number of the statistics by its JSON key (`"mapped"`,
/// `"rss"`, `"huge_allocs"`, `"threads"`, ...), or `None` if there is no such
/// key at the top level or its value is not a number (keys inside the nested
/// objects, such as `"calls"` in `"os"`, do not answer).
pub fn stat(key: &str) -> Option<i64> {
    let json = stats_json();
    let value = top_level_value(&json, key)?;
    let end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(value.len());
    value[..end].parse().ok()
}

/// The text after `"key":` where `key` is a key of the outermost object of
/// `json` (depth 1), or `None`. Strings are skipped whole (with their
/// escapes), so a brace or quote inside one does not count.
fn top_level_value<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let bytes = json.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b'"' => {
                let start = i + 1;
                i = start;
                while *bytes.get(i)? != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                if depth == 1 && &json[start..i] == key && bytes.get(i + 1) == Some(&b':') {
                    return Some(&json[i + 2..]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

// ---- options ----------------------------------------------------------------------

/// An error from coralloc's option calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionError {
    /// No option of that name, or a value out of its range.
    Invalid,
    /// The option is read at start-up only.
    StartUpOnly,
}

fn option_name(name: &str) -> Result<CString, OptionError> {
    CString::new(name).map_err(|_| OptionError::Invalid)
}

/// The value in force of option `name` (`"PURGE_DELAY_MS"` or
/// `"CORALLOC_PURGE_DELAY_MS"`, any case).
pub fn option_get(name: &str) -> Result<i64, OptionError> {
    let name = option_name(name)?;
    let mut v: c_longlong = 0;
    // SAFETY: valid C string and out pointer.
    match unsafe { ffi::coral_option_get(name.as_ptr(), &mut v) } {
        0 => Ok(v),
        _ => Err(OptionError::Invalid),
    }
}

/// Changes an option that may change at run time.
pub fn option_set(name: &str, value: i64) -> Result<(), OptionError> {
    let name = option_name(name)?;
    // SAFETY: valid C string.
    match unsafe { ffi::coral_option_set(name.as_ptr(), value) } {
        0 => Ok(()),
        libc_eperm if libc_eperm == ffi::EPERM => Err(OptionError::StartUpOnly),
        _ => Err(OptionError::Invalid),
    }
}

// ---- heap profile ------------------------------------------------------------------

/// The sampling heap profiler (docs/PROFILING.md): on when the process
/// starts with `CORALLOC_PROFILE=FILE` (or `CORALLOC_PROFILE_LEAKS=1`) in its
/// environment, as `coralloc run --profile FILE -- CMD` sets it; it then
/// samples one allocation in about every `CORALLOC_PROFILE_RATE` bytes
/// (512 KiB) made through coralloc, here those of a `#[global_allocator]
/// static GLOBAL: Coralloc` and of the crate's own types.
pub mod profile {
    use crate::ffi;
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// Writes the profile now to `path`, in the pprof format (read it with
    /// `coralloc profile FILE` or `pprof`). Allocates nothing through
    /// malloc while it writes. Errors: `Unsupported` when profiling is off,
    /// `InvalidInput` for a path with a NUL byte, else the error of
    /// creating or writing the file.
    pub fn dump<P: AsRef<Path>>(path: P) -> io::Result<()> {
        let path = CString::new(path.as_ref().as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        // SAFETY: a valid C string.
        match unsafe { ffi::coral_profile_dump(path.as_ptr()) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// How many sampled blocks are live now, and the bytes they asked for
    /// (the samples themselves, not scaled to estimates): `(0, 0)` when
    /// profiling is off.
    pub fn live() -> (u64, u64) {
        let (mut blocks, mut bytes) = (0u64, 0u64);
        // SAFETY: valid out pointers.
        unsafe { ffi::coral_profile_live(&mut blocks, &mut bytes) };
        (blocks, bytes)
    }
}

// ---- bulk --------------------------------------------------------------------------

/// `n` blocks of one size, allocated in one call (`coral_malloc_bulk`) and
/// freed in one call (`coral_free_bulk`) when dropped. The blocks are
/// uninitialised: write before you read. A `Bulk` may move to another thread
/// and be dropped there.
///
/// ```
/// fn is_send<T: Send>() {}
/// is_send::<coralloc::Bulk>();
/// ```
#[derive(Debug)]
pub struct Bulk {
    ptrs: Vec<*mut c_void>,
    size: usize,
}

impl Bulk {
    /// `n` blocks of `size` bytes each (each aligned to [`MIN_ALIGN`]), or
    /// `None` when memory ran out.
    pub fn new(size: usize, n: usize) -> Option<Bulk> {
        let mut ptrs: Vec<*mut c_void> = vec![std::ptr::null_mut(); n];
        // SAFETY: ptrs has room for n pointers.
        let got = unsafe { ffi::coral_malloc_bulk(size, n, ptrs.as_mut_ptr()) };
        if got < n {
            // SAFETY: the first `got` are valid blocks; the rest are null.
            unsafe { ffi::coral_free_bulk(ptrs.as_mut_ptr(), got) };
            return None;
        }
        Some(Bulk { ptrs, size })
    }

    /// How many blocks.
    pub fn len(&self) -> usize {
        self.ptrs.len()
    }

    /// True when there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }

    /// The size asked for each block.
    pub fn block_size(&self) -> usize {
        self.size
    }

    /// Block `i`, to write (it is uninitialised until written).
    pub fn block_mut(&mut self, i: usize) -> &mut [MaybeUninit<u8>] {
        let p = self.ptrs[i] as *mut MaybeUninit<u8>;
        // SAFETY: a live block of `size` bytes owned by self, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(p, self.size) }
    }

    /// The blocks' addresses.
    pub fn as_ptrs(&self) -> &[*mut c_void] {
        &self.ptrs
    }
}

// SAFETY: Bulk owns its blocks; coralloc lets any thread use and free them.
unsafe impl Send for Bulk {}

impl Drop for Bulk {
    fn drop(&mut self) {
        // SAFETY: every pointer is a live block from coral_malloc_bulk.
        unsafe { ffi::coral_free_bulk(self.ptrs.as_mut_ptr(), self.ptrs.len()) }
    }
}

/// Frees an array of blocks of any sizes and owners in one call; null entries
/// are skipped.
///
/// # Safety
/// Every non-null pointer must be a live block from coralloc, freed only here.
pub unsafe fn free_bulk(ptrs: &mut [*mut c_void]) {
    ffi::coral_free_bulk(ptrs.as_mut_ptr(), ptrs.len())
}

// ---- heaps -------------------------------------------------------------------------

/// A first-class heap: blocks allocated from it are all freed at once when it
/// is dropped (or [`reset`](Heap::reset)), in time proportional to its pages.
///
/// A coralloc heap belongs to the thread that created it: only that thread may
/// allocate from it, reset or destroy it, so `Heap` is neither `Send` nor
/// `Sync`. Any thread may read and write its blocks.
///
/// A `Heap` in a `thread_local!`, or dropped by a pthread key destructor of
/// your own, is destroyed when its thread exits, with everything in it: Rust
/// runs `thread_local!` destructors (glibc's `__cxa_thread_atexit_impl`)
/// before any pthread key destructor, and coralloc's thread-exit cleanup
/// (a key destructor) waits one destructor round while its thread holds user
/// heaps, so key destructors made after coralloc's own also find the heap
/// whole (tests/thread_local_heap.rs). A heap dropped later than that (a key
/// destructor that runs in the third round or after) is still sound: the
/// drop frees no block at once, its blocks stay valid and are returned only
/// when freed one by one.
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<coralloc::Heap>(); // a Heap cannot move to another thread
/// ```
/// ```compile_fail
/// fn is_sync<T: Sync>() {}
/// is_sync::<coralloc::Heap>(); // nor be shared with one
/// ```
///
/// [`alloc`](Heap::alloc) moves a value into the heap and lends it for as long
/// as the heap is borrowed; its destructor never runs (the memory goes back
/// with the heap), so use it for values whose drop does nothing important.
#[derive(Debug)]
pub struct Heap {
    raw: NonNull<ffi::coral_heap_t>,
    _owner_thread: PhantomData<*mut ()>, // !Send, !Sync
}

impl Heap {
    /// A new, empty heap owned by the calling thread; `None` when memory ran out.
    pub fn new() -> Option<Heap> {
        // SAFETY: no arguments.
        let raw = NonNull::new(unsafe { ffi::coral_heap_new() })?;
        Some(Heap {
            raw,
            _owner_thread: PhantomData,
        })
    }

    /// `size` uninitialised bytes (aligned to [`MIN_ALIGN`]), or `None`.
    pub fn alloc_bytes(&self, size: usize) -> Option<NonNull<u8>> {
        // SAFETY: the heap is live and this is its owner thread (!Send).
        NonNull::new(unsafe { ffi::coral_heap_malloc(self.raw.as_ptr(), size) } as *mut u8)
    }

    /// `size` zeroed bytes, or `None`.
    pub fn alloc_zeroed(&self, size: usize) -> Option<NonNull<u8>> {
        // SAFETY: as alloc_bytes.
        NonNull::new(unsafe { ffi::coral_heap_calloc(self.raw.as_ptr(), 1, size) } as *mut u8)
    }

    /// Moves `value` into the heap; it lives as long as the heap is borrowed
    /// (its destructor is not run). Types aligned to more than [`MIN_ALIGN`]
    /// bytes and a heap out of memory give `Err(value)`.
    #[allow(clippy::mut_from_ref)] // each call returns a new block: no aliasing
    pub fn alloc<T>(&self, value: T) -> Result<&mut T, T> {
        if std::mem::align_of::<T>() > MIN_ALIGN {
            return Err(value);
        }
        let size = std::mem::size_of::<T>().max(1);
        match self.alloc_bytes(size) {
            Some(p) => {
                let p = p.as_ptr() as *mut T;
                // SAFETY: a fresh block of size_of::<T>() bytes, aligned.
                unsafe {
                    p.write(value);
                    Ok(&mut *p)
                }
            }
            None => Err(value),
        }
    }

    /// Moves a copy of `s` into the heap.
    #[allow(clippy::mut_from_ref)] // each call returns a new block: no aliasing
    pub fn alloc_str(&self, s: &str) -> Option<&mut str> {
        let p = self.alloc_bytes(s.len().max(1))?.as_ptr();
        // SAFETY: a fresh block of s.len() bytes, filled with valid UTF-8.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
            Some(std::str::from_utf8_unchecked_mut(
                std::slice::from_raw_parts_mut(p, s.len()),
            ))
        }
    }

    /// Resizes a block of this heap (`coral_heap_realloc`).
    ///
    /// # Safety
    /// `p` must be a live block of this heap (or null); on success it is no
    /// longer valid.
    pub unsafe fn realloc(&self, p: *mut u8, size: usize) -> Option<NonNull<u8>> {
        NonNull::new(ffi::coral_heap_realloc(self.raw.as_ptr(), p as *mut c_void, size) as *mut u8)
    }

    /// Frees one block before the heap goes.
    ///
    /// # Safety
    /// `p` must be a live block of this heap, not used again.
    pub unsafe fn free(&self, p: *mut u8) {
        ffi::coral_heap_free(self.raw.as_ptr(), p as *mut c_void)
    }

    /// Frees every block of the heap and keeps the heap.
    pub fn reset(&mut self) {
        // SAFETY: &mut self: no block lent by alloc/alloc_str is still borrowed.
        unsafe { ffi::coral_heap_reset(self.raw.as_ptr()) }
    }

    /// The raw handle, for the C API.
    pub fn as_raw(&self) -> *mut ffi::coral_heap_t {
        self.raw.as_ptr()
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: the heap is live and this is its owner thread (!Send).
        unsafe { ffi::coral_heap_destroy(self.raw.as_ptr()) }
    }
}

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadmeDoctests;

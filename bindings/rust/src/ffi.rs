//! The C API of `coralloc.h`, as the build script compiles it (the `coral_`
//! names; `malloc` itself is not overridden unless the `override` feature is on).
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_longlong, c_void};

/// `EPERM` on Linux: `coral_option_set` of a start-up-only option.
pub const EPERM: c_int = 1;

/// A first-class heap (`coral_heap_t`).
#[repr(C)]
pub struct coral_heap_t {
    _opaque: [u8; 0],
}

extern "C" {
    pub fn coral_malloc(size: usize) -> *mut c_void;
    pub fn coral_free(p: *mut c_void);
    pub fn coral_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn coral_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn coral_aligned_alloc(alignment: usize, size: usize) -> *mut c_void;
    pub fn coral_aligned_calloc(alignment: usize, n: usize, size: usize) -> *mut c_void;
    pub fn coral_malloc_usable_size(p: *const c_void) -> usize;
    pub fn coral_free_sized(p: *mut c_void, size: usize);
    pub fn coral_free_aligned_sized(p: *mut c_void, alignment: usize, size: usize);
    pub fn coral_good_size(size: usize) -> usize;

    pub fn coral_malloc_bulk(size: usize, n: usize, out: *mut *mut c_void) -> usize;
    pub fn coral_malloc_bulk_sizes(sizes: *const usize, n: usize, out: *mut *mut c_void) -> usize;
    pub fn coral_free_bulk(ptrs: *mut *mut c_void, n: usize);

    pub fn coral_heap_new() -> *mut coral_heap_t;
    pub fn coral_heap_destroy(heap: *mut coral_heap_t);
    pub fn coral_heap_reset(heap: *mut coral_heap_t);
    pub fn coral_heap_malloc(heap: *mut coral_heap_t, size: usize) -> *mut c_void;
    pub fn coral_heap_calloc(heap: *mut coral_heap_t, n: usize, size: usize) -> *mut c_void;
    pub fn coral_heap_realloc(heap: *mut coral_heap_t, p: *mut c_void, size: usize) -> *mut c_void;
    pub fn coral_heap_free(heap: *mut coral_heap_t, p: *mut c_void);

    pub fn coral_owns(p: *const c_void) -> c_int;
    pub fn coral_collect(force: c_int);
    pub fn coral_stats_json(buf: *mut c_char, len: usize) -> usize;
    pub fn coral_option_get(name: *const c_char, value: *mut c_longlong) -> c_int;
    pub fn coral_option_set(name: *const c_char, value: c_longlong) -> c_int;
    pub fn coral_version() -> *const c_char;

    pub fn coral_profile_dump(path: *const c_char) -> c_int;
    pub fn coral_profile_live(blocks: *mut u64, bytes: *mut u64);
}

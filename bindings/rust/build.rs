//! Compiles coralloc's C sources into a static library with the `cc` crate:
//! every `*.c` under the repository's `src/`, found by walking the folder (so
//! the build follows the sources when they move between layer folders), with
//! `include/`, `src/` and every folder under `src/` as include paths, and
//! these flags: `-O3 -DNDEBUG` always (a debug Rust build still gets a fast
//! allocator), hidden visibility and initial-exec TLS as CMakeLists.txt
//! builds the library, and `-fno-plt` where the compiler has it, which
//! CMakeLists.txt leaves out on purpose (the shared library binds its libc
//! calls lazily, for the start-up of every process that preloads it): here
//! the C code's calls into libc go through the GOT, bound when the program
//! starts.
//!
//! `override.c` (the `malloc`/`free` symbols) is left out unless the feature
//! `override` asks for it: a Rust program that picks `Coralloc` as its
//! `#[global_allocator]` gets coralloc for Rust's allocations through the
//! `coral_` API, and C code in the same process (libc, `-sys` crates) keeps the
//! system malloc. Replacing `malloc` process-wide from a Rust dependency would
//! be a surprise, so it is opt-in.
use std::path::{Path, PathBuf};

fn walk(dir: &Path, c_files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("coralloc: cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("coralloc: directory entry").path())
        .collect();
    entries.sort();
    dirs.push(dir.to_path_buf());
    for path in entries {
        if path.is_dir() {
            walk(&path, c_files, dirs);
        } else if path.extension().is_some_and(|e| e == "c") {
            c_files.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..");
    let src = root.join("src");
    let include = root.join("include");
    let with_override = std::env::var_os("CARGO_FEATURE_OVERRIDE").is_some();

    let mut c_files = Vec::new();
    let mut dirs = Vec::new();
    walk(&src, &mut c_files, &mut dirs);
    c_files.retain(|f| with_override || f.file_name().is_none_or(|n| n != "override.c"));
    assert!(!c_files.is_empty(), "coralloc: no C sources under {}", src.display());

    let mut build = cc::Build::new();
    build
        .files(&c_files)
        .include(&include)
        .includes(&dirs)
        .std("gnu11")
        .opt_level(3)
        .define("NDEBUG", None)
        .flag("-fvisibility=hidden")
        .flag("-ftls-model=initial-exec")
        .flag_if_supported("-fno-plt")
        .warnings(false);
    build.compile("coralloc");

    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    for f in c_files.iter().chain(dirs.iter()) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    for d in &dirs {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "h") {
                    println!("cargo:rerun-if-changed={}", e.path().display());
                }
            }
        }
    }
    println!("cargo:include={}", include.display());
}

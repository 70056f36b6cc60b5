//! `coralloc::profile`: `dump` refuses when profiling is off, and writes a
//! profile when the process started with `CORALLOC_PROFILE` set (the test
//! runs itself again with it: coralloc reads its options at start-up).
use std::io::ErrorKind;
use std::process::Command;

/// Set in the child this test starts with profiling on.
const CHILD: &str = "CORALLOC_RUST_PROFILE_CHILD";

#[test]
fn dump_is_unsupported_when_profiling_is_off() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let err = coralloc::profile::dump(std::env::temp_dir().join("coralloc-off.prof"))
        .expect_err("profiling is off");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert_eq!(coralloc::profile::live(), (0, 0));
}

#[test]
fn dump_writes_the_profile_of_a_profiled_process() {
    let dir = std::env::temp_dir().join(format!("coralloc-rust-profile-{}", std::process::id()));
    if let Some(out) = std::env::var_os(CHILD) {
        // The child: keep 16 MiB in 64 KiB blocks (about 32 samples at the
        // default rate of 512 KiB), then dump.
        // SAFETY: coral_malloc's blocks, each freed once below.
        let blocks: Vec<_> = (0..256)
            .map(|_| unsafe { coralloc::ffi::coral_malloc(64 * 1024) })
            .collect();
        assert!(blocks.iter().all(|p| !p.is_null()));
        let (sampled, _) = coralloc::profile::live();
        assert!(sampled > 0, "no allocation of 16 MiB was sampled");
        coralloc::profile::dump(&out).expect("the profile written");
        for p in blocks {
            // SAFETY: a live block of coral_malloc.
            unsafe { coralloc::ffi::coral_free(p) };
        }
        return;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("now.prof");
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dump_writes_the_profile_of_a_profiled_process",
            "--nocapture",
        ])
        .env("CORALLOC_PROFILE", dir.join("at-exit.prof"))
        .env(CHILD, &out)
        .status()
        .expect("the test binary runs again");
    assert!(status.success(), "the profiled child failed: {status}");
    let written = std::fs::metadata(&out).expect("the dumped file").len();
    assert!(written > 0, "an empty profile");
    std::fs::remove_dir_all(&dir).ok();
}

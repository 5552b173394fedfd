//! `gpuq-fake-driver SCRIPT`: plays the CUDA driver and the application for collector tests.
//!
//! 1. Loads the fake CUPTI (`$GPUQ_FAKE_CUPTI`, else `libgpuq_fakecupti.so` next to this
//!    executable, in its `deps/`, or its parent dir) with `RTLD_NOW|RTLD_GLOBAL`, as libtorch maps
//!    libcupti; exit 98 if it is not found.
//! 2. Applies the script's leading setup lines (`fakecupti_prepare`), then, if
//!    `CUDA_INJECTION64_PATH` is set, loads it and calls `InitializeInjection` once, as `cuInit`
//!    does (a library that cannot be loaded is reported and ignored, like the real driver).
//! 3. Plays the script (`fakecupti_play`) and leaves with `libc::exit(code)` so `atexit` handlers
//!    run as at a normal process exit.
//!
//! It deliberately does not link the `gpuq_fakecupti` rlib: the fake must exist once, in the
//! loaded `.so`, or the collector and the script would talk to two different states.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

const NOT_FOUND: c_int = 98;

fn dlerror() -> String {
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlerror".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn dlopen(path: &str, flags: c_int) -> Result<*mut c_void, String> {
    let c = CString::new(path).map_err(|_| format!("{path:?}: NUL in path"))?;
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        Err(dlerror())
    } else {
        Ok(h)
    }
}

fn dlsym(h: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn find_fake() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUQ_FAKE_CUPTI").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    // cargo build puts the cdylib in target/<profile>/, cargo test in target/<profile>/deps/
    // without updating the other: the newest is the one built with this harness.
    [
        Some(dir.to_path_buf()),
        Some(dir.join("deps")),
        dir.parent().map(|p| p.to_path_buf()),
    ]
    .into_iter()
    .flatten()
    .map(|d| d.join("libgpuq_fakecupti.so"))
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max()
    .map(|(_, p)| p)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 2 {
        eprintln!("usage: gpuq-fake-driver SCRIPT");
        std::process::exit(2);
    }
    let script = CString::new(args[1].as_str()).expect("no NUL in a command-line argument");

    let Some(fake_path) = find_fake() else {
        eprintln!(
            "fake-driver: libgpuq_fakecupti.so not found next to {:?} (set GPUQ_FAKE_CUPTI or run \
             `cargo build --release -p gpuq-fakecupti`)",
            std::env::current_exe().unwrap_or_default()
        );
        std::process::exit(NOT_FOUND);
    };
    let fake = match dlopen(
        &fake_path.to_string_lossy(),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    ) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("fake-driver: cannot load {}: {e}", fake_path.display());
            std::process::exit(NOT_FOUND);
        }
    };
    type ScriptFn = unsafe extern "C" fn(*const c_char) -> c_int;
    let (Some(play), Some(prepare)) = (
        dlsym(fake, c"fakecupti_play"),
        dlsym(fake, c"fakecupti_prepare"),
    ) else {
        eprintln!(
            "fake-driver: {} lacks fakecupti_play/fakecupti_prepare",
            fake_path.display()
        );
        std::process::exit(NOT_FOUND);
    };
    let play: ScriptFn = unsafe { std::mem::transmute::<*mut c_void, ScriptFn>(play) };
    let prepare: ScriptFn = unsafe { std::mem::transmute::<*mut c_void, ScriptFn>(prepare) };

    // What InitializeInjection sees (version, subscriber) must be set before it runs.
    let code = unsafe { prepare(script.as_ptr()) };
    if code != 0 {
        unsafe { libc::exit(code) };
    }

    if let Some(inj) = std::env::var_os("CUDA_INJECTION64_PATH").filter(|p| !p.is_empty()) {
        let inj = inj.to_string_lossy().into_owned();
        match dlopen(&inj, libc::RTLD_NOW) {
            Err(e) => eprintln!("fake-driver: cannot load injection library {inj}: {e}"),
            Ok(h) => match dlsym(h, c"InitializeInjection") {
                None => eprintln!("fake-driver: {inj} has no InitializeInjection"),
                Some(f) => {
                    type InitFn = unsafe extern "C" fn() -> c_int;
                    let f: InitFn = unsafe { std::mem::transmute::<*mut c_void, InitFn>(f) };
                    let r = unsafe { f() };
                    eprintln!("fake-driver: InitializeInjection returned {r}");
                }
            },
        }
    }

    let code = unsafe { play(script.as_ptr()) };
    unsafe { libc::exit(code) };
}

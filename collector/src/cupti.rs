//! The CUPTI functions the collector calls, looked up in the libcupti the process already has.
//!
//! Two copies of libcupti in one process collide (each is a CUPTI instance of its own), so
//! the one the application mapped is found first by soname without loading anything
//! (`RTLD_NOLOAD`); only when none is mapped yet is one loaded (`GPUQ_CUPTI_LIB`, else by
//! soname, the path PyTorch's and the CUDA toolkit's loaders resolve). Symbols are looked up
//! one by one with `dlsym`: a missing required one disables the collector, never the process.
//! (cudarc's CUPTI bindings panic on a missing symbol and may load a second copy by the
//! unversioned name `libcupti.so`, so they are not used here.)

use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub type CuptiResult = u32;
pub const SUCCESS: CuptiResult = 0;
pub const ERROR_MAX_LIMIT_REACHED: CuptiResult = 12;
pub const ERROR_MULTIPLE_SUBSCRIBERS: CuptiResult = 39;

pub const FLUSH_FORCED: u32 = 1;
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;
pub const DOMAIN_DRIVER_API: u32 = 1;
pub const DOMAIN_RUNTIME_API: u32 = 2;

/// CUPTI activity kinds (`CUpti_ActivityKind`), stable from CUDA 12 to 13.5.
pub mod kind {
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const KERNEL: u32 = 3;
    pub const DRIVER: u32 = 4;
    pub const RUNTIME: u32 = 5;
    pub const DEVICE: u32 = 8;
    pub const CONTEXT: u32 = 9;
    pub const CONCURRENT_KERNEL: u32 = 10;
    pub const MARKER: u32 = 12;
    pub const OVERHEAD: u32 = 17;
    pub const SYNCHRONIZATION: u32 = 38;
    pub const EXTERNAL_CORRELATION: u32 = 39;
}

pub type BufferRequested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type BufferCompleted = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
pub type SubscriberCallback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// The resolved functions.
pub struct Cupti {
    /// Where the library was found, for the status file.
    pub library: String,
    pub get_version: unsafe extern "C" fn(*mut u32) -> CuptiResult,
    pub subscribe:
        unsafe extern "C" fn(*mut *mut c_void, SubscriberCallback, *mut c_void) -> CuptiResult,
    pub register_callbacks: unsafe extern "C" fn(BufferRequested, BufferCompleted) -> CuptiResult,
    pub enable: unsafe extern "C" fn(u32) -> CuptiResult,
    pub flush_all: unsafe extern "C" fn(u32) -> CuptiResult,
    pub get_next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> CuptiResult,
    pub get_num_dropped: unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> CuptiResult,
    pub get_timestamp: unsafe extern "C" fn(*mut u64) -> CuptiResult,
    pub set_thread_id_type: unsafe extern "C" fn(u32) -> CuptiResult,
    pub get_callback_name: unsafe extern "C" fn(u32, u32, *mut *const c_char) -> CuptiResult,
    /// Used only to undo a start that failed half-way, or to stop after a failure.
    pub unsubscribe: Option<unsafe extern "C" fn(*mut c_void) -> CuptiResult>,
    pub disable: Option<unsafe extern "C" fn(u32) -> CuptiResult>,
}

/// The sonames tried, newest first.
const SONAMES: [&str; 2] = ["libcupti.so.13", "libcupti.so.12"];

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a C string owned by libc, read before any other dl call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn open(name: &str, flags: c_int) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlopen with a valid C string; a NULL result is handled.
    let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
    (!handle.is_null()).then_some(handle)
}

/// The libcupti to use (see the module's comment): its handle and where it was found.
fn find_library() -> Result<(*mut c_void, String), String> {
    for soname in SONAMES {
        if let Some(h) = open(soname, libc::RTLD_NOW | libc::RTLD_NOLOAD) {
            return Ok((h, format!("{soname} (already loaded)")));
        }
    }
    if let Ok(path) = std::env::var("GPUQ_CUPTI_LIB") {
        return match open(&path, libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            Some(h) => Ok((h, path)),
            None => Err(format!("GPUQ_CUPTI_LIB={path}: {}", dlerror_text())),
        };
    }
    for soname in SONAMES {
        if let Some(h) = open(soname, libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            return Ok((h, soname.to_string()));
        }
    }
    Err(format!(
        "no libcupti found ({} not loaded, none loadable; set GPUQ_CUPTI_LIB to its path)",
        SONAMES.join(", ")
    ))
}

/// NVTX's injection entry point, passed on to libcupti's own: NVTX ranges reach CUPTI (as
/// MARKER records) only through it. `gpuq record` points `NVTX_INJECTION64_PATH` at the
/// collector, which the application's first NVTX call loads, before or after `cuInit`.
pub fn nvtx_initialize(get_export_table: *const c_void) -> c_int {
    let Ok((handle, _)) = find_library() else {
        return 0;
    };
    let Ok(name) = CString::new("InitializeInjectionNvtx2") else {
        return 0;
    };
    // SAFETY: a handle from dlopen and a C string.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return 0;
    }
    // SAFETY: libcupti's InitializeInjectionNvtx2, `int (*)(NvtxGetExportTableFunc_t)`.
    let init: unsafe extern "C" fn(*const c_void) -> c_int = unsafe { std::mem::transmute(p) };
    // SAFETY: NVTX's pointer, passed on unchanged.
    unsafe { init(get_export_table) }
}

impl Cupti {
    /// Finds libcupti (see the module's comment) and resolves the functions, or says why not.
    pub fn load() -> Result<Cupti, String> {
        let (handle, library) = find_library()?;
        let sym = |name: &str| -> Option<*mut c_void> {
            let c = CString::new(name).ok()?;
            // SAFETY: a valid handle from dlopen and a C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        macro_rules! required {
            ($name:literal) => {{
                let p = sym($name).ok_or_else(|| format!("{library} has no {}", $name))?;
                // SAFETY: the symbol is CUPTI's function of this name, whose C signature the
                // field's type spells.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        macro_rules! optional {
            ($name:literal) => {{
                // SAFETY: as for `required!`.
                sym($name).map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
            }};
        }
        Ok(Cupti {
            get_version: required!("cuptiGetVersion"),
            subscribe: required!("cuptiSubscribe"),
            register_callbacks: required!("cuptiActivityRegisterCallbacks"),
            enable: required!("cuptiActivityEnable"),
            flush_all: required!("cuptiActivityFlushAll"),
            get_next_record: required!("cuptiActivityGetNextRecord"),
            get_num_dropped: required!("cuptiActivityGetNumDroppedRecords"),
            get_timestamp: required!("cuptiGetTimestamp"),
            set_thread_id_type: required!("cuptiSetThreadIdType"),
            get_callback_name: required!("cuptiGetCallbackName"),
            unsubscribe: optional!("cuptiUnsubscribe"),
            disable: optional!("cuptiActivityDisable"),
            library,
        })
    }

    /// The file libcupti was loaded from (the path NVTX's injection variable must name).
    pub fn file(&self) -> Option<String> {
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr on the address of a function of the loaded library.
        let r = unsafe { libc::dladdr(self.get_version as *const c_void, &mut info) };
        if r == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated path owned by the dynamic linker.
        Some(
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub fn version(&self) -> u32 {
        let mut v = 0;
        // SAFETY: CUPTI writes one u32.
        unsafe { (self.get_version)(&mut v) };
        v
    }

    pub fn timestamp(&self) -> i64 {
        let mut t = 0u64;
        // SAFETY: CUPTI writes one u64.
        unsafe { (self.get_timestamp)(&mut t) };
        t as i64
    }

    /// The name of an API call (`cudaLaunchKernel_v7000`), if CUPTI knows it.
    pub fn callback_name(&self, domain: u32, cbid: u32) -> Option<Vec<u8>> {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: CUPTI writes a pointer to a static C string, or leaves it NULL.
        let r = unsafe { (self.get_callback_name)(domain, cbid, &mut p) };
        if r != SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated string owned by CUPTI.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
    }
}

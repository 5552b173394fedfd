//! Gives the cdylib the soname `libcupti.so.13`, so a collector's
//! `dlopen("libcupti.so.13", RTLD_NOLOAD)` finds it once a harness has loaded it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcupti.so.13");
    println!("cargo:rerun-if-changed=build.rs");
}

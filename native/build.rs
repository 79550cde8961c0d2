//! Links the module with eager binding (`-z now`): every Envoy callback the module
//! declares is resolved when Envoy loads it, so an Envoy that lacks one refuses the
//! load with the dynamic linker's message naming it, instead of the module failing at
//! the first request that would call it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}

//! Links GCC's unwinder into corral's binaries (libgcc_eh.a) instead of loading libgcc_s.so.1:
//! one shared object fewer for the loader to map and relocate at every start, and no
//! `__cpu_indicator_init` (libgcc_s's constructor, whose `cpuid`s trap to the hypervisor in a
//! VM). Together 0.13-0.26 ms of every corral start on a Firecracker VM; the unwinder is the
//! same code (docs/BENCHMARKS.md, "Executor"). Only for a dynamically linked glibc build: with
//! `+crt-static` the standard library links libgcc_eh itself.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !crt_static
    {
        println!("cargo:rustc-link-lib=static=gcc_eh");
    }
}

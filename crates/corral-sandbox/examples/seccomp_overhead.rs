//! The per-syscall cost of corral's seccomp filter, measured in one process before and after
//! installing it (docs/BENCHMARKS.md, "Hardening").
//!
//!     cargo run --release -p corral-sandbox --example seccomp_overhead [ITERATIONS]
//!
//! Three syscalls: `getppid`, whose verdict does not depend on its arguments (the kernel caches
//! such "always allow" verdicts in a bitmap since Linux 5.11, so the filter is not even run),
//! `ioctl(FIONREAD)`, which the filter must inspect (it compares the request with TIOCSTI
//! and TIOCLINUX), so the BPF program runs on every call, and `openat` of /dev/null (with its
//! `close`), inspected for a set-id mode when it creates.

use std::time::Instant;

fn ns_per_call(n: u64, mut f: impl FnMut()) -> f64 {
    // Best of 5 rounds, to keep scheduler noise on a shared machine out of the figure.
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds into the array we pass.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let mut avail: libc::c_int = 0;
    // SAFETY (both closures): raw syscalls with valid arguments.
    let getppid = || unsafe {
        libc::syscall(libc::SYS_getppid);
    };
    let mut ioctl = || unsafe {
        libc::ioctl(fds[0], libc::FIONREAD, &mut avail);
    };
    let openat = || {
        // SAFETY: openat of a NUL-terminated path, then close of what it returned.
        unsafe {
            let fd = libc::openat(libc::AT_FDCWD, c"/dev/null".as_ptr(), libc::O_RDONLY);
            libc::close(fd);
        }
    };
    let m = n / 4;
    let none = (
        ns_per_call(n, getppid),
        ns_per_call(n, &mut ioctl),
        ns_per_call(m, openat),
    );
    // Any filter at all sends every syscall through the kernel's slower entry path: measure
    // that with a one-instruction "allow everything" filter, then stack corral's on top.
    let allow_all = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: 0x7fff_0000, // SECCOMP_RET_ALLOW
    }];
    corral_sandbox::seccomp::install_program(&allow_all).expect("installing allow-all");
    let trivial = (
        ns_per_call(n, getppid),
        ns_per_call(n, &mut ioctl),
        ns_per_call(m, openat),
    );
    corral_sandbox::seccomp::install().expect("installing corral's filter");
    let corral = (
        ns_per_call(n, getppid),
        ns_per_call(n, &mut ioctl),
        ns_per_call(m, openat),
    );
    println!("iterations per round: {n} (best of 5 rounds)");
    println!(
        "{:<16} {:>10} {:>14} {:>20}",
        "syscall", "no filter", "allow-all", "allow-all + corral"
    );
    for (name, a, b, c) in [
        ("getppid", none.0, trivial.0, corral.0),
        ("ioctl(FIONREAD)", none.1, trivial.1, corral.1),
        ("openat+close", none.2, trivial.2, corral.2),
    ] {
        println!("{name:<16} {a:>7.1} ns {b:>11.1} ns {c:>17.1} ns");
    }
}

//! What an idle CONNECT tunnel keeps on the heap: a counting global allocator around the
//! system allocator, a proxy on a 2-thread runtime (as `corral proxy` and `corral run` start
//! it), N tunnels to a loopback origin held open, and the live heap before and after.
//!
//!     cargo run --release -p corral-net --example idle_tunnels -- [N]
//!
//! Prints the live bytes and blocks per tunnel and the live blocks by size class.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use corral_audit::AuditLog;
use corral_net::{Listener, Proxy, Rules};
use corral_policy::domain::DomainPattern;

struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);
/// Live blocks by size class: [0] <= 16 bytes, [k] <= 16 << k bytes.
static CLASSES: [AtomicIsize; 16] = [const { AtomicIsize::new(0) }; 16];

fn class(size: usize) -> usize {
    let mut k = 0;
    while k < 15 && size > (16 << k) {
        k += 1;
    }
    k
}

fn count(size: usize, sign: isize) {
    BYTES.fetch_add(sign * size as isize, Ordering::Relaxed);
    BLOCKS.fetch_add(sign, Ordering::Relaxed);
    CLASSES[class(size)].fetch_add(sign, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator with the same layout; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout.size(), -1);
        // SAFETY: `ptr` was allocated by `System` with this layout (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count(layout.size(), -1);
        count(new, 1);
        // SAFETY: as for `dealloc`; the new size is the caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn snapshot() -> (isize, isize, Vec<isize>) {
    (
        BYTES.load(Ordering::Relaxed),
        BLOCKS.load(Ordering::Relaxed),
        CLASSES.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
    )
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N: a number of tunnels"))
        .unwrap_or(1000);
    let dir = std::env::temp_dir().join(format!("corral-idle-tunnels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    // The origin: accepts and holds its sockets.
    let origin = TcpListener::bind("127.0.0.1:0").expect("origin listener");
    let oport = origin.local_addr().expect("origin address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in origin.incoming().flatten() {
            held.push(s);
        }
    });

    let rules = Rules {
        allow: vec![DomainPattern::parse(&format!("127.0.0.1:{oport}")).expect("pattern")],
        allow_cidrs: vec!["127.0.0.1/32".parse().expect("cidr")],
        ..Rules::default()
    };
    let proxy = Arc::new(Proxy::new(
        rules,
        AuditLog::at(dir.join("audit.jsonl")),
        "bench",
    ));
    let l = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
    let pport = l.local_addr().expect("proxy address").port();
    let handle = corral_net::spawn(proxy, vec![Listener::Proxy(l)]).expect("proxy");

    let open = |k: usize| -> Vec<TcpStream> {
        (0..k)
            .map(|i| {
                let mut s = TcpStream::connect(("127.0.0.1", pport)).expect("connect");
                write!(
                    s,
                    "CONNECT 127.0.0.1:{oport} HTTP/1.1\r\nHost: 127.0.0.1:{oport}\r\n\r\n"
                )
                .expect("send CONNECT");
                let mut buf = Vec::new();
                let mut b = [0u8; 256];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let r = s.read(&mut b).expect("read");
                    assert!(r > 0, "tunnel {i}: closed");
                    buf.extend_from_slice(&b[..r]);
                }
                assert!(buf.starts_with(b"HTTP/1.1 200"), "tunnel {i}: {buf:?}");
                s
            })
            .collect()
    };
    // Warm up: one round of tunnels opened and closed (runtime, timer wheel, audit file).
    drop(open(50));
    std::thread::sleep(std::time::Duration::from_millis(300));

    let (b0, k0, c0) = snapshot();
    let r0 = rss_kib();
    let held = open(n);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (b1, k1, c1) = snapshot();
    let r1 = rss_kib();
    println!(
        "{n} idle tunnels: live heap +{} KiB in +{} blocks ({} bytes, {:.1} blocks per tunnel); RSS {r0} -> {r1} KiB (+{:.2} KiB per tunnel, client and origin sockets included)",
        (b1 - b0) / 1024,
        k1 - k0,
        (b1 - b0) / n as isize,
        (k1 - k0) as f64 / n as f64,
        (r1 as f64 - r0 as f64) / n as f64,
    );
    for (k, (a, b)) in c0.iter().zip(&c1).enumerate() {
        if a != b {
            println!("  blocks <= {:>6} bytes: {:+}", 16usize << k, b - a);
        }
    }
    drop(held);
    drop(handle);
    let _ = std::fs::remove_dir_all(&dir);
}

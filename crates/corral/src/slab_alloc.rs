//! `corral-proxy`'s memory allocator: the C library's for everything except small blocks
//! aligned to more than 16 bytes, which come from size-class free lists instead.
//!
//! Why: every idle tunnel holds two tokio tasks and two sockets' readiness records, all four
//! aligned to 128 bytes (a cache line pair, so that neighbours do not share one). glibc serves
//! each with `memalign`, which cuts the leading and trailing remainders around the aligned block
//! off as free chunks. Only later allocations of exactly the right small size reuse them, so at
//! 1,000 tunnels about half a mebibyte of the heap is such gaps (docs/BENCHMARKS.md, "Proxy").
//! Here those blocks are carved side by side, without a header or gap, from 16 KiB chunks.
//!
//! A freed block goes back to its class's list and is reused by the next block of that class;
//! chunks are never given back to the C library. So the proxy keeps the memory of its busiest
//! moment for these blocks, as glibc's fragmented heap mostly does too.
//!
//! As glibc's tcache does for its lists, a free block's link is stored mangled with its own
//! address (a write through a stale pointer turns it into an address that fails the alignment
//! check, not into a block handed out twice), and a block freed twice is caught; either aborts
//! the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;
use std::sync::{Mutex, PoisonError};

/// The size step of the classes and the largest alignment served here (tokio's cache-padding
/// on x86_64 and aarch64).
const GRAIN: usize = 128;
/// Classes of `GRAIN`, 2 x `GRAIN`, ... bytes: larger blocks go to the C library.
const CLASSES: usize = 8;
/// Bytes taken from the C library at a time for one class.
const CHUNK: usize = 16 << 10;

/// The allocator: `#[global_allocator] static A: slab_alloc::Slab = slab_alloc::Slab;`.
pub struct Slab;

/// A free block: the next free block of its class, mangled ([`mangle`]), in its first word;
/// [`key`] in its second while it is on a list.
struct Free {
    link: usize,
    key: usize,
}

/// `next` as stored in the free block at `at`: glibc's safe-linking (`PROTECT_PTR`).
fn mangle(at: *mut Free, next: *mut Free) -> usize {
    ((at as usize) >> 12) ^ (next as usize)
}

/// The mark of a block on a free list: the address of the lists themselves, which moves with
/// the executable's load address, so a stale tenant's bytes rarely hold it by chance.
fn key() -> usize {
    (&raw const CLASSES_STATE as usize) ^ 0x5a5a_5a5a_5a5a_5a5a
}

/// End the process: the heap is corrupt (a block freed twice, a list overwritten).
fn corrupt(what: &str) -> ! {
    // No allocation here: this is the allocator.
    // SAFETY: writing a valid buffer to stderr.
    unsafe {
        libc::write(2, b"corral-proxy: ".as_ptr().cast(), 14);
        libc::write(2, what.as_ptr().cast(), what.len());
        libc::write(2, b"\n".as_ptr().cast(), 1);
    }
    std::process::abort()
}

/// One class: its free blocks, and the part of its newest chunk not handed out yet (carved
/// only as needed, so a chunk's pages are touched only when used).
#[derive(Clone, Copy)]
struct Class {
    free: *mut Free,
    next: *mut u8,
    end: *mut u8,
}

struct Classes([Class; CLASSES]);

// SAFETY: the pointers are only followed under the mutex.
unsafe impl Send for Classes {}

static CLASSES_STATE: Mutex<Classes> = Mutex::new(Classes(
    [Class {
        free: null_mut(),
        next: null_mut(),
        end: null_mut(),
    }; CLASSES],
));

/// The class of a layout served here: alignment above what `malloc` gives (16 bytes) and at most
/// [`GRAIN`], size at most `CLASSES * GRAIN`.
fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() <= 16 || layout.align() > GRAIN || layout.size() > GRAIN * CLASSES {
        return None;
    }
    Some(layout.size().max(1).div_ceil(GRAIN) - 1)
}

impl Slab {
    /// A block of class `c`: from the free list, else carved from the current chunk, else
    /// from a new chunk. Null when the C library has no memory.
    unsafe fn take(c: usize) -> *mut u8 {
        let size = (c + 1) * GRAIN;
        let mut classes = CLASSES_STATE.lock().unwrap_or_else(PoisonError::into_inner);
        let class = &mut classes.0[c];
        if !class.free.is_null() {
            let block = class.free;
            // SAFETY: a block on the list is a free block of this class written by `give`.
            let next = unsafe { (*block).link } ^ ((block as usize) >> 12);
            if !next.is_multiple_of(GRAIN) {
                corrupt("a free list was overwritten (a write after free)");
            }
            class.free = next as *mut Free;
            // SAFETY: as above.
            unsafe { (*block).key = 0 };
            return block.cast();
        }
        if class.next.is_null() || (class.end as usize) - (class.next as usize) < size {
            // SAFETY: CHUNK and GRAIN make a valid, non-zero layout.
            let chunk = unsafe { System.alloc(Layout::from_size_align_unchecked(CHUNK, GRAIN)) };
            if chunk.is_null() {
                return null_mut();
            }
            class.next = chunk;
            // SAFETY: one past the chunk's end.
            class.end = unsafe { chunk.add(CHUNK) };
        }
        let block = class.next;
        // SAFETY: `size` bytes fit before `end` (checked above).
        class.next = unsafe { block.add(size) };
        block
    }

    /// Return a block of class `c` to its list.
    unsafe fn give(c: usize, ptr: *mut u8) {
        let mut classes = CLASSES_STATE.lock().unwrap_or_else(PoisonError::into_inner);
        let class = &mut classes.0[c];
        let block = ptr.cast::<Free>();
        // SAFETY: the block is ours (of this class, at least GRAIN bytes, GRAIN-aligned).
        if unsafe { (*block).key } == key() {
            // Marked free: on this list already, unless its tenant wrote the mark (look).
            let mut at = class.free;
            while !at.is_null() {
                if at == block {
                    corrupt("a block was freed twice");
                }
                // SAFETY: the list's blocks are free blocks of this class.
                let next = unsafe { (*at).link } ^ ((at as usize) >> 12);
                if !next.is_multiple_of(GRAIN) {
                    corrupt("a free list was overwritten (a write after free)");
                }
                at = next as *mut Free;
            }
        }
        // SAFETY: the block is no longer used by its owner.
        unsafe {
            block.write(Free {
                link: mangle(block, class.free),
                key: key(),
            })
        };
        class.free = block;
    }
}

// SAFETY: blocks of a class are `(c + 1) * GRAIN` bytes at a multiple of GRAIN from a
// GRAIN-aligned chunk, so they satisfy every layout `class_of` maps to `c`; the rest is the
// C library's allocator, as `System`.
unsafe impl GlobalAlloc for Slab {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(c) => unsafe { Slab::take(c) },
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(c) => {
                let p = unsafe { Slab::take(c) };
                if !p.is_null() {
                    unsafe { p.write_bytes(0, layout.size()) };
                }
                p
            }
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class_of(layout) {
            Some(c) => unsafe { Slab::give(c, ptr) },
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with this alignment is a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new)) {
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            (Some(a), Some(b)) if a == b => ptr,
            _ => {
                let p = unsafe { self.alloc(new) };
                if !p.is_null() {
                    unsafe {
                        p.copy_from_nonoverlapping(ptr, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                p
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn only_small_over_aligned_blocks_have_a_class() {
        assert_eq!(class_of(layout(64, 8)), None);
        assert_eq!(class_of(layout(64, 16)), None);
        assert_eq!(class_of(layout(0, 32)), Some(0));
        assert_eq!(class_of(layout(128, 128)), Some(0));
        assert_eq!(class_of(layout(129, 128)), Some(1));
        assert_eq!(class_of(layout(1024, 64)), Some(7));
        assert_eq!(class_of(layout(1025, 128)), None);
        assert_eq!(class_of(layout(64, 256)), None);
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_reused() {
        let a = Slab;
        let l = layout(300, 128);
        let blocks: Vec<*mut u8> = (0..200).map(|_| unsafe { a.alloc(l) }).collect();
        for (i, &p) in blocks.iter().enumerate() {
            assert!(!p.is_null());
            assert_eq!(p as usize % 128, 0);
            unsafe { p.write_bytes(i as u8, l.size()) };
        }
        for (i, &p) in blocks.iter().enumerate() {
            let s = unsafe { std::slice::from_raw_parts(p, l.size()) };
            assert!(s.iter().all(|&b| b == i as u8), "block {i} was overwritten");
        }
        let freed = blocks[7];
        unsafe { a.dealloc(freed, l) };
        // Other tests share the lists: the freed block is reused by this class's next block,
        // unless another thread took it first.
        let again = unsafe { a.alloc(l) };
        assert_eq!(again as usize % 128, 0);
        for &p in blocks.iter().filter(|&&p| p != freed) {
            assert_ne!(p, again);
            unsafe { a.dealloc(p, l) };
        }
        unsafe { a.dealloc(again, l) };
    }

    #[test]
    fn zeroed_and_resized_blocks_keep_their_bytes() {
        let a = Slab;
        unsafe {
            let p = a.alloc(layout(200, 64));
            p.write_bytes(0xAB, 200);
            a.dealloc(p, layout(200, 64));
            let z = a.alloc_zeroed(layout(200, 64));
            assert!(std::slice::from_raw_parts(z, 200).iter().all(|&b| b == 0));
            z.write_bytes(7, 200);
            // Same class: same block; another class; then out of the classes.
            let same = a.realloc(z, layout(200, 64), 250);
            assert_eq!(same, z);
            let mut p = same;
            for (from, to) in [(250, 900), (900, 8192)] {
                p = a.realloc(p, layout(from, 64), to);
                assert_eq!(p as usize % 64, 0);
                let kept = std::slice::from_raw_parts(p, 200);
                assert!(kept.iter().all(|&b| b == 7), "{from} -> {to} bytes");
            }
            a.dealloc(p, layout(8192, 64));
        }
    }

    /// A block freed twice, or a free list overwritten through a stale pointer, aborts the
    /// process (run in a child: this test's own process, told by an environment variable).
    #[test]
    fn a_double_free_or_a_write_after_free_aborts() {
        use std::os::unix::process::ExitStatusExt;
        const CASE: &str = "CORRAL_SLAB_TEST_CASE";
        match std::env::var(CASE).as_deref() {
            Ok("double") => unsafe {
                let l = layout(512, 128);
                let p = Slab.alloc(l);
                Slab.dealloc(p, l);
                Slab.dealloc(p, l);
                return;
            },
            Ok("overwrite") => unsafe {
                let l = layout(640, 128);
                let p = Slab.alloc(l);
                Slab.dealloc(p, l);
                // What a stale pointer's owner might write: a small number (here decoding to
                // 0x41, whatever the block's address).
                p.cast::<usize>().write(((p as usize) >> 12) ^ 0x41);
                let _ = Slab.alloc(l);
                let _ = Slab.alloc(l);
                return;
            },
            _ => {}
        }
        for (case, says) in [("double", "freed twice"), ("overwrite", "write after free")] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "slab_alloc::tests::a_double_free_or_a_write_after_free_aborts",
                    "--test-threads=1",
                ])
                .env(CASE, case)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{case}: {stderr}");
            assert!(stderr.contains(says), "{case}: {stderr}");
        }
    }

    #[test]
    fn threads_share_the_lists_without_losing_a_block() {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let a = Slab;
                    let l = layout(256, 128);
                    for round in 0..200 {
                        let ps: Vec<*mut u8> = (0..50).map(|_| unsafe { a.alloc(l) }).collect();
                        for &p in &ps {
                            unsafe { p.write_bytes((t * 31 + round) as u8, 256) };
                        }
                        for &p in &ps {
                            let s = unsafe { std::slice::from_raw_parts(p, 256) };
                            assert!(s.iter().all(|&b| b == (t * 31 + round) as u8));
                            unsafe { a.dealloc(p, l) };
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}

//! The global allocator: mimalloc, asked for an aligned block only when a plain one could be
//! less aligned than the layout needs.
//!
//! The `mimalloc` crate's `MiMalloc` sends every allocation through `mi_malloc_aligned`, whose
//! checks cost instructions on every one of the ~100 allocations of a proxied request, and
//! which takes mimalloc's slow, over-allocating path for a block whose size is not a power of
//! two (a 48-byte request gets a 64-byte block). Nearly every Rust allocation asks for 8 or 16
//! bytes of alignment, which a plain `mi_malloc` block always has: the plain calls serve
//! those (callgrind, one keep-alive connection: about 3.6 % fewer instructions per request on
//! every route, docs/benchmarks.md). The rule is the standard library's for `malloc` on Unix.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as ffi;

/// The alignment of every plain mimalloc block of at least this size (`MI_MAX_ALIGN_SIZE`): its
/// size classes are whole multiples of 16 bytes from 16 up, and a page's first block starts
/// 16-aligned. A smaller block is 8 bytes, aligned to 8, which `align <= size` covers.
const PLAIN_ALIGN: usize = 16;

/// mimalloc as the global allocator (see the module documentation).
pub struct Allocator;

/// Whether a block of `size` bytes from the plain calls is aligned enough for `align`.
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` and `mi_realloc` take
// any of its blocks, aligned or not), and a plain call serves only a layout whose alignment
// every plain block of that size has (see `PLAIN_ALIGN`).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = if plain(layout.size(), layout.align()) {
            unsafe { ffi::mi_malloc(layout.size()) }
        } else {
            unsafe { ffi::mi_malloc_aligned(layout.size(), layout.align()) }
        };
        ptr.cast()
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = if plain(layout.size(), layout.align()) {
            unsafe { ffi::mi_zalloc(layout.size()) }
        } else {
            unsafe { ffi::mi_zalloc_aligned(layout.size(), layout.align()) }
        };
        ptr.cast()
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { ffi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let ptr = ptr.cast::<c_void>();
        let moved = if plain(new_size, layout.align()) {
            unsafe { ffi::mi_realloc(ptr, new_size) }
        } else {
            unsafe { ffi::mi_realloc_aligned(ptr, new_size, layout.align()) }
        };
        moved.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size from 1 to 4 KiB and a few large ones, at every alignment from 1 to 4 KiB:
    /// each block is aligned, writable to its end, and zeroed when asked.
    #[test]
    fn every_block_is_aligned_as_its_layout_asks() {
        let sizes = (1..=4096).chain([65_536, 1 << 20, 3 << 20]);
        // Compared with `==` (libc's memcmp): a byte-by-byte loop at the test build's
        // opt-level 0 made this test 17 s of the unit tests' 31.
        let zeros = vec![0u8; 3 << 20];
        for size in sizes {
            for align in (0..=12).map(|b| 1usize << b) {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = Allocator.alloc(layout);
                    assert!(
                        !p.is_null() && (p as usize).is_multiple_of(align),
                        "{layout:?}: {p:?}"
                    );
                    p.add(size - 1).write(0xA5);
                    Allocator.dealloc(p, layout);
                    let z = Allocator.alloc_zeroed(layout);
                    assert!(
                        (z as usize).is_multiple_of(align),
                        "zeroed {layout:?}: {z:?}"
                    );
                    assert!(
                        std::slice::from_raw_parts(z, size) == &zeros[..size],
                        "zeroed {layout:?}"
                    );
                    Allocator.dealloc(z, layout);
                }
            }
        }
    }

    /// Growing and shrinking keeps the contents and the alignment, across the plain and the
    /// aligned calls both ways.
    #[test]
    fn realloc_keeps_contents_and_alignment() {
        for align in [1, 8, 16, 32, 128, 4096] {
            let mut layout = Layout::from_size_align(3, align).unwrap();
            unsafe {
                let mut p = Allocator.alloc(layout);
                p.copy_from([1u8, 2, 3].as_ptr(), 3);
                for new_size in [5, 17, 48, 1000, 70_000, 24, 3] {
                    p = Allocator.realloc(p, layout, new_size);
                    assert!(
                        !p.is_null() && (p as usize).is_multiple_of(align),
                        "{align} {new_size}"
                    );
                    assert_eq!(
                        std::slice::from_raw_parts(p, 3),
                        [1, 2, 3],
                        "{align} {new_size}"
                    );
                    layout = Layout::from_size_align(new_size, align).unwrap();
                }
                Allocator.dealloc(p, layout);
            }
        }
    }
}

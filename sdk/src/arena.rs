//! The `arena` feature's allocator: a bump allocator for a plugin built
//! without std.
//!
//! Every call of a plugin runs in a fresh instance whose memory is thrown
//! away when the call ends, so nothing a call allocates needs to be reused
//! by a later call. The arena hands out the memory after the plugin's data
//! (`__heap_base`) in order, growing the memory by the pages a block
//! lacks when it runs out; freeing the most recent block gives it back, any other free
//! is a no-op. An allocation is a few instructions instead of `dlmalloc`'s
//! bins and boundary tags, which were a tenth of the http plugin's wasm
//! time (docs/performance-notes.md).
//!
//! The price is memory: a plugin that frees and allocates in a loop keeps
//! every block until the call ends, and meets the host's memory cap (a
//! `memory` error) where `malloc` would have reused its blocks. The
//! built-ins allocate in proportion to what they read, which their config
//! bounds; a plugin that churns should keep the default allocator.

/// The arena's bookkeeping, on addresses only: where the next block
/// starts and where the memory ends. Growing the memory is the caller's
/// (`grow` takes the bytes missing and returns the new end, or `None`).
#[derive(Debug)]
pub(crate) struct Bump {
    next: usize,
    end: usize,
}

impl Bump {
    /// An arena of `[start, end)`.
    #[cfg_attr(
        not(all(target_arch = "wasm32", feature = "arena")),
        allow(
            dead_code,
            reason = "used by the wasm allocator; the host builds it for its unit tests"
        )
    )]
    pub(crate) const fn new(start: usize, end: usize) -> Self {
        Self { next: start, end }
    }

    /// Whether the arena has been placed yet (`new` at `0, 0` is not).
    #[cfg_attr(
        not(all(target_arch = "wasm32", feature = "arena")),
        allow(
            dead_code,
            reason = "used by the wasm allocator; the host builds it for its unit tests"
        )
    )]
    pub(crate) fn is_placed(&self) -> bool {
        self.end != 0
    }

    /// Makes room up to `upto`, growing the memory if needed.
    fn reach(&mut self, upto: usize, grow: impl FnOnce(usize) -> Option<usize>) -> Option<()> {
        if upto > self.end {
            let end = grow(upto - self.end)?;
            if end < upto {
                return None;
            }
            self.end = end;
        }
        Some(())
    }

    /// A block of `size` bytes aligned to `align` (a power of two).
    pub(crate) fn take(
        &mut self,
        align: usize,
        size: usize,
        grow: impl FnOnce(usize) -> Option<usize>,
    ) -> Option<usize> {
        let start = self.next.checked_add(align - 1)? & !(align - 1);
        let upto = start.checked_add(size)?;
        self.reach(upto, grow)?;
        self.next = upto;
        Some(start)
    }

    /// Frees the block at `addr` of `size` bytes: given back if it is the
    /// most recent one, kept until the call ends otherwise.
    pub(crate) fn give_back(&mut self, addr: usize, size: usize) {
        if addr.checked_add(size) == Some(self.next) {
            self.next = addr;
        }
    }

    /// Resizes the block at `addr` from `old` to `new` bytes where it
    /// stands: it is the most recent block (then it grows or shrinks in
    /// place, growing the memory if needed) or it shrinks. `None` when it
    /// must move.
    pub(crate) fn resize(
        &mut self,
        addr: usize,
        old: usize,
        new: usize,
        grow: impl FnOnce(usize) -> Option<usize>,
    ) -> Option<()> {
        if addr.checked_add(old) == Some(self.next) {
            let upto = addr.checked_add(new)?;
            self.reach(upto, grow)?;
            self.next = upto;
            Some(())
        } else if new <= old {
            Some(())
        } else {
            None
        }
    }
}

#[cfg(all(target_arch = "wasm32", feature = "arena"))]
pub(crate) use wasm::Arena;

// The allocator itself: `GlobalAlloc` is `unsafe` by nature; each block
// below says why its use holds.
#[cfg(all(target_arch = "wasm32", feature = "arena"))]
#[allow(unsafe_code, reason = "the bump allocator over wasm memory")]
mod wasm {
    use super::Bump;
    use core::alloc::{GlobalAlloc, Layout};
    use core::arch::wasm32::{memory_grow, memory_size};
    use core::cell::UnsafeCell;

    const PAGE: usize = 65536;

    // SAFETY: wasm-ld defines this symbol; only its address is taken.
    unsafe extern "C" {
        /// The first byte after the plugin's data and stack (wasm-ld).
        static __heap_base: u8;
    }

    /// The end of the memory, after growing it by at least `missing` bytes.
    fn grow(missing: usize) -> Option<usize> {
        let pages = missing.div_ceil(PAGE);
        if memory_grow::<0>(pages) == usize::MAX {
            return None;
        }
        memory_end()
    }

    /// The end of the memory; `None` past wasm32's addresses (4 GiB).
    fn memory_end() -> Option<usize> {
        memory_size::<0>().checked_mul(PAGE)
    }

    /// The global allocator of a plugin built with the `arena` feature.
    pub(crate) struct Arena(UnsafeCell<Bump>);

    // SAFETY: a wasm32 guest of the component model runs one thread.
    unsafe impl Sync for Arena {}

    impl Arena {
        /// An arena placed at its first allocation.
        pub(crate) const fn new() -> Self {
            Self(UnsafeCell::new(Bump::new(0, 0)))
        }

        #[allow(
            clippy::mut_from_ref,
            reason = "the one thread's allocator state, behind an UnsafeCell"
        )]
        fn bump(&self) -> &mut Bump {
            // SAFETY: one thread, and no method of `Bump` calls back into
            // the allocator, so no two of these references overlap.
            let bump = unsafe { &mut *self.0.get() };
            if !bump.is_placed() {
                let start = &raw const __heap_base as usize;
                // A memory of exactly 4 GiB has no end in wasm32's
                // addresses; the arena then ends one byte short of it.
                *bump = Bump::new(start, memory_end().unwrap_or(usize::MAX));
            }
            bump
        }
    }

    // SAFETY: `take` returns blocks of the layout's size and alignment that
    // no other live block overlaps (the arena only moves forward, and
    // gives back a block only when it is the last one); `resize` keeps a
    // block in place only when its new size is free there.
    unsafe impl GlobalAlloc for Arena {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            match self.bump().take(layout.align(), layout.size(), grow) {
                Some(addr) => addr as *mut u8,
                None => core::ptr::null_mut(),
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            self.bump().give_back(ptr as usize, layout.size());
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let bump = self.bump();
            if bump.resize(ptr as usize, layout.size(), new_size, grow).is_some() {
                return ptr;
            }
            match bump.take(layout.align(), new_size, grow) {
                Some(addr) => {
                    let new = addr as *mut u8;
                    // SAFETY: both blocks are live and distinct (`new` was
                    // just taken past every live block); the old one holds
                    // `layout.size()` bytes, fewer than `new_size`.
                    unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
                    new
                }
                None => core::ptr::null_mut(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Bump;
    use alloc::vec::Vec;

    /// Grows a memory that ends at `end` by whole 64 KiB pages, up to `cap`.
    fn pages(end: &mut usize, cap: usize) -> impl FnMut(usize) -> Option<usize> + '_ {
        move |missing| {
            let grown = *end + missing.div_ceil(65536) * 65536;
            (grown <= cap).then(|| {
                *end = grown;
                grown
            })
        }
    }

    #[test]
    fn blocks_are_aligned_and_do_not_overlap() {
        let mut end = 65536;
        let mut bump = Bump::new(1001, end);
        let mut blocks = Vec::new();
        for (align, size) in [(1, 3), (8, 24), (16, 5), (4096, 4096), (2, 1), (64, 100)] {
            let addr = bump.take(align, size, pages(&mut end, 1 << 20)).unwrap();
            assert_eq!(addr % align, 0, "align {align}");
            assert!(addr >= 1001);
            blocks.push((addr, size));
        }
        blocks.sort();
        for pair in blocks.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:?} overlap");
        }
    }

    #[test]
    fn the_memory_grows_by_pages_and_stops_at_its_cap() {
        let mut end = 65536;
        let mut bump = Bump::new(60000, end);
        // Fits in the initial memory.
        assert_eq!(bump.take(8, 5000, |_| panic!("no growth needed")), Some(60000));
        // Needs one more page.
        assert_eq!(bump.take(8, 1000, pages(&mut end, 1 << 20)), Some(65000));
        assert_eq!(end, 2 * 65536);
        // Needs several.
        let addr = bump.take(1, 200_000, pages(&mut end, 1 << 20)).unwrap();
        assert!(addr + 200_000 <= end);
        // Past the cap: refused, and the arena is unchanged.
        let before = bump.take(1, 0, |_| None).unwrap();
        assert_eq!(bump.take(1, 1 << 20, pages(&mut end, 1 << 20)), None);
        assert_eq!(bump.take(1, 0, |_| None), Some(before));
        // A growth that reports too little room is a failure too.
        assert_eq!(bump.take(1, 100_000, |_| Some(0)), None);
        // Sizes that overflow the address space are refused, not wrapped.
        assert_eq!(bump.take(1, usize::MAX, |_| panic!("not reached")), None);
        assert_eq!(bump.take(usize::MAX / 2 + 1, 1, |_| None), None);
    }

    #[test]
    fn only_the_last_block_is_given_back() {
        let mut bump = Bump::new(0, 1 << 20);
        let a = bump.take(8, 100, |_| None).unwrap();
        let b = bump.take(8, 100, |_| None).unwrap();
        // Freeing `a` (not the last) keeps it: the next block is past `b`.
        bump.give_back(a, 100);
        let c = bump.take(8, 8, |_| None).unwrap();
        assert!(c >= b + 100);
        // Freeing the last block lets the next allocation take its place.
        bump.give_back(c, 8);
        assert_eq!(bump.take(8, 8, |_| None), Some(c));
    }

    #[test]
    fn the_last_block_resizes_in_place_others_only_shrink() {
        let mut end = 65536;
        let mut bump = Bump::new(0, end);
        let a = bump.take(8, 100, |_| None).unwrap();
        let b = bump.take(8, 100, |_| None).unwrap();
        // `b` is last: it grows in place, past the initial memory too.
        assert_eq!(bump.resize(b, 100, 70_000, pages(&mut end, 1 << 20)), Some(()));
        assert_eq!(end, 2 * 65536);
        assert_eq!(bump.take(1, 1, |_| None), Some(b + 70_000));
        // `a` is not last: it may shrink where it is, not grow.
        assert_eq!(bump.resize(a, 100, 50, |_| None), Some(()));
        assert_eq!(bump.resize(a, 100, 101, |_| None), None);
        // Growing the last block past the cap fails and changes nothing.
        let last = bump.take(1, 10, |_| None).unwrap();
        assert_eq!(bump.resize(last, 10, 1 << 21, pages(&mut end, 1 << 20)), None);
        assert_eq!(bump.take(1, 0, |_| None), Some(last + 10));
    }
}

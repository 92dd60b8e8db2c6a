//! What `std` would otherwise give a plugin built without it, in the
//! sandbox: the allocator, the panic handler (its message goes to the
//! host's log) and the canonical ABI's `cabi_realloc`. Files without std
//! are [`crate::fs`]'s own.

// wasi-libc's static library, which std's guests link too: `memcmp` and
// `bcmp` (which `core` calls and wasm has no instruction for), and, unless
// the `arena` feature is on, its `malloc`, which takes the initial memory's
// free tail before growing the memory (the `dlmalloc` crate grows it at the
// first allocation, and every growth costs the host an `mprotect` on the
// way up and another at the reset). The linker takes only those objects;
// they import nothing.
// SAFETY: an empty block: it declares nothing, it only links the library.
#[allow(unsafe_code, reason = "linking wasi-libc without std")]
#[link(name = "c")]
unsafe extern "C" {}

/// The global allocator: the `arena` feature's bump allocator, else
/// wasi-libc's `malloc`.
#[cfg(feature = "arena")]
type Allocator = crate::arena::Arena;
#[cfg(not(feature = "arena"))]
type Allocator = libc_malloc::LibcMalloc;

#[global_allocator]
static ALLOCATOR: Allocator = Allocator::new();

// An allocator is `unsafe` by nature (`GlobalAlloc` and the libc functions
// behind it); each block below says why its use holds.
#[cfg(not(feature = "arena"))]
#[allow(unsafe_code, reason = "the global allocator over wasi-libc's malloc")]
mod libc_malloc {
    use core::alloc::{GlobalAlloc, Layout};

    // SAFETY: wasi-libc's declarations of these four functions.
    unsafe extern "C" {
        fn malloc(size: usize) -> *mut u8;
        fn aligned_alloc(align: usize, size: usize) -> *mut u8;
        fn realloc(ptr: *mut u8, size: usize) -> *mut u8;
        fn free(ptr: *mut u8);
    }

    /// The alignment `malloc` is relied on for, as std relies on it for
    /// wasm32; anything stricter goes to `aligned_alloc`.
    const MALLOC_ALIGN: usize = 8;

    /// wasi-libc's `malloc`, as std's `System` uses it.
    pub(super) struct LibcMalloc;

    impl LibcMalloc {
        pub(super) const fn new() -> Self {
            Self
        }
    }

    // SAFETY: each method passes the layout's size and alignment to the libc
    // function that honours them, as `GlobalAlloc` requires.
    unsafe impl GlobalAlloc for LibcMalloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: plain libc calls; `aligned_alloc` wants a power-of-two
            // alignment, which `Layout` guarantees.
            unsafe {
                if layout.align() <= MALLOC_ALIGN && layout.align() <= layout.size() {
                    malloc(layout.size())
                } else {
                    aligned_alloc(layout.align(), layout.size())
                }
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            // SAFETY: `ptr` came from `alloc` or `realloc` above.
            unsafe { free(ptr) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` came from this allocator with `layout`; `realloc`
            // keeps `malloc`'s alignment, and a stricter one is copied by hand.
            unsafe {
                if layout.align() <= MALLOC_ALIGN && layout.align() <= new_size {
                    realloc(ptr, new_size)
                } else {
                    let new = aligned_alloc(layout.align(), new_size);
                    if !new.is_null() {
                        core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        free(ptr);
                    }
                    new
                }
            }
        }
    }
}

/// A panic ends the call with a trap, which the host records as the
/// plugin's error. Without std there is no stderr to print the message
/// to, so with the `panic-message` feature it goes to the host's log,
/// where the host finds it and adds it to the trap's report, as it does
/// with std's message on stderr.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    #[cfg(feature = "panic-message")]
    log_panic(_info);
    core::arch::wasm32::unreachable()
}

/// Logs `info` as `panicked at FILE:LINE:COL: MESSAGE`, once: a panic
/// while reporting one (an allocation failing) only traps.
#[cfg(feature = "panic-message")]
fn log_panic(info: &core::panic::PanicInfo<'_>) {
    use crate::bindings::sonde::probe::log::{Level, log};
    use alloc::string::String;
    use core::fmt::Write;
    use core::sync::atomic::{AtomicBool, Ordering};
    static PANICKING: AtomicBool = AtomicBool::new(false);
    if PANICKING.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut text = String::new();
    let _ = match info.location() {
        Some(at) => write!(
            text,
            "panicked at {}:{}:{}: {}",
            at.file(),
            at.line(),
            at.column(),
            info.message()
        ),
        None => write!(text, "panicked: {}", info.message()),
    };
    log(Level::Error, &text);
}

/// The canonical ABI's allocator export, through which the host passes a
/// call's arguments and results into the guest's memory. With std,
/// wasi-libc defines it; without, the SDK does, on the global allocator.
///
/// # Safety
///
/// Called by the host only, as the canonical ABI specifies: `old` is null
/// with `old_len` 0, or a block this function returned with that length
/// and `align`.
// SAFETY (of the export): the canonical ABI names this symbol, and nothing
// else in a plugin defines it without std.
#[allow(unsafe_code, reason = "the canonical ABI's cabi_realloc export")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the canonical ABI passes a power-of-two alignment and sizes
    // that fit the guest's memory; `old` comes from this allocator.
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}

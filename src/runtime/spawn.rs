//! Spawning a task on this shard's executor without the future crossing
//! the stack by value.
//!
//! glommio polls a new task at once, on the spawner's stack, after moving
//! the future by value through several calls: each copy sits in a frame
//! of its own until the first poll returns. A large future (a resync's is
//! hundreds of KiB in a debug build) is boxed first, so only a pointer
//! travels (a resync spawned at start overflowed a shard's 2 MiB stack).
//! The size is known at compile time: a small future costs nothing more.

use std::future::Future;
use std::pin::Pin;

/// The largest future moved by value; a larger one is boxed first (one
/// allocation beside the task's own).
pub const SPAWN_INLINE_BYTES_MAX: usize = 4096;

/// `glommio::spawn_local`, boxing a future over [`SPAWN_INLINE_BYTES_MAX`].
pub fn spawn_local<T: 'static, F: Future<Output = T> + 'static>(future: F) -> glommio::Task<T> {
    if std::mem::size_of::<F>() > SPAWN_INLINE_BYTES_MAX {
        let boxed: Pin<Box<dyn Future<Output = T>>> = Box::pin(future);
        return glommio::spawn_local(boxed);
    }
    glommio::spawn_local(future)
}

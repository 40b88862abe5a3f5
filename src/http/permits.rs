//! A first-come, first-served permit count for one shard (single-threaded).
//!
//! Why not glommio's `Semaphore`: a burst of callbacks leaves thousands of
//! tasks waiting for one of 64 connections to a target, and there every
//! release woke waiters in bulk; the wake-ups took a fifth of a shard's time
//! (`perf record` in the 100 k pop burst). Here a release hands its permit
//! to exactly one waiter, the longest waiting, in O(1).
//!
//! Cancel safety: a waiter dropped before it was granted is skipped; one
//! dropped after it was granted but before it ran passes the permit on.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One waiter's slot in the queue.
#[derive(Default)]
struct Slot {
    waker: RefCell<Option<Waker>>,
    granted: Cell<bool>,
    gone: Cell<bool>,
}

/// Waiter slots kept for reuse per permit count: a waiter takes one
/// instead of allocating (a burst of callbacks waits here once per pop).
const SPARE_SLOTS_MAX: usize = 256;

pub struct Permits {
    free: Cell<usize>,
    waiters: RefCell<VecDeque<Rc<Slot>>>,
    /// Slots no waiter holds, reset, at most `SPARE_SLOTS_MAX`.
    spare: RefCell<Vec<Rc<Slot>>>,
}

/// A held permit; dropping it releases it.
pub struct Permit<'a>(&'a Permits);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Permits {
    pub fn new(count: usize) -> Permits {
        assert!(count > 0, "at least one permit");
        Permits {
            free: Cell::new(count),
            waiters: RefCell::new(VecDeque::new()),
            spare: RefCell::new(Vec::new()),
        }
    }

    /// A fresh waiter slot: a spare one, or a new one.
    fn take_slot(&self) -> Rc<Slot> {
        let spare = self.spare.borrow_mut().pop();
        spare.unwrap_or_default()
    }

    /// Keep `slot` for reuse if nothing else holds it.
    fn recycle(&self, mut slot: Rc<Slot>) {
        if let Some(s) = Rc::get_mut(&mut slot) {
            *s = Slot::default();
            let mut spare = self.spare.borrow_mut();
            if spare.len() < SPARE_SLOTS_MAX {
                spare.push(slot);
            }
        }
    }

    /// Tasks waiting (including ones already dropped and not yet skipped).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.borrow().len()
    }

    /// A permit, waiting in line for one.
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire {
            permits: self,
            slot: None,
        }
    }

    /// Give a permit to the first live waiter, or back to the pool.
    fn release(&self) {
        loop {
            let next = self.waiters.borrow_mut().pop_front();
            let Some(slot) = next else {
                self.free.set(self.free.get() + 1);
                return;
            };
            if slot.gone.get() {
                // Its waiter has dropped it: nobody else holds it now.
                self.recycle(slot);
                continue;
            }
            assert!(!slot.granted.get(), "a slot is granted once");
            slot.granted.set(true);
            if let Some(w) = slot.waker.borrow_mut().take() {
                w.wake();
            }
            return;
        }
    }
}

/// The future of [`Permits::acquire`].
pub struct Acquire<'a> {
    permits: &'a Permits,
    slot: Option<Rc<Slot>>,
}

impl<'a> Future for Acquire<'a> {
    type Output = Permit<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a>> {
        let permits = self.permits;
        match &self.slot {
            None => {
                // Nobody ahead and a permit free: take it now.
                if permits.free.get() > 0 && permits.waiters.borrow().is_empty() {
                    permits.free.set(permits.free.get() - 1);
                    return Poll::Ready(Permit(permits));
                }
                let slot = permits.take_slot();
                *slot.waker.borrow_mut() = Some(cx.waker().clone());
                permits.waiters.borrow_mut().push_back(slot.clone());
                self.slot = Some(slot);
                Poll::Pending
            }
            Some(slot) if slot.granted.get() => {
                // Out of the queue (the release took it): reusable.
                if let Some(slot) = self.slot.take() {
                    permits.recycle(slot);
                }
                Poll::Ready(Permit(permits))
            }
            Some(slot) => {
                *slot.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            if slot.granted.get() {
                // Granted but never taken: pass it on.
                self.permits.release();
                self.permits.recycle(slot);
            } else {
                slot.gone.set(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Count(Cell<usize>);
    // Single-threaded test waker.
    unsafe impl Send for Count {}
    unsafe impl Sync for Count {}
    impl Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.set(self.0.get() + 1);
        }
    }

    fn poll<F: Future + Unpin>(f: &mut F, cx: &mut Context<'_>) -> Poll<F::Output> {
        Pin::new(f).poll(cx)
    }

    #[test]
    fn first_come_first_served_and_cancel_safe() {
        let woken = std::sync::Arc::new(Count(Cell::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let p = Permits::new(1);
        let mut a = p.acquire();
        let held = match poll(&mut a, &mut cx) {
            Poll::Ready(permit) => permit,
            Poll::Pending => panic!("a free permit is taken at once"),
        };
        let (mut b, mut c, mut d) = (p.acquire(), p.acquire(), p.acquire());
        assert!(poll(&mut b, &mut cx).is_pending());
        assert!(poll(&mut c, &mut cx).is_pending());
        assert!(poll(&mut d, &mut cx).is_pending());
        assert_eq!(p.waiting(), 3);
        drop(b); // gave up before its turn: skipped
        drop(held); // goes to c, the next live waiter, waking one task
        assert_eq!(woken.0.get(), 1);
        drop(c); // granted but never taken: passed on to d
        assert_eq!(woken.0.get(), 2);
        let permit = match poll(&mut d, &mut cx) {
            Poll::Ready(permit) => permit,
            Poll::Pending => panic!("d was granted"),
        };
        assert!(
            poll(&mut p.acquire(), &mut cx).is_pending(),
            "one permit only"
        );
        drop(permit); // the queue holds only the dropped one: skipped
        assert_eq!((p.free.get(), p.waiting()), (1, 0));
        // Every waiter's slot is back for reuse: b (dropped, skipped), c
        // (passed on), d (taken); the last waiter took one of them, and
        // gave it back when the release skipped it.
        assert_eq!(p.spare.borrow().len(), 3);
        let mut e = p.acquire();
        let held = poll(&mut e, &mut cx);
        assert!(poll(&mut p.acquire(), &mut cx).is_pending());
        assert_eq!(p.spare.borrow().len(), 2, "a waiter takes a spare slot");
        drop(held);
        assert_eq!(p.spare.borrow().len(), 3, "and it is back once skipped");
    }
}

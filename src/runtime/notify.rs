//! A single-waiter, single-threaded wake-up: the pop loop and the accept loop
//! each park on one of these. No allocation, no lock.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct Notify {
    pending: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    /// Wake the waiter (or make its next wait return at once).
    pub fn notify(&self) {
        self.pending.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Resolves after the next `notify` (or at once if one is pending).
    pub fn wait(&self) -> Wait<'_> {
        Wait { notify: self }
    }
}

pub struct Wait<'a> {
    notify: &'a Notify,
}

impl Future for Wait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.pending.replace(false) {
            return Poll::Ready(());
        }
        *self.notify.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

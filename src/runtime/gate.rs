//! A shard's shutdown gate, in the spirit of glommio's `sync::Gate`: every
//! long-lived task of a shard holds a [`Pass`]; shutdown closes the gate,
//! which wakes every task waiting on [`Gate::closing`], refuses new passes,
//! and then waits (bounded in time) until every pass has been dropped.
//!
//! Nothing polls a flag: a task that sleeps races its sleep against
//! [`Gate::closing`], so it sees the shutdown the moment it starts.
//! Single-threaded (`Rc`, `Cell`); one gate per shard.
//!
//! Bound: the waiters list holds at most one waker per task waiting on
//! `closing` (a task registers again only with a waker that would not wake
//! the same task), so it is bounded by the shard's task count.

use super::notify::Notify;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[derive(Default)]
pub struct Gate {
    closing: Cell<bool>,
    passes: Cell<usize>,
    waiters: RefCell<Vec<Waker>>,
    /// Woken when the last pass is dropped after closing began.
    drained: Notify,
}

/// Held by a task the gate waits for at shutdown.
pub struct Pass {
    gate: Rc<Gate>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let left = self.gate.passes.get();
        assert!(left > 0, "a pass outlived its count");
        self.gate.passes.set(left - 1);
        if left == 1 && self.gate.closing.get() {
            self.gate.drained.notify();
        }
    }
}

impl Gate {
    pub fn new() -> Rc<Gate> {
        Rc::new(Gate::default())
    }

    /// A pass, or `None` once the gate is closing (start nothing new).
    pub fn enter(self: &Rc<Self>) -> Option<Pass> {
        if self.closing.get() {
            return None;
        }
        self.passes.set(self.passes.get() + 1);
        Some(Pass { gate: self.clone() })
    }

    /// Spawn a task on this executor that holds a pass until it ends. Once
    /// the gate is closing the task is not started (returns `false`).
    pub fn spawn<F: Future<Output = ()> + 'static>(self: &Rc<Self>, task: F) -> bool {
        if std::mem::size_of::<F>() > super::spawn::SPAWN_INLINE_BYTES_MAX {
            // Boxed here, before the wrapper below holds it by value.
            let boxed: Pin<Box<dyn Future<Output = ()>>> = Box::pin(task);
            return self.spawn_small(boxed);
        }
        self.spawn_small(task)
    }

    fn spawn_small(self: &Rc<Self>, task: impl Future<Output = ()> + 'static) -> bool {
        let Some(pass) = self.enter() else {
            return false;
        };
        glommio::spawn_local(async move {
            task.await;
            drop(pass);
        })
        .detach();
        true
    }

    /// Whether shutdown has begun.
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Passes held right now.
    pub fn passes(&self) -> usize {
        self.passes.get()
    }

    /// Resolves once shutdown has begun (at once if it has).
    pub fn closing(&self) -> Closing<'_> {
        Closing { gate: self }
    }

    /// `fut`'s output, or `None` if shutdown begins first (at once if it
    /// has begun).
    pub async fn unless_closing<T>(&self, fut: impl Future<Output = T>) -> Option<T> {
        futures_lite::future::or(async { Some(fut.await) }, async {
            self.closing().await;
            None
        })
        .await
    }

    /// Begin shutdown: wake every task waiting on [`Gate::closing`].
    /// Idempotent.
    pub fn close(&self) {
        if self.closing.replace(true) {
            return;
        }
        for waker in self.waiters.borrow_mut().drain(..) {
            waker.wake();
        }
        if self.passes.get() == 0 {
            self.drained.notify();
        }
    }

    /// Close, then wait until every pass is dropped or `timeout` passes.
    /// `true` when every task ended in time.
    pub async fn close_and_wait(&self, timeout: Duration) -> bool {
        self.close();
        let deadline = std::time::Instant::now() + timeout;
        while self.passes.get() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            futures_lite::future::or(self.drained.wait(), glommio::timer::sleep(left)).await;
        }
        true
    }
}

pub struct Closing<'a> {
    gate: &'a Gate,
}

impl Future for Closing<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.gate.closing.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.gate.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glommio::LocalExecutorBuilder;

    #[test]
    fn close_wakes_waiters_and_waits_for_passes() {
        LocalExecutorBuilder::default()
            .spawn(|| async {
                let gate = Gate::new();
                let ended = Rc::new(Cell::new(0));
                for _ in 0..3 {
                    let (g, ended) = (gate.clone(), ended.clone());
                    assert!(gate.spawn(async move {
                        g.closing().await;
                        ended.set(ended.get() + 1);
                    }));
                }
                glommio::yield_if_needed().await;
                glommio::executor().yield_task_queue_now().await;
                assert_eq!(gate.passes(), 3);
                assert!(gate.close_and_wait(Duration::from_secs(5)).await);
                assert_eq!((ended.get(), gate.passes()), (3, 0));
                assert!(gate.enter().is_none(), "no pass once closing");
                assert!(!gate.spawn(async {}));
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_stuck_task_costs_only_the_timeout() {
        LocalExecutorBuilder::default()
            .spawn(|| async {
                let gate = Gate::new();
                let _held = gate.enter().unwrap();
                let started = std::time::Instant::now();
                assert!(!gate.close_and_wait(Duration::from_millis(50)).await);
                assert!(started.elapsed() >= Duration::from_millis(50));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}

//! Acknowledgements a client operation waits for (issue 37): a node that
//! is not one of a timer's replicas keeps nothing of a `POST`, `PUT` or
//! `DELETE` but the replication messages it queued, so it answers only
//! once a replica has taken one of them (2xx).
//!
//! A ticket is opened before the operation's messages are queued
//! ([`Acks::open`]); every message queued while it is open carries its
//! number, and the sender reports each one's outcome ([`Acks::settle`]).
//! The waiter ([`Acks::wait`]) resolves `Ok` on the first 2xx, `Err` once
//! every message of the ticket was refused, dropped or given up. Dropping
//! the wait (its timeout) closes the ticket; outcomes reported after that
//! find nothing and are ignored.
//!
//! Bounds: one entry per operation waiting (the connections that wait
//! are bounded by the server's connection limit), removed when its wait
//! ends. Single-threaded: one registry per shard.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A ticket's number; 0 is "none" (a message nobody waits for).
pub type Ticket = u32;

/// One open ticket.
#[derive(Default)]
struct Entry {
    /// Messages queued under it.
    queued: u32,
    /// Of those, refused, dropped or given up.
    failed: u32,
    acked: bool,
    waker: Option<Waker>,
}

/// A shard's open tickets.
#[derive(Default)]
pub struct Acks {
    open: RefCell<HashMap<Ticket, Entry>>,
    /// The ticket messages queued now carry (0: none).
    current: Cell<Ticket>,
    next: Cell<Ticket>,
}

impl Acks {
    /// Open a ticket: messages queued until [`Acks::close_queueing`] carry it.
    pub fn open(&self) -> Ticket {
        assert_eq!(self.current.get(), 0, "one ticket is queued at a time");
        let mut ticket = self.next.get().wrapping_add(1);
        let open = self.open.borrow();
        while ticket == 0 || open.contains_key(&ticket) {
            ticket = ticket.wrapping_add(1);
        }
        drop(open);
        self.next.set(ticket);
        self.open.borrow_mut().insert(ticket, Entry::default());
        self.current.set(ticket);
        ticket
    }

    /// Messages queued from now on carry no ticket.
    pub fn close_queueing(&self) {
        self.current.set(0);
    }

    /// The ticket of a message being queued now (0: none), counted.
    pub fn queued(&self) -> Ticket {
        let ticket = self.current.get();
        if let Some(e) = self.open.borrow_mut().get_mut(&ticket) {
            e.queued += 1;
        }
        ticket
    }

    /// A message of `ticket` was taken (`true`: 2xx) or is lost for good
    /// (refused, dropped, given up).
    pub fn settle(&self, ticket: Ticket, taken: bool) {
        if ticket == 0 {
            return;
        }
        let mut open = self.open.borrow_mut();
        let Some(e) = open.get_mut(&ticket) else {
            return;
        };
        match taken {
            true => e.acked = true,
            false => e.failed += 1,
        }
        if let Some(w) = e.waker.take() {
            w.wake();
        }
    }

    /// Resolves once a message of `ticket` was taken (`Ok`) or every one
    /// was lost (`Err`); a ticket with no message resolves `Ok` at once.
    pub fn wait(&self, ticket: Ticket) -> Wait<'_> {
        Wait { acks: self, ticket }
    }

    /// Tickets open (a gauge for tests and bounds).
    pub fn open_count(&self) -> usize {
        self.open.borrow().len()
    }
}

/// [`Acks::wait`]'s future; dropping it closes the ticket.
pub struct Wait<'a> {
    acks: &'a Acks,
    ticket: Ticket,
}

impl Future for Wait<'_> {
    type Output = Result<(), ()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut open = self.acks.open.borrow_mut();
        let Some(e) = open.get_mut(&self.ticket) else {
            return Poll::Ready(Err(()));
        };
        if e.acked || e.queued == 0 {
            return Poll::Ready(Ok(()));
        }
        if e.failed >= e.queued {
            return Poll::Ready(Err(()));
        }
        e.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.acks.open.borrow_mut().remove(&self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future;

    fn ready(acks: &Acks, ticket: Ticket) -> Option<Result<(), ()>> {
        future::block_on(future::poll_once(acks.wait(ticket)))
    }

    #[test]
    fn the_first_ack_resolves_and_refusals_of_every_message_fail() {
        let acks = Acks::default();
        let t = acks.open();
        assert_eq!(acks.queued(), t);
        assert_eq!(acks.queued(), t);
        acks.close_queueing();
        assert_eq!(acks.queued(), 0, "closed: no ticket");
        let mut wait = acks.wait(t);
        let polled = future::block_on(future::poll_once(&mut wait));
        assert_eq!(polled, None, "nothing settled yet");
        acks.settle(t, false);
        assert_eq!(future::block_on(future::poll_once(&mut wait)), None);
        acks.settle(t, true);
        assert_eq!(future::block_on(future::poll_once(&mut wait)), Some(Ok(())));
        drop(wait);
        assert_eq!(acks.open_count(), 0, "the wait closed the ticket");
        acks.settle(t, true);
        let u = acks.open();
        assert_ne!(u, t);
        acks.queued();
        acks.close_queueing();
        acks.settle(u, false);
        assert_eq!(ready(&acks, u), Some(Err(())));
    }

    #[test]
    fn a_ticket_with_no_message_resolves_at_once() {
        let acks = Acks::default();
        let t = acks.open();
        acks.close_queueing();
        assert_eq!(ready(&acks, t), Some(Ok(())));
        assert_eq!(acks.open_count(), 0);
    }
}

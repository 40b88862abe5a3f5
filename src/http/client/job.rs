//! A callback queued for its target's lanes ([`Job`]): the request's
//! bytes, what it is for ([`CallbackKey`]), whether a lane took it or its
//! caller withdrew it, and the status the lane hands back. Also the
//! hooks a lane asks and tells about each callback ([`Wanted`],
//! [`Sent`]). Data only: the queue is the pool's, the sending the lane's.

use super::error::Failure;
use super::response::Answer;
use crate::runtime::notify::Notify;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// What a queued callback is for, so that a lane can ask whether it is
/// still wanted just before sending it (a `DELETE` may have come since).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallbackKey {
    pub unique: u64,
    /// The timer ID's replica bloom: with `unique`, the full ID a signed
    /// callback's `webhook-id` names.
    pub bloom: u64,
    pub version: u64,
    pub sequence: u32,
    /// When the pop was due (engine ms), for [`Sent`].
    pub due_ms: u64,
    /// Which attempt of the pop this is: 0 for a timer without a delivery
    /// policy (the request is the reference's, no `X-Chronos-Attempt`),
    /// else 1, 2, ... (sent as `X-Chronos-Attempt`).
    pub attempt: u8,
}

/// Whether a queued callback should still be sent (set by the layer that
/// owns the timers; without one, every callback is).
pub type Wanted = Box<dyn Fn(&CallbackKey) -> bool>;

/// Told, for each callback, when its request's first byte was handed to
/// the socket (the pop lateness metric). It must not call the client.
pub type Sent = Box<dyn Fn(&CallbackKey, Instant)>;

/// A request queued for its target's lanes. Kept for reuse once its
/// caller is done with it ([`Client::give_job`]).
///
/// [`Client::give_job`]: super::Client::give_job
pub(super) struct Job {
    pub(super) request: RefCell<Vec<u8>>,
    pub(super) key: Option<CallbackKey>,
    /// A lane took it (it is on the wire, or about to be).
    pub(super) taken: Cell<bool>,
    /// Its caller gave up before a lane took it: lanes skip it.
    pub(super) withdrawn: Cell<bool>,
    /// The answer, or why there is none; set by the lane.
    pub(super) result: RefCell<Option<Result<Answer, Failure>>>,
    pub(super) done: Notify,
}

impl Job {
    pub(super) fn new(request: Vec<u8>, key: Option<CallbackKey>) -> Job {
        Job {
            request: RefCell::new(request),
            key,
            taken: Cell::new(false),
            withdrawn: Cell::new(false),
            result: RefCell::new(None),
            done: Notify::default(),
        }
    }
}

/// A lane's batch of jobs and their answers.
pub(super) type LaneVecs = (Vec<Rc<Job>>, Vec<Answer>);

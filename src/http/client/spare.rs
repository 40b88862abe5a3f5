//! What the client keeps for reuse instead of allocating again: request
//! buffers, batch buffers, queued-request records and a lane's batch
//! vectors. Bounds: `SPARE_BUFFERS_MAX` buffers and records (each buffer
//! at most 64 KiB), `SPARE_BATCHES_MAX` batch buffers and vectors (each
//! buffer at most 1 MiB); beyond them what is given back is dropped.

use super::job::{CallbackKey, Job};
use super::response::{Answer, FIRST_READ};
use super::Client;
use std::rc::Rc;

/// Buffers (and queued-request records) kept for reuse.
const SPARE_BUFFERS_MAX: usize = 256;
/// Lane batch vectors and batch buffers kept for reuse (one per lane or
/// pipelined batch running at once; each buffer at most 1 MiB).
const SPARE_BATCHES_MAX: usize = 64;

impl Client {
    /// A queued request for `request`: a spare job, or a new one.
    pub(super) fn take_job(&self, request: Vec<u8>, key: Option<CallbackKey>) -> Rc<Job> {
        let spare = self.spare_jobs.borrow_mut().pop();
        match spare {
            Some(mut job) => {
                let fresh = Rc::get_mut(&mut job).expect("a spare job has no other holder");
                *fresh = Job::new(request, key);
                job
            }
            None => Rc::new(Job::new(request, key)),
        }
    }

    /// Keep `job` for reuse if no queue or lane holds it any more.
    pub(super) fn give_job(&self, mut job: Rc<Job>) {
        if Rc::get_mut(&mut job).is_none() {
            return;
        }
        let mut spare = self.spare_jobs.borrow_mut();
        if spare.len() < SPARE_BUFFERS_MAX {
            spare.push(job);
        }
    }

    /// Keep a lane's (emptied) batch vectors for the next lane.
    pub(super) fn give_batch(&self, mut batch: Vec<Rc<Job>>, mut statuses: Vec<Answer>) {
        batch.clear();
        statuses.clear();
        let mut spare = self.spare_batches.borrow_mut();
        if spare.len() < SPARE_BATCHES_MAX {
            spare.push((batch, statuses));
        }
    }

    pub(super) fn take_buffer(&self) -> Vec<u8> {
        self.spare
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1024))
    }

    /// A buffer for a batch (requests sent together, or answers received):
    /// kept apart from the requests' own, so that each kind keeps the
    /// capacity it grew to instead of growing the other's again.
    pub(super) fn take_batch_buffer(&self) -> Vec<u8> {
        let spare = self.spare_batch_buffers.borrow_mut().pop();
        spare.unwrap_or_else(|| Vec::with_capacity(FIRST_READ))
    }

    pub(super) fn give_batch_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut spare = self.spare_batch_buffers.borrow_mut();
        if spare.len() < SPARE_BATCHES_MAX && buf.capacity() <= 1 << 20 {
            spare.push(buf);
        }
    }

    pub(super) fn give_buffer(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut spare = self.spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS_MAX && buf.capacity() <= 64 * 1024 {
            spare.push(buf);
        }
    }
}

//! Callback lanes: a callback ([`Client::callback`]) joins its target's
//! queue; whichever waiting callback gets a connection permit becomes a
//! lane and sends one pipelined batch, its own request first, then the
//! oldest queued ones, up to the target's batch limit, which adapts to the
//! target's answer rate. A callback no longer wanted is withdrawn unsent;
//! one not taken within its caller's wait is withdrawn too. What the
//! requests say (a callback's, a dead letter's, the signature) is
//! `deliver.rs`'s.

use super::error::{Broken, Failure, RequestError};
use super::job::{CallbackKey, Job, Wanted};
use super::pool::{HostPool, PoolKey, LANE_BATCH_MAX};
use super::request::{pool_key, Request};
use super::response::Answer;
use super::Client;
use crate::http::permits::Permit;
use crate::http::sign::MessageId;
use crate::runtime::sleep::sleep;
use futures_lite::future;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Withdraws a job not yet taken when its caller stops waiting.
struct Withdraw<'a>(&'a Job, &'a HostPool);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if !self.0.taken.get() {
            self.1.settle(self.0);
            self.0.withdrawn.set(true);
        }
    }
}

/// What a queued request's wait ended with.
enum Turn<'p> {
    /// A permit: this caller runs a lane.
    Lane(Permit<'p>),
    /// A lane answered it.
    Served,
    /// `wait` passed.
    WaitedOut,
}

/// The lane's own job first (so its caller's wait ends with this batch),
/// then live jobs from the front of `pool`'s queue, up to the target's
/// batch limit; each marked taken. A job no longer `wanted` is withdrawn
/// instead, and its caller told so.
fn take_jobs(pool: &HostPool, own: &Rc<Job>, wanted: &Option<Wanted>, batch: &mut Vec<Rc<Job>>) {
    assert!(batch.is_empty(), "a lane's batch starts empty");
    let limit = pool.batch_limit.get();
    assert!(
        (1..=LANE_BATCH_MAX).contains(&limit),
        "a lane batch of 1 to LANE_BATCH_MAX"
    );
    let take = |job: &Rc<Job>, batch: &mut Vec<Rc<Job>>| {
        if job.withdrawn.get() || job.taken.get() {
            return;
        }
        let unwanted = job.key.zip(wanted.as_ref()).is_some_and(|(k, w)| !w(&k));
        pool.settle(job);
        if unwanted {
            job.withdrawn.set(true);
            *job.result.borrow_mut() = Some(Err(Failure::Withdrawn));
            job.done.notify();
            return;
        }
        job.taken.set(true);
        batch.push(job.clone());
    };
    take(own, batch);
    let mut jobs = pool.jobs.borrow_mut();
    // Entries taken out of order or withdrawn, at the front: gone first,
    // so the queue holds no more than the jobs behind its oldest live one.
    while jobs
        .front()
        .is_some_and(|j| j.taken.get() || j.withdrawn.get())
    {
        jobs.pop_front();
    }
    while batch.len() < limit {
        let Some(job) = jobs.pop_front() else { break };
        take(&job, batch);
    }
}

impl Client {
    /// Queue `r` for its target's lanes and wait for its status. Whichever
    /// waiting request gets a connection permit becomes a lane: it sends
    /// one pipelined batch on one connection, its own request first and
    /// then the oldest queued ones (up to the target's batch limit), and
    /// lets the permit go. So a burst to one target costs one write and a
    /// few reads per batch, not per request, and at most `per_host_max`
    /// connections; and a lane's caller is done within one batch (at most
    /// the timeout) of getting its permit, whatever else is queued: the
    /// skew rule counts on it. A request not taken by a lane within `wait`
    /// is withdrawn, unsent. `key`: what the `wanted` check and the `sent`
    /// hook are asked about (`None`: neither). `msg`: signed as this
    /// message when signing keys are set.
    pub(super) async fn send_queued(
        &self,
        r: &Request<'_>,
        key: Option<CallbackKey>,
        wait: Option<Duration>,
        msg: Option<MessageId<'_>>,
    ) -> Result<Answer, RequestError> {
        let unsent = RequestError::unsent;
        let wait_until = wait.map(|w| Instant::now() + w);
        let resolve_for = wait.map_or(self.timeout, |w| w.min(self.timeout));
        let addr = self
            .resolve_for(r.host, r.port, resolve_for)
            .await
            .map_err(RequestError::unreached)?;
        // The address this callback will connect to, as resolved now: a
        // name allowed at create time may point elsewhere since.
        if let Some(guard) = &*self.guard.borrow() {
            guard
                .decide(r.host, addr.ip())
                .map_err(|reason| RequestError {
                    refused: true,
                    ..unsent(reason)
                })?;
        }
        let to = pool_key(addr, r);
        let pool = self.pool(&to);
        let queued = pool.queued.get();
        pool.admit_waiter(addr, queued)
            .map_err(RequestError::unreached)?;
        // Signed (when it is) as it is queued: nothing is awaited between
        // the clock read and the bytes.
        let request = self.build_queued(r, msg);
        let job = self.take_job(request, key);
        pool.jobs.borrow_mut().push_back(job.clone());
        pool.queued.set(pool.queued.get() + 1);
        let result = {
            let _withdraw = Withdraw(&job, &pool);
            self.await_turn(&pool, &to, &job, wait_until).await
        };
        self.give_job(job);
        result.map_err(|e| match e {
            Some(failure) => RequestError::of(failure),
            None => RequestError {
                waited_out: true,
                ..unsent(format!(
                    "no connection to {addr} free within {} ms",
                    wait.unwrap_or_default().as_millis()
                ))
            },
        })
    }

    /// Wait until `job` has its status: run lanes while this caller holds
    /// a permit, or let one serve it. `Err(None)`: `wait_until` passed
    /// before a lane took it.
    async fn await_turn(
        &self,
        pool: &HostPool,
        key: &PoolKey,
        job: &Rc<Job>,
        wait_until: Option<Instant>,
    ) -> Result<Answer, Option<Failure>> {
        loop {
            let result = job.result.borrow_mut().take();
            if let Some(result) = result {
                self.give_buffer(job.request.take());
                return result.map_err(Some);
            }
            if job.taken.get() {
                job.done.wait().await;
                continue;
            }
            match self.lane_or_served(pool, job, wait_until).await {
                Turn::Lane(permit) => {
                    self.run_lane(pool, key, job).await;
                    drop(permit);
                }
                Turn::Served => {}
                Turn::WaitedOut if job.taken.get() => {}
                Turn::WaitedOut => return Err(None),
            }
        }
    }

    /// Wait for a lane's permit, for a lane to serve `job`, or for
    /// `wait_until`, whichever comes first.
    async fn lane_or_served<'p>(
        &self,
        pool: &'p HostPool,
        job: &Job,
        wait_until: Option<Instant>,
    ) -> Turn<'p> {
        let lane = async { Turn::Lane(pool.permits.acquire().await) };
        let served = async {
            job.done.wait().await;
            Turn::Served
        };
        let deadline = async {
            match wait_until {
                Some(t) => sleep(t.saturating_duration_since(Instant::now())).await,
                None => future::pending::<()>().await,
            }
            Turn::WaitedOut
        };
        future::or(future::or(served, lane), deadline).await
    }

    /// Send one pipelined batch for the target, `own` first (see
    /// `send_queued`), handing each job its status or the failure.
    async fn run_lane(&self, pool: &HostPool, key: &PoolKey, own: &Rc<Job>) {
        let spare = self.spare_batches.borrow_mut().pop();
        let (mut batch, mut statuses) = spare.unwrap_or_else(|| {
            let n = LANE_BATCH_MAX;
            (Vec::with_capacity(n), Vec::with_capacity(n))
        });
        assert!(
            batch.is_empty() && statuses.is_empty(),
            "spare batches are empty"
        );
        take_jobs(pool, own, &self.wanted.borrow(), &mut batch);
        if batch.is_empty() {
            self.give_batch(batch, statuses);
            return;
        }
        let mut bytes = self.take_batch_buffer();
        for job in &batch {
            bytes.extend_from_slice(&job.request.borrow());
        }
        let sent_at = Instant::now();
        let on_wire = Cell::new(None);
        let result = self
            .pipeline_on(
                key,
                &bytes,
                batch.len(),
                self.timeout,
                &mut statuses,
                &on_wire,
            )
            .await;
        if let (Some(at), Some(sent)) = (on_wire.get(), &*self.sent.borrow()) {
            for callback in batch.iter().filter_map(|job| job.key.as_ref()) {
                sent(callback, at);
            }
        }
        pool.failed_at.set(result.is_err().then(Instant::now));
        self.adapt_batch(pool, batch.len(), sent_at.elapsed(), result.is_ok());
        for (i, job) in batch.drain(..).enumerate() {
            let outcome = match (statuses.get(i), &result) {
                (Some(&answer), _) => Ok(answer),
                (None, Err(e)) => Err(Failure::Sent(e.clone())),
                (None, Ok(())) => Err(Failure::Sent(Broken::transport("no answer".into()))),
            };
            *job.result.borrow_mut() = Some(outcome);
            job.done.notify();
        }
        self.give_batch_buffer(bytes);
        self.give_batch(batch, statuses);
    }

    /// Size the target's next batches so that one is answered well within
    /// the timeout: a pipelined request waits for the ones before it, and
    /// its timeout counts from the send. The aim is an eighth of the
    /// timeout at the answer rate just seen; it at most doubles per batch,
    /// and halves on a failure. (A target that takes 20 ms per request gets
    /// batches of about 9 at the default 1.5 s; nginx gets 256.)
    fn adapt_batch(&self, pool: &HostPool, count: usize, took: Duration, ok: bool) {
        let old = pool.batch_limit.get();
        let next = if ok {
            let per_request_us = (took.as_micros() as u64 / count as u64).max(1);
            let aim_us = self.timeout.as_micros() as u64 / 8;
            ((aim_us / per_request_us) as usize).min(old * 2)
        } else {
            old / 2
        };
        pool.batch_limit.set(next.clamp(1, LANE_BATCH_MAX));
    }
}

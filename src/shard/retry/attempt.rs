//! One attempt of a pop with a delivery policy, and what follows it: the
//! next attempt scheduled (owned, logged, reported to the other replicas),
//! the pop delivered, or given up and sent to its dead-letter target. Also
//! the shard's retry task, which sends the attempts as they fall due.

use super::book::{Entry, Key};
use super::SENDING_MAX;
use crate::http::client::{CallbackKey, DeadLetter, RequestError};
use crate::runtime::clock;
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::timer::retry::{self, GiveUp, Next, Outcome};
use crate::timer::spec::AttemptState;
use crate::timer::Timer;
use futures_lite::future;
use std::rc::Rc;
use std::time::Duration;

/// The longest the retry task sleeps with nothing due.
const IDLE_SLEEP_MS: u64 = 1_000;

/// `X-Chronos-Last-Outcome`'s code in a report: the status, or 0 for a
/// transport error and 1 for a timeout.
pub(super) fn code_of(outcome: Outcome) -> u16 {
    match outcome {
        Outcome::Transport => 0,
        Outcome::Timeout => 1,
        Outcome::Status { code, .. } => code,
    }
}

/// [`code_of`] read back.
pub(super) fn outcome_of_code(code: u16) -> Outcome {
    match code {
        0 => Outcome::Transport,
        1 => Outcome::Timeout,
        code => Outcome::status(code),
    }
}

/// A uniform sample for the jitter (xorshift64 per shard thread, seeded
/// from the clock: the spread only has to differ between pops).
fn sample() -> u32 {
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new(clock::unix_us() | 1);
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 32) as u32
    })
}

impl Shard {
    /// The first attempt of `popped`'s pop (its policy's) ended; it was
    /// sent at `first_unix_ms`.
    pub(in crate::shard) fn first_attempt_ended(
        self: &Rc<Self>,
        popped: Timer,
        first_unix_ms: u64,
        result: Result<(), RequestError>,
    ) {
        // Deleted or replaced while its callback was out: its outcome
        // starts no schedule (the pop loop's record of the dispatch is
        // dropped by the change that replaced it).
        if !self.pop.is_wanted(popped.unique, popped.version) {
            return;
        }
        self.attempt_ended(popped, 1, first_unix_ms, result);
    }

    /// Whether the outcome of a retry of `timer` may act: its entry is
    /// still in the book, of its incarnation, and being sent (a delete or
    /// an update took it out meanwhile, or a newer report replaced it).
    fn retry_stands(&self, timer: &Timer) -> bool {
        let key = (timer.unique, timer.sequence);
        self.retries
            .with(key, |e| e.sending && e.timer.version == timer.version)
            .unwrap_or(false)
    }

    /// Attempt number `attempts` of `timer`'s pop ended with `result`.
    fn attempt_ended(
        self: &Rc<Self>,
        timer: Timer,
        attempts: u8,
        first_unix_ms: u64,
        result: Result<(), RequestError>,
    ) {
        let key = (timer.unique, timer.sequence);
        if attempts > 1 && !self.retry_stands(&timer) {
            return;
        }
        let Some(policy) = timer.delivery().map(|d| d.retry) else {
            // A report or a log record of a timer without a policy: never
            // watched, but not trusted either.
            self.retries.take(key);
            return;
        };
        ShardStats::add(&self.base.my_stats().delivery_attempts, 1);
        self.count_by_tag(&timer, 1, 0);
        let outcome = match &result {
            Ok(()) => Outcome::status(200),
            Err(e) if e.withdrawn => {
                // Deleted or replaced while it waited: not sent, not wanted.
                self.retries.take(key);
                return;
            }
            Err(e) if e.refused => {
                let last = Outcome::Transport;
                let s = ended(&timer, attempts, first_unix_ms, last);
                self.give_up(timer, s, last, "the callback guard refuses its address");
                return;
            }
            Err(e) if e.waited_out => {
                // Never sent: no connection came free within the wait. The
                // attempt is not counted; the others are told it moved.
                self.postpone(timer, attempts - 1, first_unix_ms, &policy);
                return;
            }
            Err(e) => e.outcome.unwrap_or(Outcome::Transport),
        };
        self.follow(timer, &policy, attempts, first_unix_ms, outcome);
    }

    /// What follows attempt number `attempts` of `timer`'s pop, which
    /// ended with `outcome`: delivered, the next attempt, or given up.
    fn follow(
        self: &Rc<Self>,
        timer: Timer,
        policy: &retry::RetryPolicy,
        attempts: u8,
        first_unix_ms: u64,
        outcome: Outcome,
    ) {
        let key = (timer.unique, timer.sequence);
        let stats = self.base.my_stats();
        let now = clock::unix_ms();
        let next = retry::next_attempt(
            policy,
            u32::from(attempts),
            first_unix_ms,
            now,
            outcome,
            sample(),
        );
        let sequence = timer.sequence;
        let state = |next_unix_ms, done| AttemptState {
            sequence,
            attempts,
            first_unix_ms,
            next_unix_ms,
            last_outcome: code_of(outcome),
            done,
        };
        match next {
            Next::Done => {
                let kept = self.retries.take(key).is_some();
                if attempts > 1 || kept {
                    ShardStats::add(&stats.delivery_retried_delivered, 1);
                    self.log_attempt(&timer, &state(0, true), true);
                    self.report_attempt(&timer, &state(0, true));
                } else {
                    self.replicate_pop(&timer);
                }
            }
            Next::RetryAt(at) if self.retries.has_room(key) => {
                let delay_ms = at.saturating_sub(now);
                stats.record_retry_delay(delay_ms.saturating_mul(1000));
                self.schedule(timer, state(at, false), outcome);
            }
            Next::RetryAt(_) => {
                ShardStats::add(&stats.delivery_book_full, 1);
                self.give_up(timer, state(0, true), outcome, "the retry book is full");
            }
            Next::GiveUp(why) => {
                let reason = match why {
                    GiveUp::Refused => "the target refused it",
                    GiveUp::AttemptsSpent => "its attempts are spent",
                    GiveUp::PastGiveUpAfter => "the next attempt would fall after give-up-after",
                };
                self.give_up(timer, state(0, true), outcome, reason);
            }
        }
    }

    /// An attempt that never went out (no connection within the wait):
    /// due again after the policy's first delay, with `attempts` made.
    fn postpone(
        self: &Rc<Self>,
        timer: Timer,
        attempts: u8,
        first_unix_ms: u64,
        policy: &retry::RetryPolicy,
    ) {
        let key = (timer.unique, timer.sequence);
        let last = self
            .retries
            .with(key, |e| e.last)
            .unwrap_or(Outcome::Transport);
        let s = AttemptState {
            sequence: timer.sequence,
            attempts: attempts.max(1),
            first_unix_ms,
            next_unix_ms: clock::unix_ms() + u64::from(policy.initial_delay_ms.min(1_000)),
            last_outcome: code_of(last),
            done: false,
        };
        self.schedule(timer, s, last);
    }

    /// Keep `timer`'s pop as owned, due at `s.next_unix_ms`: logged and
    /// reported to the other replicas.
    fn schedule(self: &Rc<Self>, timer: Timer, s: AttemptState, last: Outcome) {
        self.log_attempt(&timer, &s, true);
        self.report_attempt(&timer, &s);
        self.retries.put(Entry {
            timer,
            attempts: s.attempts,
            first_unix_ms: s.first_unix_ms,
            next_unix_ms: s.next_unix_ms,
            due_ms: clock::unix_to_engine(s.next_unix_ms),
            last,
            owned: true,
            sending: false,
        });
    }

    /// No more attempts for `timer`'s pop: it ends everywhere, and goes to
    /// its dead-letter target if it has one.
    fn give_up(
        self: &Rc<Self>,
        timer: Timer,
        s: AttemptState,
        last: Outcome,
        reason: &'static str,
    ) {
        self.retries.take((timer.unique, timer.sequence));
        ShardStats::add(&self.base.my_stats().delivery_given_up, 1);
        self.count_by_tag(&timer, 0, 1);
        self.log_attempt(&timer, &s, true);
        self.report_attempt(&timer, &s);
        let id = timer.id().to_hex_string();
        let dead_letter = timer.delivery().map(|d| d.dead_letter.to_string());
        match dead_letter.filter(|u| !u.is_empty()) {
            None => {
                tracing::warn!(target: "chronos::callback", "timer {id}: pop {} given up after {} attempt(s) ({reason}; last outcome {last:?}); no dead-letter target", s.sequence, s.attempts);
            }
            Some(_) if self.retries.dead_letters.get() >= SENDING_MAX => {
                ShardStats::add(&self.base.my_stats().dead_letters_failed, 1);
                tracing::warn!(target: "chronos::callback", "timer {id}: pop {} given up after {} attempt(s) ({reason}); its dead letter not sent: {SENDING_MAX} dead letters of this shard are in flight", s.sequence, s.attempts);
            }
            Some(uri) => {
                let letter = DeadLetter {
                    unique: timer.unique,
                    bloom: timer.bloom,
                    sequence: s.sequence,
                    attempts: s.attempts,
                    last,
                };
                let shard = self.clone();
                let count = &self.retries.dead_letters;
                count.set(count.get() + 1);
                crate::runtime::spawn::spawn_local(async move {
                    shard.send_dead_letter(&uri, timer, letter, reason).await;
                    let count = &shard.retries.dead_letters;
                    count.set(count.get() - 1);
                })
                .detach();
            }
        }
    }

    async fn send_dead_letter(
        &self,
        uri: &str,
        timer: Timer,
        letter: DeadLetter,
        reason: &'static str,
    ) {
        let opaque = timer.opaque().as_bytes();
        let sent = self
            .outbound
            .client
            .dead_letter(uri, opaque, letter, None)
            .await;
        let stats = self.base.my_stats();
        let id = timer.id().to_hex_string();
        match sent {
            Ok(()) => {
                ShardStats::add(&stats.dead_letters_sent, 1);
                tracing::info!(target: "chronos::callback", "timer {id}: pop {} given up after {} attempt(s) ({reason}); sent to its dead-letter target", letter.sequence, letter.attempts);
            }
            Err(e) => {
                ShardStats::add(&stats.dead_letters_failed, 1);
                tracing::warn!(target: "chronos::callback", "timer {id}: pop {} given up after {} attempt(s) ({reason}); its dead-letter POST failed too: {e}", letter.sequence, letter.attempts);
            }
        }
    }

    /// Send the attempt that `key`'s entry (marked as being sent) is due.
    /// A watched entry is taken over: this shard owns it from now.
    fn start_attempt(self: &Rc<Self>, key: Key) {
        let Some((timer, attempts, first_unix_ms)) = self
            .retries
            .with(key, |e| (e.timer.share(), e.attempts, e.first_unix_ms))
        else {
            return;
        };
        if !self.still_wanted(&timer) {
            self.retries.take(key);
            return;
        }
        if let Some(reason) = past_policy(&timer, attempts, first_unix_ms) {
            // A takeover after the owner's last attempt, or past
            // give-up-after: no attempt is sent, the pop is given up.
            let last = self
                .retries
                .with(key, |e| e.last)
                .unwrap_or(Outcome::Transport);
            let s = ended(&timer, attempts, first_unix_ms, last);
            self.give_up(timer, s, last, reason);
            return;
        }
        // With a later replica or site, the attempt waits for a connection
        // no longer than a pop does: it would otherwise go out after the
        // next replica's takeover.
        let wait = crate::shard::pop::has_later_pop_elsewhere(self, &timer)
            .then(|| Duration::from_millis(self.base.resolved.config.timers.callback_wait_ms));
        let attempt = attempts.saturating_add(1);
        let shard = self.clone();
        self.retries.sending.set(self.retries.sending.get() + 1);
        crate::runtime::spawn::spawn_local(async move {
            let ck = CallbackKey {
                unique: timer.unique,
                bloom: timer.bloom,
                version: timer.version,
                sequence: timer.sequence,
                due_ms: clock::now_ms(),
                attempt,
            };
            let result = shard
                .outbound
                .client
                .callback(timer.uri(), timer.opaque().as_bytes(), ck, wait)
                .await;
            let sending = &shard.retries.sending;
            sending.set(sending.get() - 1);
            shard.retries.wake.notify();
            shard.attempt_ended(timer, attempt, first_unix_ms, result);
        })
        .detach();
    }

    /// Count attempts and given-up pops under each of `timer`'s tags.
    fn count_by_tag(&self, timer: &Timer, attempts: u64, given_up: u64) {
        if !timer.has_tags() {
            return;
        }
        let store = self.timers.store.borrow();
        let stats = self.base.my_stats();
        for (index, _) in timer.tags() {
            stats.count_delivery_tag(store.tag_name(index), attempts, given_up);
        }
    }

    /// Whether `timer`'s incarnation still stands: the stored copy of its
    /// ID (a tombstone after its final pop, or none once that expired) has
    /// its version. A delete or an update stores another, and takes the
    /// incarnation's entries out of the book too.
    fn still_wanted(&self, timer: &Timer) -> bool {
        let store = self.timers.store.borrow();
        store
            .get(timer.unique)
            .is_none_or(|(_, t)| t.version == timer.version)
    }
}

/// The state of `timer`'s pop that no attempt follows any more.
fn ended(timer: &Timer, attempts: u8, first_unix_ms: u64, last: Outcome) -> AttemptState {
    AttemptState {
        sequence: timer.sequence,
        attempts,
        first_unix_ms,
        next_unix_ms: 0,
        last_outcome: code_of(last),
        done: true,
    }
}

/// Why no further attempt of `timer`'s pop may be sent after `attempts`
/// made, the first at `first_unix_ms`: its attempts are spent, or it is
/// past give-up-after (a takeover can fall there); `None`: it may.
fn past_policy(timer: &Timer, attempts: u8, first_unix_ms: u64) -> Option<&'static str> {
    let policy = timer.delivery()?.retry;
    if attempts >= policy.attempts {
        return Some("its attempts are spent");
    }
    let give_up_at = first_unix_ms.saturating_add(u64::from(policy.give_up_after_ms));
    (clock::unix_ms() > give_up_at).then_some("the next attempt would fall after give-up-after")
}

/// The shard's retry task: sends each entry's attempt when it falls due,
/// at most [`SENDING_MAX`] at once; ends at shutdown.
pub async fn retry_loop(shard: Rc<Shard>) {
    let retries = &shard.retries;
    loop {
        if shard.base.gate.is_closing() {
            return;
        }
        let now = clock::now_ms();
        let mut next_ms = None;
        while retries.sending.get() < SENDING_MAX {
            match retries.next_due(now) {
                Ok(key) => shard.start_attempt(key),
                Err(at) => {
                    next_ms = at;
                    break;
                }
            }
        }
        let sleep_ms = next_ms.map_or(IDLE_SLEEP_MS, |at| {
            at.saturating_sub(now).min(IDLE_SLEEP_MS)
        });
        let sleep = glommio::timer::sleep(Duration::from_millis(sleep_ms.max(1)));
        future::or(
            future::or(retries.wake.wait(), sleep),
            shard.base.gate.closing(),
        )
        .await;
    }
}

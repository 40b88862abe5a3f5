//! A peer's sender task: it takes the next batch off the peer's queue,
//! gives up what waited too long, sends the rest as one pipelined batch
//! through the shard's HTTP client, settles what was taken or refused for
//! good, and puts what is to be retried back at the front, in order, with
//! a backoff. Refusals that say the configuration is wrong (403, a TLS
//! handshake) are logged at warn, at most once per
//! [`FORBIDDEN_LOG_EVERY`] per shard.

use super::queue::{count, set_queued, Count, Peer};
use super::segment::{Message, Segment};
use super::{
    ReplicatorConfig, BACKOFF_MS_MAX, BACKOFF_MS_MIN, BATCH_MAX, SEGMENT_BYTES_MAX,
    SPARE_SEGMENTS_MAX,
};
use crate::cluster::acks::Acks;
use crate::cluster::owed::Owed;
use crate::http::client::Client;
use crate::runtime::clock;
use crate::runtime::gate::Gate;
use crate::stats::{ShardStats, REPLICATION_LAG_BOUNDS_US};
use futures_lite::future;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The next batch for `peer`: its first segment, with the segments after
/// it appended while the whole stays within [`BATCH_MAX`] requests and
/// [`SEGMENT_BYTES_MAX`] bytes. A retried segment (what the peer refused
/// or did not answer, put back alone at the front) so goes out with the
/// messages queued behind it, and a message the peer refuses while it
/// takes others can be told from a peer that takes nothing.
fn take_batch(peer: &Peer) -> Option<Segment> {
    let mut segments = peer.segments.borrow_mut();
    let mut seg = segments.pop_front()?;
    while let Some(next) = segments.front() {
        let fits = seg.count() + next.count() <= BATCH_MAX
            && seg.bytes.len() + next.bytes.len() <= SEGMENT_BYTES_MAX;
        if !fits {
            break;
        }
        let next = segments.pop_front().expect("just seen");
        let shift = seg.bytes.len() as u32;
        seg.bytes.extend_from_slice(&next.bytes);
        seg.messages.extend(next.messages.iter().map(|m| Message {
            end: m.end + shift,
            ..*m
        }));
        let mut spare = peer.spare.borrow_mut();
        if spare.len() < SPARE_SEGMENTS_MAX {
            let mut bytes = next.bytes;
            bytes.clear();
            spare.push(bytes);
        }
    }
    assert!(seg.count() <= BATCH_MAX, "a batch is bounded");
    Some(seg)
}

/// One peer's sender task.
pub(super) struct Sender {
    pub(super) peer: Rc<Peer>,
    pub(super) client: Rc<Client>,
    pub(super) gate: Rc<Gate>,
    pub(super) config: ReplicatorConfig,
    pub(super) stats: Arc<[ShardStats]>,
    pub(super) shard: usize,
    pub(super) acks: Rc<Acks>,
    pub(super) owed: Rc<Owed>,
}

impl Sender {
    /// Message `m` is settled for good: taken, refused or given up.
    fn settled(&self, m: &Message, taken: bool) {
        let peer = &self.peer;
        peer.settled_total.set(peer.settled_total.get() + 1);
        self.acks.settle(m.ticket, taken);
        if m.owed != 0 {
            self.owed.settle(m.owed);
        }
    }

    /// Drain the peer's queue until shutdown (or retirement) finds it empty.
    pub(super) async fn run(self) {
        let peer = &self.peer;
        let mut backoff_ms = 0u64;
        // Reused for every segment (at most `BATCH_MAX` statuses).
        let mut statuses = Vec::with_capacity(BATCH_MAX);
        loop {
            let next = take_batch(peer);
            let Some(mut seg) = next else {
                if self.gate.is_closing() || peer.retired.get() {
                    peer.running.set(false);
                    return;
                }
                future::or(peer.wake.wait(), self.gate.closing()).await;
                continue;
            };
            assert!(
                peer.queued.get() >= seg.count(),
                "queued counts every segment"
            );
            set_queued(
                &self.stats[self.shard],
                peer,
                peer.queued.get() - seg.count(),
            );
            assert!(
                peer.queued_bytes.get() >= seg.bytes.len(),
                "the queue's byte count covers what it holds"
            );
            peer.queued_bytes
                .set(peer.queued_bytes.get() - seg.bytes.len());
            self.give_up_expired(&mut seg);
            if seg.count() > 0 {
                peer.in_flight.set(seg.count());
                seg.restamp(clock::now_ms());
                statuses.clear();
                backoff_ms = self.deliver(&seg, backoff_ms, &mut statuses).await;
                self.requeue_unanswered(&seg, &statuses);
                peer.in_flight.set(0);
            }
            if peer.queued.get() == 0 {
                peer.late_logged.set(false);
            }
            seg.bytes.clear();
            seg.messages.clear();
            {
                let mut spare = peer.spare.borrow_mut();
                if spare.len() < SPARE_SEGMENTS_MAX && seg.bytes.capacity() <= 1 << 20 {
                    spare.push(seg.bytes);
                }
                let mut spare = peer.spare_messages.borrow_mut();
                if spare.len() < SPARE_SEGMENTS_MAX && seg.messages.capacity() <= BATCH_MAX {
                    spare.push(seg.messages);
                }
            }
            if backoff_ms > 0 && !self.gate.is_closing() {
                let pause = glommio::timer::sleep(Duration::from_millis(backoff_ms));
                future::or(pause, self.gate.closing()).await;
            }
        }
    }

    /// Give up the segment's messages queued longer than `deliver_within`
    /// ago (counted as failed), to another site or a peer that left the
    /// cluster: a receiver's tombstone lives only that long (plus the
    /// timeout), so a create sent later could bring a deleted timer back.
    /// Messages are queued in order, so they are a prefix. To a member,
    /// only a prefix of messages it answered and kept refusing (5xx, 408,
    /// 429) that long is given up, and the member is then owed a repair;
    /// a message it never answered (down, stopped) is kept, and lateness
    /// is logged once per outage.
    fn give_up_expired(&self, seg: &mut Segment) {
        let now_ms = clock::now_ms();
        let within_ms = self.config.deliver_within.as_millis() as u64;
        let peer = &self.peer;
        let member = !self.config.sites && !peer.retired.get();
        // To a member, only what it answered and refused at every try for
        // that long (it is alive, and a message it refuses for good would
        // hold up every later one; a node answering 503 while it recovers
        // briefly is not that).
        let expired = seg
            .messages
            .iter()
            .take_while(|m| match member {
                true => m.refused_since_ms != 0 && m.refused_since_ms + within_ms <= now_ms,
                false => m.born_ms + within_ms <= now_ms,
            })
            .count();
        let late = seg
            .messages
            .get(expired)
            .is_some_and(|m| m.born_ms + within_ms <= now_ms);
        if member && late && !peer.late_logged.replace(true) {
            tracing::warn!(target: "chronos::replication", "to {}: messages queued over {within_ms} ms ago are still undelivered; they are kept until the peer answers or leaves the cluster", peer.address);
        }
        if expired == 0 {
            return;
        }
        if member && !peer.repair_owed.replace(true) {
            tracing::warn!(target: "chronos::replication", "to {}: {expired} messages it kept refusing for over {within_ms} ms are given up; this shard will send the peer everything it holds for it", peer.address);
        }
        count(
            &self.stats[self.shard],
            Some(peer),
            Count::Failed,
            expired as u64,
        );
        tracing::warn!(target: "chronos::replication", "to {}: {expired} messages given up, queued over {within_ms} ms ago", peer.address);
        for m in &seg.messages[..expired] {
            self.settled(m, false);
        }
        seg.drop_front(expired);
    }

    /// Send one segment as a pipelined batch and count the outcome (the
    /// answered statuses land in `statuses`); returns the next backoff.
    async fn deliver(&self, seg: &Segment, backoff_ms: u64, statuses: &mut Vec<u16>) -> u64 {
        let stats = &self.stats[self.shard];
        let peer = &self.peer;
        let outcome = self
            .client
            .pipeline(
                peer.socket,
                &seg.bytes,
                seg.count(),
                self.config.timeout,
                statuses,
            )
            .await;
        let sent = statuses.iter().filter(|s| (200..300).contains(*s)).count();
        self.record_lag(seg, statuses);
        for (m, status) in seg.messages.iter().zip(statuses.iter()) {
            match *status {
                200..=299 => self.settled(m, true),
                s if is_final_refusal(s) => self.settled(m, false),
                _ => {}
            }
        }
        let refused = statuses.iter().filter(|s| is_final_refusal(**s)).count();
        log_forbidden(
            &peer.address,
            statuses.iter().filter(|s| **s == 403).count(),
        );
        count(stats, Some(peer), Count::Sent, sent as u64);
        count(stats, Some(peer), Count::Failed, refused as u64);
        let retry = seg.count() - sent - refused;
        match outcome {
            Ok(()) if retry == 0 => 0,
            Ok(()) => (backoff_ms * 2).clamp(BACKOFF_MS_MIN, BACKOFF_MS_MAX),
            Err(e) => {
                tracing::debug!(target: "chronos::replication", "to {}: {retry} messages to retry: {e}", peer.address);
                if e.starts_with("TLS handshake") {
                    log_tls_refused(&peer.address, retry, &e);
                }
                (backoff_ms * 2).clamp(BACKOFF_MS_MIN, BACKOFF_MS_MAX)
            }
        }
    }

    /// `chronos_replication_lag_seconds`: each message the peer took (2xx),
    /// from when it was first queued (retries included) until now.
    fn record_lag(&self, seg: &Segment, statuses: &[u16]) {
        let lag = &self.stats[self.shard].replication_lag[usize::from(self.peer.site.is_some())];
        let now_ms = clock::now_ms();
        for (m, status) in seg.messages.iter().zip(statuses) {
            if (200..300).contains(status) {
                let ms = now_ms.saturating_sub(m.born_ms);
                lag.record(&REPLICATION_LAG_BOUNDS_US, ms.saturating_mul(1000));
            }
        }
    }

    /// Put what was not delivered (unanswered, or answered with a status
    /// worth retrying) back at the front of the queue, in order, unless
    /// shutdown began or the peer was retired: then it is given up and
    /// counted as failed. (Messages past `deliver_within` are given up
    /// before the next send.)
    fn requeue_unanswered(&self, seg: &Segment, statuses: &[u16]) {
        let stats = &self.stats[self.shard];
        let again: Vec<usize> = (0..seg.count())
            .filter(|&i| statuses.get(i).is_none_or(|s| retryable(*s)))
            .collect();
        if again.is_empty() {
            return;
        }
        let peer = &self.peer;
        if self.gate.is_closing() || peer.retired.get() {
            count(stats, Some(peer), Count::Failed, again.len() as u64);
            for &i in &again {
                self.settled(&seg.messages[i], false);
            }
            tracing::warn!(target: "chronos::replication", "to {}: {} messages given up undelivered", peer.address, again.len());
            return;
        }
        let mut retry = Segment {
            bytes: peer.spare.borrow_mut().pop().unwrap_or_default(),
            messages: Vec::with_capacity(again.len()),
        };
        let now_ms = clock::now_ms();
        // A refusal starts counting against a message only when the peer
        // took others of the batch: a peer refusing everything (503 while
        // it replays its log, or while its disk is behind) is unavailable,
        // as one that does not answer is, and is waited for (the soak: a
        // node restarted from a long log had its deletes given up). Once
        // started, the count goes on while the message is refused, alone
        // or not; a try left unanswered ends it.
        let took_others = statuses.iter().any(|s| (200..300).contains(s));
        for &i in &again {
            retry.bytes.extend_from_slice(seg.request(i));
            let m = &seg.messages[i];
            let refused_since_ms = match statuses.get(i) {
                Some(_) if m.refused_since_ms == 0 && took_others => now_ms,
                Some(_) => m.refused_since_ms,
                None => 0,
            };
            retry.messages.push(Message {
                end: retry.bytes.len() as u32,
                refused_since_ms,
                ..*m
            });
        }
        count(stats, Some(peer), Count::Retried, retry.count() as u64);
        set_queued(stats, peer, peer.queued.get() + retry.count());
        peer.queued_bytes
            .set(peer.queued_bytes.get() + retry.bytes.len());
        peer.segments.borrow_mut().push_front(retry);
    }
}

/// The least time between two "refused with 403" lines of a shard.
const FORBIDDEN_LOG_EVERY: Duration = Duration::from_secs(10);

thread_local! {
    /// This shard's "refused with 403" line (a shard is a thread).
    static FORBIDDEN_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

/// `n` messages to `address` refused with 403: the secrets differ. At
/// warn, at most once per [`FORBIDDEN_LOG_EVERY`] per shard.
fn log_forbidden(address: &str, n: usize) {
    if n == 0 {
        return;
    }
    FORBIDDEN_LOGGED.with(|limit| {
        if let Some(more) = log_now(limit) {
            tracing::warn!(target: "chronos::replication", "to {address}: {n} messages refused with 403, shared-secret mismatch: this node's [cluster] shared-secret differs from the peer's; given up, not retried{more}");
        }
    });
}

/// Whether a line limited by `limit` is due now (at most once per
/// [`FORBIDDEN_LOG_EVERY`]): `Some` with the note on the batches not
/// logged since the last one.
fn log_now(limit: &crate::runtime::loglimit::LogLimit) -> Option<String> {
    let now = std::time::Instant::now();
    let quiet = crate::runtime::loglimit::log_due(limit, now, FORBIDDEN_LOG_EVERY)?;
    Some(match quiet {
        0 => String::new(),
        q => format!(" (and {q} more batches so since the last such line)"),
    })
}

thread_local! {
    /// This shard's "TLS handshake failed" line.
    static TLS_LOGGED: crate::runtime::loglimit::LogLimit = const { Cell::new((None, 0)) };
}

/// A peer's TLS handshake failed (its certificate does not verify against
/// `[cluster] tls-ca-file`, or it does not speak TLS): a configuration
/// error that nothing else shows at warn. At most once per
/// [`FORBIDDEN_LOG_EVERY`] per shard; the messages stay queued.
fn log_tls_refused(address: &str, n: usize, reason: &str) {
    TLS_LOGGED.with(|limit| {
        if let Some(more) = log_now(limit) {
            tracing::warn!(target: "chronos::replication", "to {address}: {n} messages not delivered, retried: {reason}{more}");
        }
    });
}

/// A status that says the peer read the message and refused it for good
/// (a 4xx other than timeout or too many requests): not retried.
fn is_final_refusal(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// A status after which the same message may succeed later (5xx, 408, 429).
fn retryable(status: u16) -> bool {
    !(200..300).contains(&status) && !is_final_refusal(status)
}

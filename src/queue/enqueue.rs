//! Enqueue: messages from the consumer thread, in batches, handled as seed
//! 004 handles them one by one: a message due within the timing advance is
//! published at once unless its ID waits in the table (from before, or
//! stored by an earlier message of the batch); the rest are inserted with
//! one `UNNEST` statement (idempotent on a waiting ID; a message whose ID
//! belongs to a claimed row waits until that row is gone: `insert`). The late ones are handed
//! to the producer before the insert, and their acknowledgements awaited
//! after it; offsets are stored for commit only then.

use super::consumer::Charge;
use super::deadline::system_time_of;
use super::headers::{headers_json, validate, HEADER_DEADLINE, HEADER_ID};
use super::pg::{query_input, QueryError};
use super::{Batch, Inbound, Kind, Pending, QueueShard};
use crate::runtime::clock;
use crate::runtime::notify::Notify;
use crate::stats::{Reject, ShardStats, Stage};
use rdkafka::consumer::Consumer;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};
use tokio_postgres::types::ToSql;

/// One batch, sorted: rows to insert, late messages, last offsets.
#[derive(Default)]
struct Sorted {
    /// The last offset of each partition in the batch.
    last: Vec<(i32, i64)>,
    ids: Vec<String>,
    deadlines: Vec<SystemTime>,
    header_json: Vec<String>,
    keys: Vec<Option<Vec<u8>>>,
    values: Vec<Option<Vec<u8>>>,
    /// Late messages, each with the number of rows to store before it.
    late: Vec<(String, Inbound, usize)>,
    /// The batch's share of the inbox bytes, given back once it is done.
    charges: Vec<Charge>,
    /// When its earliest message was polled (`None`: an empty batch).
    polled: Option<Instant>,
}

impl QueueShard {
    pub(super) async fn enqueue_loop(self: Rc<Self>) {
        let inbox = self.shared.inboxes[self.shard].clone();
        let max = self.cfg().insert_batch_max;
        let bytes_max = self.cfg().insert_batch_bytes_max;
        let mut batch: Vec<Inbound> = Vec::with_capacity(max);
        loop {
            let Some(Ok(first)) = self.gate.unless_closing(inbox.recv()).await else {
                return;
            };
            // At most `insert-batch-max` messages, and no more once
            // `insert-batch-bytes-max` is reached.
            let mut bytes = inbound_bytes(&first);
            batch.push(first);
            while batch.len() < max && bytes < bytes_max {
                match inbox.try_recv() {
                    Ok(m) => {
                        bytes += inbound_bytes(&m);
                        batch.push(m);
                    }
                    Err(_) => break,
                }
            }
            assert!(batch.len() <= max, "a batch keeps to its bound");
            if !self.enqueue_batch(&mut batch).await {
                return;
            }
        }
    }

    /// Handle one batch; `false` only at shutdown.
    async fn enqueue_batch(self: &Rc<Self>, batch: &mut Vec<Inbound>) -> bool {
        ShardStats::add(&self.stats().queue_consumed, batch.len() as u64);
        let mut sorted = self.sort(batch);
        assert!(batch.is_empty(), "every message sorted");
        // The late ones first, as seed 004 would: a row stored after a late
        // message with its ID does not hold that message back.
        let Some(wait) = self.publish_late(&mut sorted).await else {
            return false;
        };
        if !sorted.ids.is_empty() && !self.insert(&sorted).await {
            return false;
        }
        if !self.acknowledged(&wait).await {
            return false;
        }
        if let Some(polled) = sorted.polled {
            self.stats()
                .record_queue_stage(Stage::Stored, polled.elapsed());
        }
        let topic = &self.cfg().input_topic;
        for (partition, offset) in sorted.last {
            if let Err(e) = self.shared.consumer.store_offset(topic, partition, offset) {
                // The partition moved to another member: it will redeliver.
                tracing::debug!(target: "chronos::queue", "store offset {partition}/{offset}: {e}");
            }
        }
        true
    }

    /// Validate and sort a batch (invalid messages are logged and skipped).
    fn sort(&self, batch: &mut Vec<Inbound>) -> Sorted {
        let stats = self.stats();
        let mut s = Sorted::default();
        let now_us = clock::unix_us() as i64;
        let advance_us = self.cfg().timing_advance_ms as i64 * 1000;
        let taken = Instant::now();
        for mut m in batch.drain(..) {
            stats.record_queue_stage(Stage::Inbox, taken.saturating_duration_since(m.polled));
            stats.record_queue_stage(Stage::Broker, Duration::from_millis(m.broker_ms));
            s.polled = Some(s.polled.map_or(m.polled, |p| p.min(m.polled)));
            s.charges.push(std::mem::take(&mut m.charge));
            match s.last.iter_mut().find(|(p, _)| *p == m.partition) {
                Some(entry) => entry.1 = entry.1.max(m.offset),
                None => s.last.push((m.partition, m.offset)),
            }
            let (id, deadline_us) = match validate(&m.headers) {
                Ok(v) => v,
                Err(reason) => {
                    ShardStats::add(&stats.queue_skipped_invalid, 1);
                    stats.queue_reject(Reject::InvalidHeader);
                    tracing::warn!(target: "chronos::queue", partition = m.partition, offset = m.offset, "skipping input message: {reason}");
                    continue;
                }
            };
            m.headers
                .retain(|(k, _)| k != HEADER_ID && k != HEADER_DEADLINE);
            if deadline_us - advance_us <= now_us {
                s.late.push((id, m, s.ids.len()));
            } else {
                s.ids.push(id);
                s.deadlines.push(system_time_of(deadline_us));
                s.header_json.push(headers_json(&m.headers));
                s.keys.push(m.key);
                s.values.push(m.value);
            }
        }
        s
    }

    /// Insert the batch's rows; `false` only at shutdown. One statement
    /// carries at most `insert-batch-bytes-max` bytes (or one row), so
    /// that no message to Postgres nears its 1 GB limit. A permanent error
    /// (Postgres refuses the data, or the message) splits the statement's
    /// rows in halves until the row at fault stands alone; it is logged,
    /// counted and skipped, so it costs only itself (at most `2n - 1`
    /// statements for `n` rows). A row kept out by a claimed row with its
    /// ID is held back until that row is gone ([`Self::hold_back`]).
    async fn insert(&self, s: &Sorted) -> bool {
        let started = Instant::now();
        let ranges = byte_ranges(s, self.cfg().insert_batch_bytes_max);
        let refused = |row: usize, e: &str| {
            self.stats().queue_reject(Reject::Unstorable);
            tracing::warn!(target: "chronos::queue", id = ?s.ids[row], "input message rejected: Postgres cannot store it ({e}); skipped");
        };
        let held: RefCell<Vec<usize>> = RefCell::new(Vec::new());
        let attempt = |r: Range<usize>| self.insert_range(s, r, &held);
        let Some(stored) = split_on_refusal(ranges, s.ids.len(), attempt, refused).await else {
            return false;
        };
        let held = held.into_inner();
        if !held.is_empty() && !self.hold_back(s, held).await {
            return false;
        }
        let stats = self.stats();
        stats.record_pg_batch(started.elapsed());
        stats.record_queue_stage(Stage::Insert, started.elapsed());
        ShardStats::add(&stats.queue_enqueued, stored as u64);
        true
    }

    /// One insert over rows `r` of the batch; the rows a claimed row kept
    /// out are added to `held`.
    async fn insert_range(
        &self,
        s: &Sorted,
        r: Range<usize>,
        held: &RefCell<Vec<usize>>,
    ) -> Result<(), QueryError> {
        let rows: Vec<usize> = r.collect();
        let answer = self.insert_rows(s, &rows).await?;
        let mut held = held.borrow_mut();
        for id in kept_out(&answer) {
            // The first row with the ID: the one the statement tried.
            if let Some(&row) = rows.iter().find(|&&i| s.ids[i] == id) {
                held.push(row);
            }
        }
        Ok(())
    }

    /// One insert statement over `rows` of the batch: each ID stored
    /// (`true`) or kept out by a claimed row (`false`), as `pg.rs`'s
    /// `insert_sql` answers.
    async fn insert_rows(
        &self,
        s: &Sorted,
        rows: &[usize],
    ) -> Result<Vec<(String, bool)>, QueryError> {
        assert!(!rows.is_empty(), "an insert has rows");
        let ids: Vec<&str> = rows.iter().map(|&i| s.ids[i].as_str()).collect();
        let deadlines: Vec<SystemTime> = rows.iter().map(|&i| s.deadlines[i]).collect();
        let headers: Vec<&str> = rows.iter().map(|&i| s.header_json[i].as_str()).collect();
        let keys: Vec<Option<&[u8]>> = rows.iter().map(|&i| s.keys[i].as_deref()).collect();
        let values: Vec<Option<&[u8]>> = rows.iter().map(|&i| s.values[i].as_deref()).collect();
        let look_ahead_ms = i64::try_from(self.cfg().look_ahead_ms).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 6] =
            [&ids, &deadlines, &headers, &keys, &values, &look_ahead_ms];
        let answer = query_input(&self.pg, |c| &c.insert, &params).await?;
        Ok(answer
            .iter()
            .filter_map(|r| Some((r.try_get::<_, String>(0).ok()?, r.try_get(1).ok()?)))
            .collect())
    }

    /// Rows kept out by a claimed row with their ID (ready, or published
    /// with its delete on the way): tried again every poll interval until
    /// each is stored, that is until the claimed row is gone. Meanwhile the
    /// batch's offsets are not stored and the shard takes no more input,
    /// which lasts about the look-ahead (a claimed row is due within it),
    /// or a takeover's time if its holder died. A row whose ID then belongs
    /// to a row waiting further out (a takeover reset the claimed one, or
    /// another message with the ID was stored meanwhile) stays held for at
    /// most `hold-time-ms` more, enough for a reset row to be claimed again
    /// and published; past that it is a duplicate of a waiting message and
    /// ignored, as seed 004 says, so that no shard waits out a far
    /// deadline. `false` only at shutdown.
    async fn hold_back(&self, s: &Sorted, mut rows: Vec<usize>) -> bool {
        rows.sort_unstable();
        rows.dedup();
        let first = &s.ids[rows[0]];
        tracing::info!(target: "chronos::queue", "{} input message(s) (the first {first:?}) wait: a message with the same ID is claimed, ready or published with its delete on the way; each is stored once that row is gone", rows.len());
        // Per held row: since when its ID is neither stored nor claimed.
        let mut unclaimed: Vec<Option<Instant>> = vec![None; rows.len()];
        let grace = Duration::from_millis(self.cfg().hold_time_ms);
        while !rows.is_empty() {
            self.pause(self.cfg().poll_interval_ms).await;
            if self.gate.is_closing() {
                return false;
            }
            let answer = match self.insert_rows(s, &rows).await {
                Ok(answer) => answer,
                Err(QueryError::Shutdown) => return false,
                Err(QueryError::Permanent(e)) => {
                    self.refuse_held(s, &rows, &e);
                    return true;
                }
            };
            let still = kept_out(&answer);
            let stored = |id: &str| answer.iter().any(|(i, ok)| *ok && i == id);
            let now = Instant::now();
            let mut keep = Vec::with_capacity(rows.len());
            for (&i, since) in rows.iter().zip(unclaimed.iter_mut()) {
                let id = s.ids[i].as_str();
                if still.contains(&id) {
                    *since = None;
                } else if !stored(id) && since.get_or_insert(now).elapsed() < grace {
                    // Waiting further out: kept a while (see above).
                } else {
                    continue;
                }
                keep.push((i, *since));
            }
            (rows, unclaimed) = keep.into_iter().unzip();
        }
        true
    }

    /// Held rows Postgres now refuses (stored once already in this batch's
    /// statement: not expected): counted and skipped, never spun on.
    fn refuse_held(&self, s: &Sorted, rows: &[usize], e: &str) {
        for &i in rows {
            self.stats().queue_reject(Reject::Unstorable);
            tracing::warn!(target: "chronos::queue", id = ?s.ids[i], "input message rejected: Postgres cannot store it ({e}); skipped");
        }
    }

    /// Which of `ids` already wait in the table; `None` only at shutdown.
    /// An ID Postgres cannot even compare (split out as in `insert`) cannot
    /// be in the table either.
    async fn waiting(&self, ids: &[&str]) -> Option<Vec<String>> {
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(64);
        ranges.push(0..ids.len());
        let mut waiting = Vec::new();
        while let Some(r) = ranges.pop() {
            let part = &ids[r.clone()];
            match query_input(&self.pg, |c| &c.exists, &[&part]).await {
                Ok(rows) => waiting.extend(rows.iter().map(|row| row.get::<_, String>(0))),
                Err(QueryError::Shutdown) => return None,
                Err(QueryError::Permanent(_)) if r.len() == 1 => {}
                Err(QueryError::Permanent(_)) => push_halves(&mut ranges, r),
            }
        }
        Some(waiting)
    }

    /// Seed 004: hand the batch's late messages to the producer, unless
    /// the ID already waits in the table or an earlier message of the
    /// batch stores it. Late ones with the same ID are each published, in
    /// order, as in separate batches.
    /// `None` only at shutdown; else what [`Self::acknowledged`] awaits.
    async fn publish_late(self: &Rc<Self>, s: &mut Sorted) -> Option<Rc<Batch>> {
        let wait = Rc::new(Batch {
            left: Cell::new(0),
            done: Notify::default(),
        });
        if s.late.is_empty() {
            return Some(wait);
        }
        let late = std::mem::take(&mut s.late);
        let late_ids: Vec<&str> = late.iter().map(|(id, _, _)| id.as_str()).collect();
        let waiting: HashSet<String> = self.waiting(&late_ids).await?.into_iter().collect();
        let mut first_stored: HashMap<&str, usize> = HashMap::with_capacity(s.ids.len());
        for (i, id) in s.ids.iter().enumerate() {
            first_stored.entry(id.as_str()).or_insert(i);
        }
        for (id, m, stored_before) in late {
            let stored_earlier = first_stored
                .get(id.as_str())
                .is_some_and(|&i| i < stored_before);
            if waiting.contains(&id) || stored_earlier {
                continue;
            }
            ShardStats::add(&self.stats().queue_late, 1);
            wait.left.set(wait.left.get() + 1);
            self.publish(Pending {
                kind: Kind::Immediate {
                    wait: wait.clone(),
                    id,
                },
                key: m.key,
                value: m.value,
                headers: m.headers,
                attempts: 0,
                alone: false,
                sent: Instant::now(),
            });
        }
        Some(wait)
    }

    /// Wait until every publish of `wait` was acknowledged (or refused for
    /// good, counted and skipped); `false` only at shutdown.
    async fn acknowledged(&self, wait: &Batch) -> bool {
        while wait.left.get() > 0 {
            if self.gate.is_closing() {
                return false;
            }
            futures_lite::future::or(wait.done.wait(), self.gate.closing()).await;
        }
        true
    }
}

/// The IDs an insert kept out for a claimed row (or one about to be) and
/// did not store: the same ID may come back as both when the old row's
/// delete committed while the statement waited for it; stored wins.
fn kept_out(answer: &[(String, bool)]) -> Vec<&str> {
    let stored = |id: &str| answer.iter().any(|(i, s)| *s && i == id);
    answer
        .iter()
        .filter(|(id, s)| !s && !stored(id))
        .map(|(id, _)| id.as_str())
        .collect()
}

/// The bytes a message brings: key, value, header names and values.
fn inbound_bytes(m: &Inbound) -> usize {
    let headers: usize = m
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    m.key.as_ref().map_or(0, Vec::len) + m.value.as_ref().map_or(0, Vec::len) + headers
}

/// The rows of `s` as consecutive ranges of at most `bytes_max` bytes each
/// (a larger row alone), as a stack: the first range on top.
fn byte_ranges(s: &Sorted, bytes_max: usize) -> Vec<Range<usize>> {
    let row_bytes = |i: usize| {
        s.ids[i].len()
            + s.header_json[i].len()
            + s.keys[i].as_ref().map_or(0, Vec::len)
            + s.values[i].as_ref().map_or(0, Vec::len)
    };
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for i in 0..s.ids.len() {
        let b = row_bytes(i);
        if i > start && bytes.saturating_add(b) > bytes_max {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(b);
    }
    if start < s.ids.len() {
        ranges.push(start..s.ids.len());
    }
    ranges.reverse();
    ranges
}

/// Run `attempt` over each range of `ranges` (a stack, over `rows` rows):
/// a permanent error splits the range in halves until the row at fault
/// stands alone, which is given to `refused` and skipped (at most `2n - 1`
/// attempts for `n` rows). The rows stored; `None` only at shutdown.
async fn split_on_refusal<F, Fut>(
    mut ranges: Vec<Range<usize>>,
    rows: usize,
    mut attempt: F,
    mut refused: impl FnMut(usize, &str),
) -> Option<usize>
where
    F: FnMut(Range<usize>) -> Fut,
    Fut: std::future::Future<Output = Result<(), QueryError>>,
{
    let mut stored = 0usize;
    while let Some(r) = ranges.pop() {
        assert!(
            !r.is_empty() && r.end <= rows,
            "a split keeps non-empty ranges within the batch"
        );
        match attempt(r.clone()).await {
            Ok(()) => stored += r.len(),
            Err(QueryError::Shutdown) => return None,
            Err(QueryError::Permanent(e)) if r.len() == 1 => refused(r.start, &e),
            Err(QueryError::Permanent(_)) => push_halves(&mut ranges, r),
        }
    }
    Some(stored)
}

/// Retry a refused range as its two halves, first half first (`ranges` is
/// a stack). A refused single row is never split: the callers handle it.
fn push_halves(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    assert!(r.len() >= 2, "a single row is not split");
    let mid = r.start + r.len() / 2;
    ranges.push(mid..r.end);
    ranges.push(r.start..mid);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(values: &[usize]) -> Sorted {
        let mut s = Sorted::default();
        for (i, &n) in values.iter().enumerate() {
            s.ids.push(format!("{i}"));
            s.deadlines.push(SystemTime::UNIX_EPOCH);
            s.header_json.push(String::new());
            s.keys.push(None);
            s.values.push(Some(vec![0; n]));
        }
        s
    }

    /// Test gap (a): the split that a message Postgres refuses (`08P01`
    /// over 1 GB, or bad data) sets off, with the refusal injected: each
    /// range holding a bad row is refused until the bad row stands alone;
    /// every other row is stored, in order, with at most `2n - 1`
    /// attempts; shutdown stops it.
    #[test]
    fn a_refused_range_is_split_until_the_row_at_fault_stands_alone() {
        let bad = [3usize, 4, 11];
        let mut tried: Vec<Range<usize>> = Vec::new();
        let mut stored_rows: Vec<usize> = Vec::new();
        let mut skipped: Vec<usize> = Vec::new();
        let attempt = |r: Range<usize>| {
            tried.push(r.clone());
            let refuse = bad.iter().any(|b| r.contains(b));
            if !refuse {
                stored_rows.extend(r);
            }
            std::future::ready(if refuse {
                Err(QueryError::Permanent("08P01: invalid message".into()))
            } else {
                Ok(())
            })
        };
        let ranges = vec![8..16, 0..8];
        let got =
            futures_lite::future::block_on(split_on_refusal(ranges, 16, attempt, |row, e| {
                assert!(e.starts_with("08P01"));
                skipped.push(row);
            }));
        assert_eq!(got, Some(13));
        assert_eq!(skipped, bad);
        let expected: Vec<usize> = (0..16).filter(|i| !bad.contains(i)).collect();
        assert_eq!(stored_rows, expected, "stored in order, each once");
        assert!(tried.len() < 2 * 16, "{} attempts", tried.len());
        let shutdown = |_| std::future::ready(Err(QueryError::Shutdown));
        let ranges = vec![2..4, 0..2];
        let got = futures_lite::future::block_on(split_on_refusal(ranges, 4, shutdown, |_, _| {}));
        assert_eq!(got, None);
    }

    /// Issue 39's second review: an ID reported both stored and kept out
    /// (the old row's delete committed while the insert waited) is stored;
    /// one reported neither is no longer held.
    #[test]
    fn kept_out_ids_are_the_claimed_ones_not_stored() {
        let answer = vec![
            ("a".to_string(), true),
            ("a".to_string(), false),
            ("b".to_string(), false),
            ("c".to_string(), true),
        ];
        assert_eq!(kept_out(&answer), ["b"]);
        assert!(kept_out(&[]).is_empty());
    }

    /// Consecutive ranges of at most the bound (a larger row alone), the
    /// first on top of the stack.
    #[test]
    fn byte_ranges_split_by_bytes() {
        // Each row is its value plus a one-byte ID.
        let s = sorted(&[9, 9, 9, 29, 9, 0]);
        let mut got = byte_ranges(&s, 20);
        got.reverse();
        assert_eq!(got, vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(byte_ranges(&s, usize::MAX), vec![0..6]);
        assert_eq!(byte_ranges(&sorted(&[5]), 1), vec![0..1]);
    }
}

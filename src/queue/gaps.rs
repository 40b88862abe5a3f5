//! The consumer thread's gap guard: after a partition is assigned,
//! resumed or sought, its first record is checked against the offset it
//! should start from before anything is handed over.
//!
//! A Kafka broker answers a fetch from an offset inside a record batch with
//! that whole batch (librdkafka skips the records before the offset).
//! tansu 0.6 (memory storage) answers with the batches that *start* at or
//! after the offset, so a consumer that fetches from inside a batch never
//! sees the rest of it, and once it stores a later offset the skipped
//! messages are committed past: lost. librdkafka fetches from inside a
//! batch whenever it resumes a paused partition (the consumer thread
//! pauses a partition when its shard stayed full for `pause-after-ms`)
//! and whenever it starts from a committed offset (an assignment). At
//! 50 k messages/s the node lost 264 of 500,000 so (perf/README, "Issue
//! 22: the delay queue at 50 k/s"). Between those points librdkafka
//! fetches from where the last whole batch ended, which any broker answers
//! contiguously, so a record there is let through unchecked (a gap there
//! is genuine: a transaction's commit marker, compaction), and the guard
//! costs nothing per record.
//!
//! So, per partition, the guard knows the next offset it expects: after
//! an assignment, the group's committed offset (looked up once for all
//! the assigned partitions); after a resume, the offset after the highest
//! one it let through. The first record past it is held back (dropped, to
//! be fetched again) and the partition is sought back to just before the
//! expected offset, then twice as far back each time the broker again
//! answers past it, until a record at or before the expected one comes:
//! from there the broker's answer is contiguous, the records before the
//! expected offset (already handed over) are dropped and the rest flow.
//! When even the beginning of the partition answers past it, the records
//! in between do not exist (compaction, retention) and the jump is let
//! through. A partition silent for [`SILENCE`] after its assignment,
//! resume or seek is sought back the same way: the rest of the batch it
//! started in is never returned (a partition assigned or resumed inside
//! its last batch would otherwise wait for new input). Given up at the
//! beginning, the partition still drops records before the expected
//! offset.
//!
//! The guard never lets a record through on a guess (issue 39): while the
//! committed offsets of an assignment cannot be had ([`Gaps::assigned_unknown`])
//! or a seek back has failed ([`Gaps::seek_failed`]), every record of the
//! partition is dropped and the consumer thread holds the partition paused
//! ([`Gaps::holds`]), retrying the look-up or the seek; no offset is
//! stored past a gap that was not resolved. Against a Kafka broker the guard costs one batched look-up of
//! the committed offsets per assignment, and one short fetch (the batch
//! before the expected offset, dropped) per partition that is assigned or
//! resumed and then stays silent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a partition may stay silent after a resume or a seek back
/// before the guard seeks (further) back.
pub const SILENCE: Duration = Duration::from_millis(500);

/// Seeks back for one gap, at most (2^40 records back: the beginning of
/// any partition).
const SEEK_STEPS_MAX: u32 = 40;

/// What to do with a polled message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it over as usual.
    Accept,
    /// Drop it: it was handed over before, or it will be fetched again.
    Drop,
    /// Drop it and seek its partition to this offset; if the seek fails,
    /// call [`Gaps::seek_failed`] (the partition is held until a seek
    /// succeeds).
    Seek(i64),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Normal,
    /// Assigned, or resumed after a pause (at `since`): `target` should
    /// come first.
    Awaiting { target: i64, since: Instant },
    /// Sought back to `from` (at `since`), for `target`, the `steps`th time.
    Seeking {
        target: i64,
        from: i64,
        steps: u32,
        since: Instant,
    },
    /// The broker answers contiguously from before `target`: drop until it.
    Skipping { target: i64 },
    /// Assigned, but the group's committed offset could not be had: drop
    /// everything (the partition is held paused) until the look-up
    /// succeeds ([`Gaps::assigned`] then).
    Unknown,
    /// The seek back to `from` failed (at `since`): drop everything (the
    /// partition is held paused); the seek is tried again after
    /// [`SILENCE`] ([`Gaps::silent`]).
    Held {
        target: i64,
        from: i64,
        steps: u32,
        since: Instant,
    },
}

#[derive(Default)]
struct Part {
    /// The offset after the highest one let through.
    next: Option<i64>,
    state: State,
}

/// Per partition: the expected offset and the guard's state.
#[derive(Default)]
pub struct Gaps {
    parts: HashMap<i32, Part>,
}

impl Gaps {
    /// The verdict on a message at `offset` of `partition`.
    pub fn check(&mut self, partition: i32, offset: i64, now: Instant) -> Verdict {
        let part = self.parts.entry(partition).or_default();
        match part.state {
            // Between check points the broker's answer is contiguous.
            State::Normal => part.accept(offset),
            State::Awaiting { target, .. } if offset <= target => part.accept(offset),
            State::Awaiting { target, .. } => part.start_seek(target, now),
            State::Seeking {
                target,
                from,
                steps,
                ..
            } => part.seeking(offset, (target, from, steps), now),
            State::Skipping { target } => part.skipping(offset, target),
            State::Unknown | State::Held { .. } => Verdict::Drop,
        }
    }

    /// `partition` was assigned, and the group's committed offset could not
    /// be had: nothing is let through until [`Gaps::assigned`] (or
    /// [`Gaps::assigned_paused`]) tells it.
    pub fn assigned_unknown(&mut self, partition: i32) {
        let part = Part {
            next: None,
            state: State::Unknown,
        };
        self.parts.insert(partition, part);
    }

    /// The partitions whose committed offset is still to be looked up.
    pub fn unknown(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .parts
            .iter()
            .filter(|(_, p)| p.state == State::Unknown)
            .map(|(&partition, _)| partition)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether `partition` must stay paused: its committed offset is not
    /// known, or its last seek back failed.
    pub fn holds(&self, partition: i32) -> bool {
        self.parts
            .get(&partition)
            .is_some_and(|p| matches!(p.state, State::Unknown | State::Held { .. }))
    }

    /// The seek back of `partition` failed at `now`: everything is dropped
    /// and the same seek is tried again after [`SILENCE`]; never let
    /// through on a guess (the records between would be committed past).
    pub fn seek_failed(&mut self, partition: i32, now: Instant) {
        let Some(part) = self.parts.get_mut(&partition) else {
            return;
        };
        if let State::Seeking {
            target,
            from,
            steps,
            ..
        } = part.state
        {
            part.state = State::Held {
                target,
                from,
                steps,
                since: now,
            };
        }
    }

    /// `partition` was assigned to this node at `now`, to start from the
    /// group's `committed` offset (`None`: none, or it could not be had;
    /// the first record is then let through). Whatever was known of it
    /// from an earlier assignment is forgotten.
    pub fn assigned(&mut self, partition: i32, committed: Option<i64>, now: Instant) {
        let part = match committed {
            Some(target) if target >= 0 => Part {
                next: Some(target),
                state: State::Awaiting { target, since: now },
            },
            _ => Part::default(),
        };
        self.parts.insert(partition, part);
    }

    /// `partition` was assigned to this node while the node holds it
    /// paused (librdkafka keeps an application's pause across a revoke
    /// and an assignment): nothing comes until the resume, so its silence
    /// is not counted (it was sought back to offset 0 so, step by step);
    /// [`Gaps::resumed`] arms the check at the `committed` offset.
    pub fn assigned_paused(&mut self, partition: i32, committed: Option<i64>) {
        let part = Part {
            next: committed.filter(|&c| c >= 0),
            state: State::Normal,
        };
        self.parts.insert(partition, part);
    }

    /// `partition` is no longer this node's.
    pub fn revoked(&mut self, partition: i32) {
        self.parts.remove(&partition);
    }

    /// `partition` was resumed at `now`: what it let through last should
    /// be followed by its next offset.
    pub fn resumed(&mut self, partition: i32, now: Instant) {
        if let Some(part) = self.parts.get_mut(&partition) {
            if let (State::Normal, Some(target)) = (part.state, part.next) {
                part.state = State::Awaiting { target, since: now };
            }
        }
    }

    /// The partitions silent for [`SILENCE`] since an assignment, a
    /// resume or a seek back, each with the offset to seek (further) back
    /// to; one given up on (sought back to the beginning) is let be. Also
    /// the partitions held after a failed seek, to seek again.
    pub fn silent(&mut self, now: Instant) -> Vec<(i32, i64)> {
        let mut seeks = Vec::new();
        for (&partition, part) in self.parts.iter_mut() {
            let verdict = match part.state {
                State::Awaiting { target, since }
                    if now.saturating_duration_since(since) >= SILENCE =>
                {
                    part.start_seek(target, now)
                }
                State::Seeking {
                    target,
                    from,
                    steps,
                    since,
                } if now.saturating_duration_since(since) >= SILENCE => part
                    .seek_further((target, from, steps), now)
                    .unwrap_or_else(|| {
                        // Given up (sought back to the beginning): what
                        // comes is still dropped up to the expected
                        // offset, never handed over again (it went back to
                        // letting everything through, and an answer from
                        // offset 0 then replayed the whole partition).
                        part.state = State::Skipping { target };
                        Verdict::Accept
                    }),
                State::Held {
                    target,
                    from,
                    steps,
                    since,
                } if now.saturating_duration_since(since) >= SILENCE => {
                    // The same seek again (a failed seek learnt nothing).
                    part.state = State::Seeking {
                        target,
                        from,
                        steps,
                        since: now,
                    };
                    Verdict::Seek(from)
                }
                _ => continue,
            };
            if let Verdict::Seek(from) = verdict {
                seeks.push((partition, from));
            }
        }
        seeks
    }

    /// Forget every partition (the consumer dropped messages it had let
    /// through: they must be let through again when fetched again).
    pub fn reset(&mut self) {
        self.parts.clear();
    }

    /// Whether `partition` is being recovered (messages held back).
    #[cfg(test)]
    pub fn recovering(&self, partition: i32) -> bool {
        self.parts
            .get(&partition)
            .is_some_and(|p| p.state != State::Normal)
    }
}

impl Part {
    fn accept(&mut self, offset: i64) -> Verdict {
        self.state = State::Normal;
        let after = offset.saturating_add(1);
        self.next = Some(self.next.map_or(after, |n| n.max(after)));
        Verdict::Accept
    }

    /// Seek back to just before `target`.
    fn start_seek(&mut self, target: i64, now: Instant) -> Verdict {
        let from = target.saturating_sub(1).max(0);
        self.state = State::Seeking {
            target,
            from,
            steps: 1,
            since: now,
        };
        Verdict::Seek(from)
    }

    /// Seek twice as far back as last time; `None` once the beginning
    /// (or the step bound) was reached: nothing in between can be had.
    fn seek_further(
        &mut self,
        (target, from, steps): (i64, i64, u32),
        now: Instant,
    ) -> Option<Verdict> {
        if from == 0 || steps >= SEEK_STEPS_MAX {
            return None;
        }
        let back = (target - from).saturating_mul(2);
        let from = target.saturating_sub(back).max(0);
        self.state = State::Seeking {
            target,
            from,
            steps: steps + 1,
            since: now,
        };
        Some(Verdict::Seek(from))
    }

    fn seeking(&mut self, offset: i64, sought: (i64, i64, u32), now: Instant) -> Verdict {
        let target = sought.0;
        if offset < target {
            // At or before the expected record: contiguous from here.
            self.state = State::Skipping { target };
            return Verdict::Drop;
        }
        if offset == target {
            return self.accept(offset);
        }
        // Past it again: further back, or (nothing in between exists) let
        // the jump through.
        match self.seek_further(sought, now) {
            Some(v) => v,
            None => self.accept(offset),
        }
    }

    fn skipping(&mut self, offset: i64, target: i64) -> Verdict {
        if offset < target {
            Verdict::Drop
        } else {
            self.accept(offset)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(g: &mut Gaps, offsets: &[i64]) -> Vec<Verdict> {
        let now = Instant::now();
        offsets.iter().map(|&o| g.check(0, o, now)).collect()
    }

    use Verdict::{Accept as A, Drop as D, Seek as S};

    /// Between check points everything flows: duplicates (a fetch again
    /// after a failure) and gaps (commit markers, compaction) alike.
    #[test]
    fn offsets_flow_unchecked_between_check_points() {
        let mut g = Gaps::default();
        assert_eq!(run(&mut g, &[5, 6, 7, 3, 4, 5, 6, 7, 8]), [A; 9]);
        assert_eq!(run(&mut g, &[10, 20, 21]), [A, A, A]);
        assert!(!g.recovering(0));
    }

    /// tansu: resumed at 10, a fetch from 10 (inside the batch 8..=14)
    /// returns 15 first; from 9 also 15; from 8, the batch itself.
    #[test]
    fn a_skipped_batch_tail_is_fetched_again_and_the_rest_flows() {
        let mut g = Gaps::default();
        assert_eq!(run(&mut g, &[7, 8, 9]), [A, A, A]);
        g.resumed(0, Instant::now());
        assert_eq!(run(&mut g, &[15]), [S(9)]);
        assert!(g.recovering(0));
        assert_eq!(run(&mut g, &[15]), [S(8)]);
        let again = run(&mut g, &[8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(again, [D, D, A, A, A, A, A, A, A]);
        assert!(!g.recovering(0));
    }

    /// Kafka with records 10..=14 compacted away, resumed at 10: the fetch
    /// from 9 answers 9 then 15, and 15 is let through.
    #[test]
    fn a_genuine_gap_after_a_resume_costs_one_fetch() {
        let mut g = Gaps::default();
        assert_eq!(run(&mut g, &[8, 9]), [A, A]);
        g.resumed(0, Instant::now());
        assert_eq!(run(&mut g, &[15]), [S(9)]);
        assert_eq!(run(&mut g, &[9, 15, 16]), [D, A, A]);
    }

    /// Nothing before 15 exists any more: the seeks reach the beginning
    /// and the jump is let through.
    #[test]
    fn a_gap_back_to_the_beginning_is_let_through() {
        let mut g = Gaps::default();
        assert_eq!(run(&mut g, &[9]), [A]);
        g.resumed(0, Instant::now());
        assert_eq!(run(&mut g, &[15]), [S(9)]);
        assert_eq!(run(&mut g, &[15, 15, 15, 15]), [S(8), S(6), S(2), S(0)]);
        assert_eq!(run(&mut g, &[15, 16]), [A, A]);
    }

    #[test]
    fn the_first_record_after_an_assignment_is_checked_against_the_committed_offset() {
        let mut g = Gaps::default();
        let now = Instant::now();
        g.assigned(0, Some(100), now);
        assert_eq!(run(&mut g, &[150]), [S(99)]);
        assert_eq!(run(&mut g, &[120, 99, 100, 101]), [S(98), D, A, A]);
        g.assigned(0, None, now);
        assert_eq!(run(&mut g, &[150, 151]), [A, A], "nothing committed");
        g.assigned(0, Some(100), now);
        assert_eq!(run(&mut g, &[100, 101]), [A, A]);
    }

    /// Taken back after another member consumed and committed up to 40:
    /// 40 is expected, not what this node let through before.
    #[test]
    fn a_new_assignment_replaces_what_was_known() {
        let mut g = Gaps::default();
        let now = Instant::now();
        g.assigned(0, Some(5), now);
        assert_eq!(run(&mut g, &[5, 6, 7, 8, 9]), [A; 5]);
        g.revoked(0);
        assert!(!g.recovering(0));
        g.assigned(0, Some(40), now);
        assert_eq!(run(&mut g, &[40, 41]), [A, A]);
        g.assigned(0, Some(45), now);
        assert_eq!(run(&mut g, &[50]), [S(44)]);
        g.revoked(0);
        assert_eq!(run(&mut g, &[50]), [A], "forgotten");
    }

    /// Given back while paused (an eager rebalance while its shard was
    /// full): silent for as long as the pause lasts, and not sought; the
    /// resume arms the check at the committed offset.
    #[test]
    fn a_partition_assigned_while_paused_waits_for_its_resume() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        g.assigned_paused(0, Some(2000));
        assert!(g.silent(t0 + SILENCE * 20).is_empty());
        assert!(!g.recovering(0));
        let t1 = t0 + SILENCE * 20;
        g.resumed(0, t1);
        assert!(g.recovering(0));
        assert_eq!(g.silent(t1 + SILENCE), [(0, 1999)]);
        let mut g = Gaps::default();
        g.assigned_paused(0, None);
        g.resumed(0, t0);
        assert!(!g.recovering(0), "nothing committed: nothing to check");
        assert_eq!(run(&mut g, &[7]), [A]);
    }

    /// Issue 39: a failed seek back never lets the record through (the
    /// records between would be committed past): everything is dropped
    /// and the partition held until the same seek, tried again, succeeds.
    #[test]
    fn a_failed_seek_holds_the_partition_until_a_seek_succeeds() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        assert_eq!(run(&mut g, &[9]), [A]);
        g.resumed(0, t0);
        assert_eq!(g.check(0, 15, t0), S(9));
        g.seek_failed(0, t0);
        assert!(g.holds(0));
        assert_eq!(run(&mut g, &[15, 16, 17]), [D, D, D]);
        assert!(g.silent(t0 + SILENCE / 2).is_empty());
        assert_eq!(g.silent(t0 + SILENCE), [(0, 9)], "the same seek again");
        assert!(!g.holds(0));
        g.seek_failed(0, t0 + SILENCE);
        assert_eq!(g.silent(t0 + SILENCE * 2), [(0, 9)]);
        // It worked: the broker answers from before the expected offset.
        assert_eq!(run(&mut g, &[9, 10, 11]), [D, A, A]);
        assert!(!g.recovering(0) && !g.holds(0));
        g.assigned(0, Some(40), t0);
        g.reset();
        assert_eq!(run(&mut g, &[3, 4]), [A, A]);
    }

    /// Issue 39: an assignment whose committed offset could not be had
    /// lets nothing through until the look-up succeeds; then the check
    /// runs against the offset found.
    #[test]
    fn an_unknown_committed_offset_holds_the_partition_until_it_is_known() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        g.assigned_unknown(0);
        g.assigned_unknown(3);
        assert!(g.holds(0) && g.holds(3));
        assert_eq!(g.unknown(), [0, 3]);
        assert_eq!(run(&mut g, &[100, 101]), [D, D]);
        assert!(g.silent(t0 + SILENCE * 10).is_empty(), "not silence");
        g.assigned(0, Some(100), t0);
        assert!(!g.holds(0));
        assert_eq!(g.unknown(), [3]);
        assert_eq!(run(&mut g, &[102]), [S(99)], "dropped ones fetched again");
        assert_eq!(run(&mut g, &[99, 100, 101]), [D, A, A]);
        g.assigned_paused(3, Some(7));
        assert!(!g.holds(3) && g.unknown().is_empty());
    }

    #[test]
    fn partitions_are_independent() {
        let mut g = Gaps::default();
        let now = Instant::now();
        assert_eq!(g.check(0, 9, now), A);
        assert_eq!(g.check(1, 100, now), A);
        g.resumed(0, now);
        g.resumed(1, now);
        assert_eq!(g.check(0, 15, now), S(9));
        assert_eq!(g.check(1, 101, now), A);
        assert!(g.recovering(0) && !g.recovering(1));
    }

    /// tansu: assigned or resumed at 10, inside the batch 4..=12, the last
    /// one: nothing comes; silent, the guard seeks back 9, 8, 6, 2, and
    /// the batch comes.
    #[test]
    fn a_partition_silent_after_its_assignment_or_resume_is_sought_back() {
        let t0 = Instant::now();
        let assigned = |g: &mut Gaps| g.assigned(0, Some(10), t0);
        let resumed = |g: &mut Gaps| {
            assert_eq!(run(g, &[8, 9]), [A, A]);
            g.resumed(0, t0);
        };
        let starts: [&dyn Fn(&mut Gaps); 2] = [&assigned, &resumed];
        for start in starts {
            let mut g = Gaps::default();
            start(&mut g);
            assert!(g.silent(t0 + SILENCE / 2).is_empty());
            let mut at = t0;
            for from in [9, 8, 6, 2] {
                at += SILENCE;
                assert_eq!(g.silent(at), [(0, from)]);
            }
            assert_eq!(g.check(0, 4, at), D);
            assert_eq!(run(&mut g, &[9, 10, 11, 12]), [D, A, A, A]);
            assert!(g.silent(at + SILENCE * 10).is_empty(), "recovered");
        }
    }

    /// Kafka: a resumed partition's next record comes (or, silent, the
    /// one seek back answers at once).
    #[test]
    fn a_resumed_partition_that_answers_costs_nothing() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        assert_eq!(run(&mut g, &[8, 9]), [A, A]);
        g.resumed(0, t0);
        assert_eq!(g.check(0, 10, t0), A);
        assert!(g.silent(t0 + SILENCE * 2).is_empty());
        g.resumed(0, t0);
        assert_eq!(g.silent(t0 + SILENCE), [(0, 10)]);
        assert_eq!(run(&mut g, &[10]), [D]);
        assert!(g.silent(t0 + SILENCE * 4).is_empty(), "skipping: no timer");
        assert_eq!(run(&mut g, &[11, 12]), [A, A]);
    }

    /// Sought back to the beginning without an answer: let be.
    #[test]
    fn silence_down_to_the_beginning_is_given_up() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        assert_eq!(run(&mut g, &[0, 1]), [A, A]);
        g.resumed(0, t0);
        assert_eq!(g.silent(t0 + SILENCE), [(0, 1)]);
        assert_eq!(g.silent(t0 + SILENCE * 2), [(0, 0)]);
        assert!(g.silent(t0 + SILENCE * 3).is_empty());
        // Still dropping what was handed over, until the expected offset.
        assert_eq!(run(&mut g, &[1, 2]), [D, A]);
        assert!(!g.recovering(0));
    }

    /// Given up after seeking back to the beginning (every answer slower
    /// than the silence bound), the answer from 0 then arrives: what was
    /// handed over before the expected offset is dropped, not replayed.
    #[test]
    fn after_giving_up_an_answer_from_the_beginning_is_not_replayed() {
        let mut g = Gaps::default();
        let t0 = Instant::now();
        assert_eq!(run(&mut g, &[6, 7]), [A, A]);
        g.resumed(0, t0);
        let mut at = t0;
        for from in [7, 6, 4, 0] {
            at += Duration::from_secs(10);
            assert_eq!(g.silent(at), [(0, from)]);
        }
        assert!(g.silent(at + Duration::from_secs(10)).is_empty());
        let replay = run(&mut g, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(replay, [D, D, D, D, D, D, D, D, A]);
    }
}

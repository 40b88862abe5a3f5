//! The segments a peer's queue is kept in: contiguous runs of encoded
//! requests, oldest first, each with its messages' places and what the
//! sender needs to know of them; a batch goes out as one segment.

use super::body::{write_delta, DELTA_WIDTH};
use crate::cluster::acks::Ticket;

/// One queued request's place in its segment and what the sender needs
/// to know of it when it goes out.
#[derive(Clone, Copy, Debug)]
pub(super) struct Message {
    /// Where the request ends in the segment's bytes.
    pub(super) end: u32,
    /// Where its `start-time-delta` value starts (relative to the
    /// request's first byte), rewritten at each send.
    pub(super) delta_at: u32,
    /// The timer's start, engine-clock ms (the delta is counted from it).
    pub(super) start_ms: u64,
    /// The acknowledgement a client operation waits for (0: none).
    pub(super) ticket: Ticket,
    /// A tombstone's timer (unique part) owed to a member
    /// ([`Owed`](crate::cluster::owed::Owed); 0: not a tombstone, or to
    /// another site).
    pub(super) owed: u64,
    /// Engine-clock ms since when the peer has answered it, at every try,
    /// with a status worth retrying (5xx, 408, 429), counted from a try
    /// where it took others: it is alive and refuses this message (0: not
    /// refusing; a try left unanswered resets it).
    pub(super) refused_since_ms: u64,
    /// Engine-clock ms it was first queued: past `deliver_within` a
    /// message to another site is given up, never sent (a tombstone may
    /// no longer stop it); one to a member is reported late.
    pub(super) born_ms: u64,
}

/// One contiguous run of encoded requests, oldest first.
pub(super) struct Segment {
    pub(super) bytes: Vec<u8>,
    /// One per request, in order (at most `BATCH_MAX`).
    pub(super) messages: Vec<Message>,
}

impl Segment {
    pub(super) fn count(&self) -> usize {
        self.messages.len()
    }

    /// Where request `i` starts in `bytes`.
    pub(super) fn start_of(&self, i: usize) -> usize {
        assert!(i < self.count(), "an index within the segment");
        if i == 0 {
            0
        } else {
            self.messages[i - 1].end as usize
        }
    }

    /// Request `i`'s bytes.
    pub(super) fn request(&self, i: usize) -> &[u8] {
        &self.bytes[self.start_of(i)..self.messages[i].end as usize]
    }

    /// Drop the first `n` requests (the oldest).
    pub(super) fn drop_front(&mut self, n: usize) {
        assert!(n <= self.count(), "takes no more than the segment holds");
        if n == 0 {
            return;
        }
        let cut = self.messages[n - 1].end;
        self.bytes.drain(..cut as usize);
        self.messages.drain(..n);
        for m in &mut self.messages {
            m.end -= cut;
        }
    }

    /// Rewrite every request's `start-time-delta` as seen from `now_ms`:
    /// a message sent later than it was queued still starts the timer
    /// when it started.
    pub(super) fn restamp(&mut self, now_ms: u64) {
        for i in 0..self.count() {
            let m = self.messages[i];
            let at = self.start_of(i) + m.delta_at as usize;
            let delta_ms = m.start_ms as i64 - now_ms as i64;
            write_delta(&mut self.bytes[at..at + DELTA_WIDTH], delta_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::body::encode_body_patchable;
    use super::super::body::tests::body_with_delta;
    use super::*;

    #[test]
    fn a_segment_restamps_and_drops_its_oldest_messages() {
        let mut seg = Segment {
            bytes: Vec::new(),
            messages: Vec::new(),
        };
        for (i, born_ms) in [100u64, 200, 300].into_iter().enumerate() {
            let before = seg.bytes.len();
            seg.bytes.extend_from_slice(b"HEAD\r\n\r\n");
            let at = encode_body_patchable(&mut seg.bytes, &body_with_delta(0)) - before;
            seg.messages.push(Message {
                end: seg.bytes.len() as u32,
                delta_at: at as u32,
                start_ms: 1_000 + i as u64,
                ticket: 0,
                owed: 0,
                refused_since_ms: 0,
                born_ms,
            });
        }
        seg.drop_front(1);
        assert_eq!(seg.count(), 2);
        assert_eq!(seg.messages[0].born_ms, 200);
        seg.restamp(5_000);
        for i in 0..seg.count() {
            let request = seg.request(i);
            let body = &request[b"HEAD\r\n\r\n".len()..];
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            let want = 1_000 + (i as i64 + 1) - 5_000;
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(want));
        }
    }
}

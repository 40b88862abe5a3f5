//! The replication body: what one replication `PUT` says about a timer,
//! written as the JSON the timer codec reads back, with its
//! `start-time-delta` optionally in a fixed-width field that the sender
//! rewrites in place at each send (`write_delta`).

use crate::timer::extras;
use crate::timer::spec::AttemptState;
use std::io::Write;

/// Bytes the `start-time-delta` value takes in a queued body: an `i64`
/// with its sign, padded with spaces (JSON whitespace) so that the sender
/// can rewrite it in place when the message actually goes out.
pub(super) const DELTA_WIDTH: usize = 20;

/// What one replication message says about a timer.
pub struct Body<'a> {
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Start of the incarnation relative to the sender's now (≤ 0 normally).
    pub start_time_delta_ms: i64,
    pub sequence: u32,
    pub version_us: u64,
    /// Empty URI and opaque: a tombstone.
    pub uri: &'a str,
    pub opaque: &'a str,
    pub view_id: u64,
    /// Empty in a body for another site (GR): that site places it.
    pub replicas: &'a [&'a str],
    /// The timer's site list (GR), first the site that took it.
    pub sites: &'a [&'a str],
    /// The replication factor the client asked for (this project's
    /// extension: `replicas` may be fewer, capped at the cluster size).
    pub factor_requested: u8,
    /// `(tag, count)`.
    pub tags: &'a [(&'a str, u32)],
    /// A resync entry's `start-time` (seed 000: wall-clock ms since the
    /// epoch, modulo `u32::MAX`); replication bodies carry only the delta.
    pub start_time_unix_ms: Option<u64>,
    /// `reliability.only-newer` (this project's extension): the receiver
    /// applies it only over an older version, never by sequence or as a
    /// tombstone at a tie (a re-send after a start, `shard/resend.rs`).
    pub only_newer: bool,
    /// The timer's extensions (`timer::extras`: the delivery policy),
    /// written into `callback`; empty for most timers.
    pub ext: &'a [u8],
    /// `delivery-state`: one pop's attempts (issue 41), when this body
    /// reports them rather than a change of the timer.
    pub attempt: Option<AttemptState>,
}

/// Seconds with millisecond resolution, as the codec reads them.
fn write_seconds(out: &mut Vec<u8>, ms: u32) {
    if ms.is_multiple_of(1000) {
        let _ = write!(out, "{}", ms / 1000);
    } else {
        let _ = write!(out, "{}.{:03}", ms / 1000, ms % 1000);
    }
}

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// The JSON body of a replication `PUT`.
pub fn encode_body(out: &mut Vec<u8>, b: &Body<'_>) {
    encode(out, b, false);
}

/// The JSON body with `start-time-delta` in a fixed-width field; returns
/// where the field's value starts in `out` (see [`write_delta`]).
pub fn encode_body_patchable(out: &mut Vec<u8>, b: &Body<'_>) -> usize {
    encode(out, b, true).expect("a patchable body has the field")
}

/// Write `delta_ms` over the `DELTA_WIDTH` bytes of a patchable field.
pub fn write_delta(field: &mut [u8], delta_ms: i64) {
    assert_eq!(
        field.len(),
        DELTA_WIDTH,
        "the delta field keeps its fixed width"
    );
    let mut text = [b' '; DELTA_WIDTH];
    let mut cursor = std::io::Cursor::new(&mut text[..]);
    write!(cursor, "{delta_ms}").expect("an i64 fits 20 bytes");
    field.copy_from_slice(&text);
}

fn encode(out: &mut Vec<u8>, b: &Body<'_>, patchable: bool) -> Option<usize> {
    out.extend_from_slice(b"{\"timing\":{");
    write_periods(out, b);
    if let Some(ms) = b.start_time_unix_ms {
        let _ = write!(out, ",\"start-time\":{}", ms % u32::MAX as u64);
    }
    out.extend_from_slice(b",\"start-time-delta\":");
    let delta_at = out.len();
    if patchable {
        out.resize(delta_at + DELTA_WIDTH, b' ');
        write_delta(&mut out[delta_at..], b.start_time_delta_ms);
    } else {
        let _ = write!(out, "{}", b.start_time_delta_ms);
    }
    let _ = write!(
        out,
        ",\"sequence-number\":{},\"version\":{}}},\"callback\":",
        b.sequence, b.version_us
    );
    write_callback(out, b);
    let _ = write!(
        out,
        ",\"reliability\":{{\"replication-factor\":{},\"cluster-view-id\":\"{}\"",
        b.factor_requested.max(1),
        b.view_id
    );
    for (key, list) in [("replicas", b.replicas), ("sites", b.sites)] {
        if list.is_empty() {
            continue;
        }
        let _ = write!(out, ",\"{key}\":[");
        for (i, r) in list.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_str(out, r);
        }
        out.push(b']');
    }
    if b.only_newer {
        out.extend_from_slice(b",\"only-newer\":true");
    }
    out.push(b'}');
    if !b.tags.is_empty() {
        out.extend_from_slice(b",\"statistics\":{\"tag-info\":[");
        for (i, (tag, count)) in b.tags.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"type\":");
            write_json_str(out, tag);
            let _ = write!(out, ",\"count\":{count}}}");
        }
        out.extend_from_slice(b"]}");
    }
    if let Some(a) = &b.attempt {
        write_attempt(out, a);
    }
    out.push(b'}');
    patchable.then_some(delta_at)
}

/// The `callback` object: `{}` for a tombstone.
fn write_callback(out: &mut Vec<u8>, b: &Body<'_>) {
    if b.uri.is_empty() {
        out.extend_from_slice(b"{}");
        return;
    }
    out.extend_from_slice(b"{\"http\":{\"uri\":");
    write_json_str(out, b.uri);
    out.extend_from_slice(b",\"opaque\":");
    write_json_str(out, b.opaque);
    out.push(b'}');
    write_delivery(out, b.ext);
    out.push(b'}');
}

/// `,"retry":{...},"dead-letter":{...}` inside `callback`, from the
/// timer's extensions (nothing without a policy).
fn write_delivery(out: &mut Vec<u8>, ext: &[u8]) {
    let Some(d) = extras::delivery(ext) else {
        return;
    };
    out.extend_from_slice(b",\"retry\":");
    d.retry.write_json(out);
    if !d.dead_letter.is_empty() {
        out.extend_from_slice(b",\"dead-letter\":{\"http\":{\"uri\":");
        write_json_str(out, d.dead_letter);
        out.extend_from_slice(b"}}");
    }
}

/// The timing's first keys: `"interval":..,"repeat-for":..` as seed 000
/// has them; with a wall-clock or calendar timing (issue 42, from the
/// timer's extensions) its keys as a client writes them (`at` alone;
/// `start-at` with `interval` and `repeat-for`; `cron`, `time-zone` and
/// `repeat-for`, with the cursor in `cron-cursor-ms`), and
/// `start-unix-ms`: an absolute start, so no receiver counts it from its
/// own clock.
fn write_periods(out: &mut Vec<u8>, b: &Body<'_>) {
    let timing = extras::timing(b.ext);
    match timing.map(|t| t.kind) {
        None | Some(extras::TimingKind::StartAt) => {
            out.extend_from_slice(b"\"interval\":");
            write_seconds(out, b.interval_ms);
            out.extend_from_slice(b",\"repeat-for\":");
            write_seconds(out, b.repeat_for_ms);
        }
        Some(extras::TimingKind::At) => out.extend_from_slice(b"\"repeat-for\":null"),
        Some(extras::TimingKind::Cron) => {
            out.extend_from_slice(b"\"repeat-for\":");
            write_seconds(out, b.repeat_for_ms);
            let _ = write!(out, ",\"cron-cursor-ms\":{}", b.interval_ms);
        }
    }
    let Some(t) = timing else {
        return;
    };
    let key: &[u8] = match t.kind {
        extras::TimingKind::At => b",\"at\":",
        extras::TimingKind::StartAt => b",\"start-at\":",
        extras::TimingKind::Cron => b",\"cron\":",
    };
    out.extend_from_slice(key);
    write_json_str(out, t.text);
    if t.kind == extras::TimingKind::Cron {
        out.extend_from_slice(b",\"time-zone\":");
        write_json_str(out, t.zone);
    }
    let _ = write!(out, ",\"start-unix-ms\":{}", t.start_unix_ms);
}

/// `,"delivery-state":{...}` at the top level.
fn write_attempt(out: &mut Vec<u8>, a: &AttemptState) {
    let _ = write!(
        out,
        ",\"delivery-state\":{{\"sequence\":{},\"attempts\":{},\"first-attempt\":{},\"next-attempt\":{},\"last-outcome\":{},\"done\":{}}}",
        a.sequence, a.attempts, a.first_unix_ms, a.next_unix_ms, a.last_outcome, a.done
    );
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::timer::spec;

    #[test]
    fn bodies_parse_back() {
        let replicas = ["10.0.0.1:7253", "10.0.0.2:7253"];
        let tags = [("CALL", 2u32), ("q\"uote", 1)];
        let body = Body {
            interval_ms: 1500,
            repeat_for_ms: 6000,
            start_time_delta_ms: -250,
            sequence: 3,
            version_us: 1_700_000_000_123_456,
            uri: "http://127.0.0.1:9/cb",
            opaque: "o\"p\\aque\n",
            view_id: 90691053180028962,
            replicas: &replicas,
            sites: &["a", "b"],
            factor_requested: 3,
            tags: &tags,
            start_time_unix_ms: None,
            only_newer: true,
            ext: &[],
            attempt: None,
        };
        let mut out = Vec::new();
        encode_body(&mut out, &body);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert_eq!((s.interval_ms, s.repeat_for_ms), (1500, 6000));
        assert_eq!(
            s.replication_factor,
            Some(3),
            "the requested factor travels"
        );
        assert_eq!(s.uri, "http://127.0.0.1:9/cb");
        assert_eq!(s.opaque, "o\"p\\aque\n");
        assert_eq!(s.tags.len(), 2);
        assert_eq!(s.tags[1].0, "q\"uote");
        let r = s.replication.unwrap();
        assert_eq!(r.start_time_delta_ms, -250);
        assert_eq!(r.sequence_number, 3);
        assert_eq!(r.version_us, Some(1_700_000_000_123_456));
        assert_eq!(r.cluster_view_id.as_deref(), Some("90691053180028962"));
        assert_eq!(r.replicas, vec!["10.0.0.1:7253", "10.0.0.2:7253"]);
        assert!(r.only_newer, "only-newer travels");

        let tomb = Body {
            uri: "",
            opaque: "",
            tags: &[],
            interval_ms: 0,
            repeat_for_ms: 0,
            ..body
        };
        out.clear();
        encode_body(&mut out, &tomb);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert!(s.is_tombstone());
        let plain = Body {
            only_newer: false,
            ..body
        };
        out.clear();
        encode_body(&mut out, &plain);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        assert!(!s.replication.unwrap().only_newer);
    }

    /// A timing section (issue 42) travels as its keys and an absolute
    /// start, and a cron timer's `interval` is its cursor.
    #[test]
    fn a_timing_travels_absolute() {
        use crate::timer::extras::{push_timing, TimingKind, TimingRef};
        let timing = TimingRef {
            kind: TimingKind::Cron,
            start_unix_ms: 1_790_000_000_000,
            text: "*/2 * * * * *",
            zone: "Europe/Paris",
        };
        let mut ext = Vec::new();
        push_timing(&mut ext, &timing);
        let body = Body {
            interval_ms: 4_000,
            repeat_for_ms: 60_000,
            replicas: &["10.0.0.1:7253"],
            ext: &ext,
            ..body_with_delta(-30)
        };
        let mut out = Vec::new();
        encode_body(&mut out, &body);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        let t = s.timing.as_deref().expect("the timing");
        assert_eq!(t.to_ref(t.start_unix_ms.unwrap()), timing);
        assert_eq!((s.interval_ms, s.repeat_for_ms), (4_000, 60_000));
        let at = TimingRef {
            kind: TimingKind::At,
            text: "2026-12-01T09:00:00+01:00",
            zone: "",
            ..timing
        };
        ext.clear();
        push_timing(&mut ext, &at);
        let body = Body {
            interval_ms: 0,
            repeat_for_ms: 0,
            replicas: &["10.0.0.1:7253"],
            ext: &ext,
            ..body_with_delta(-30)
        };
        out.clear();
        encode_body(&mut out, &body);
        let s = spec::parse(&out, crate::http::uri::check).unwrap();
        let t = s.timing.as_deref().expect("the timing");
        assert_eq!(t.to_ref(t.start_unix_ms.unwrap()), at);
    }

    pub(crate) fn body_with_delta(delta_ms: i64) -> Body<'static> {
        Body {
            interval_ms: 1000,
            repeat_for_ms: 1000,
            start_time_delta_ms: delta_ms,
            sequence: 0,
            version_us: 1,
            uri: "http://127.0.0.1:9/cb",
            opaque: "o",
            view_id: 7,
            replicas: &[],
            sites: &[],
            factor_requested: 1,
            tags: &[],
            start_time_unix_ms: None,
            only_newer: false,
            ext: &[],
            attempt: None,
        }
    }

    #[test]
    fn a_patchable_delta_is_rewritten_in_place_and_parses() {
        // Table: the delta when queued, the delta written at the send.
        for (queued, sent) in [(-5, -1500), (0, i64::MIN), (-1, i64::MAX), (3000, 0)] {
            let mut out = Vec::new();
            let at = encode_body_patchable(&mut out, &body_with_delta(queued));
            let len = out.len();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(queued));
            write_delta(&mut out[at..at + DELTA_WIDTH], sent);
            assert_eq!(out.len(), len, "Content-Length stays right");
            let text = std::str::from_utf8(&out).unwrap();
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v["timing"]["start-time-delta"].as_i64(), Some(sent));
        }
    }
}

//! The replication body: what one replication `PUT` says about a timer,
//! written as the JSON the timer codec reads back, with its
//! `start-time-delta` optionally in a fixed-width field that the sender
//! rewrites in place at each send (`write_delta`).

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
    out.extend_from_slice(b"{\"timing\":{\"interval\":");
    write_seconds(out, b.interval_ms);
    out.extend_from_slice(b",\"repeat-for\":");
    write_seconds(out, b.repeat_for_ms);
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
    if b.uri.is_empty() {
        out.extend_from_slice(b"{}");
    } else {
        out.extend_from_slice(b"{\"http\":{\"uri\":");
        write_json_str(out, b.uri);
        out.extend_from_slice(b",\"opaque\":");
        write_json_str(out, b.opaque);
        out.extend_from_slice(b"}}");
    }
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
    out.push(b'}');
    patchable.then_some(delta_at)
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

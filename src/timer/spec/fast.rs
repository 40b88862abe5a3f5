//! A single-pass reader for the timer bodies clients send, ahead of serde.
//!
//! It builds the same raw structs serde_json's derive does, for the bodies
//! it understands, and validation then runs on them unchanged: so every
//! reason, and every edge case of the numbers, stays serde's. It declines
//! (`None`, and the caller runs serde) on anything else: escapes, control
//! or non-ASCII bytes where it does not need them, negative numbers
//! (but a negative integer in an integer field, as serde reads it),
//! exponents, more than 15 significant digits with a fraction, integers
//! beyond `u64`, duplicate keys, a non-object where an object is expected,
//! a type serde would refuse or carry as another `Value`, an integer out
//! of a field's range, a callback mechanism other than `http`, unknown
//! values nested deeper than [`SKIP_DEPTH_MAX`], and any syntax error.
//! Declining costs a second parse; accepting what serde refuses, or
//! reading a value other than serde's, is a bug (fuzz target
//! `timer_json_fast` holds the two equal).

mod scan;

use super::{RawCallback, RawHttp, RawReliability, RawStatistics, RawTag, RawTimer, RawTiming};
use scan::Cursor;
use serde_json::Value;

/// Nesting the reader skips in the value of an unknown key (serde_json
/// allows 128 levels in all).
const SKIP_DEPTH_MAX: u32 = 16;

/// The raw timer, when the reader understands the whole body.
pub(super) fn raw_timer(body: &[u8]) -> Option<RawTimer<'_>> {
    let mut raw = RawTimer::empty();
    read_into(body, &mut raw)?;
    Some(raw)
}

/// [`raw_timer`] into `raw` (empty), which is left half filled when the
/// reader declines.
pub(super) fn read_into<'a>(body: &'a [u8], raw: &mut RawTimer<'a>) -> Option<()> {
    let mut c = Cursor { b: body, i: 0 };
    c.ws();
    c.timer(raw)?;
    c.ws();
    (c.i == body.len()).then_some(())
}

/// [`read_into`] of the timer object at the start of `text` (after
/// whitespace) that more text may follow: the bytes it took.
pub(super) fn read_prefix<'a>(text: &'a [u8], raw: &mut RawTimer<'a>) -> Option<usize> {
    let mut c = Cursor { b: text, i: 0 };
    c.ws();
    c.timer(raw)?;
    Some(c.i)
}

impl<'a> Cursor<'a> {
    fn timer(&mut self, raw: &mut RawTimer<'a>) -> Option<()> {
        let keys: &[&[u8]; 5] = &[
            b"timing",
            b"callback",
            b"reliability",
            b"statistics",
            b"delivery-state",
        ];
        self.object(keys, |c, key| {
            match key {
                0 => raw.timing = c.opt(Self::timing)?,
                1 => raw.callback = c.opt(Self::callback)?,
                2 => raw.reliability = c.opt(Self::reliability)?,
                3 => raw.statistics = c.opt(Self::statistics)?,
                // Internal and rare (a replica's attempts): serde's.
                4 => return None,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })
    }

    fn timing(&mut self) -> Option<RawTiming> {
        let (mut interval, mut repeat_for) = (None, None);
        let (mut start_time_delta, mut sequence_number, mut version) = (None, None, None);
        let keys: &[&[u8]; 11] = &[
            b"interval",
            b"repeat-for",
            b"start-time-delta",
            b"sequence-number",
            b"version",
            b"at",
            b"start-at",
            b"cron",
            b"time-zone",
            b"start-unix-ms",
            b"cron-cursor-ms",
        ];
        self.object(keys, |c, key| {
            match key {
                0 => interval = c.opt_number()?,
                1 => repeat_for = c.opt_number()?,
                2 => start_time_delta = c.opt_integer()?,
                3 => sequence_number = c.opt_integer()?,
                4 => version = c.opt_integer()?,
                // Wall-clock and calendar timing (issue 42): rare, serde's.
                5..=10 => return None,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })?;
        Some(RawTiming {
            interval: interval.map(Value::Number),
            repeat_for: repeat_for.map(Value::Number),
            start_time_delta,
            sequence_number,
            version,
            at: None,
            start_at: None,
            cron: None,
            time_zone: None,
            start_unix_ms: None,
            cron_cursor_ms: None,
        })
    }

    /// `callback`: `http` alone (serde keeps the last of two `http`s and
    /// notes another mechanism: both declined here).
    fn callback(&mut self) -> Option<RawCallback<'a>> {
        let mut http = None;
        self.object(&[b"http"], |c, key| {
            (key == 0).then_some(())?;
            c.ws();
            http = Some(c.http()?);
            Some(())
        })?;
        Some(RawCallback {
            http,
            other: None,
            retry: None,
            dead_letter: None,
        })
    }

    fn http(&mut self) -> Option<RawHttp<'a>> {
        let (mut uri, mut opaque) = (None, None);
        self.object(&[b"uri", b"opaque"], |c, key| {
            match key {
                0 => uri = c.opt(Self::text)?,
                1 => opaque = c.opt(Self::text)?,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })?;
        Some(RawHttp { uri, opaque })
    }

    fn reliability(&mut self) -> Option<RawReliability<'a>> {
        let (mut factor, mut view, mut only_newer) = (None, None, None);
        let (mut replicas, mut sites) = (None, None);
        let keys: &[&[u8]; 5] = &[
            b"replication-factor",
            b"cluster-view-id",
            b"replicas",
            b"sites",
            b"only-newer",
        ];
        self.object(keys, |c, key| {
            match key {
                0 => factor = c.opt_number()?,
                1 => view = c.opt(Self::text)?,
                2 => replicas = c.opt(Self::texts)?,
                3 => sites = c.opt(Self::texts)?,
                4 => only_newer = c.opt_bool()?,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })?;
        Some(RawReliability {
            replication_factor: factor.map(Value::Number),
            cluster_view_id: view,
            replicas,
            sites,
            only_newer: only_newer.map(Value::Bool),
        })
    }

    fn statistics(&mut self) -> Option<RawStatistics<'a>> {
        let mut tag_info = None;
        self.object(&[b"tag-info"], |c, key| {
            if key != 0 {
                return c.skip(SKIP_DEPTH_MAX);
            }
            tag_info = c.opt(Self::tags)?;
            Some(())
        })?;
        Some(RawStatistics { tag_info })
    }

    fn tags(&mut self) -> Option<Vec<RawTag<'a>>> {
        let mut list = Vec::new();
        self.array(|c| {
            list.push(c.tag()?);
            Some(())
        })?;
        Some(list)
    }

    fn tag(&mut self) -> Option<RawTag<'a>> {
        let (mut kind, mut count) = (None, None);
        self.object(&[b"type", b"count"], |c, key| {
            match key {
                0 => kind = c.opt(Self::text)?,
                1 => count = c.opt_number()?,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })?;
        Some(RawTag {
            kind,
            count: count.map(Value::Number),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::check;
    use super::super::{fast_reader_agrees, parse, parse_serde_only};

    /// `{"timing":{"interval":<i>},"callback":{"http":{"uri":"http://a/"}}<rest>}`.
    fn timer(interval: &str, rest: &str) -> String {
        format!(
            r#"{{"timing":{{"interval":{interval}}},"callback":{{"http":{{"uri":"http://a/"}}}}{rest}}}"#
        )
    }

    /// Both paths give the same result, and the fast reader reads the body
    /// (`fast`) or declines it.
    fn same(body: &str, fast: bool) {
        let b = body.as_bytes();
        assert_eq!(parse(b, check), parse_serde_only(b, check), "{body}");
        let agrees = fast_reader_agrees(b);
        assert_ne!(agrees, Some(false), "{body}");
        assert_eq!(agrees.is_some(), fast, "{body}: fast reader");
    }

    #[test]
    fn the_bodies_clients_send_take_the_fast_path() {
        let bodies = [
            r#"{"timing":{"interval":10,"repeat-for":10},"callback":{"http":{"uri":"http://127.0.0.1:9/cb","opaque":"some-opaque-data"}}}"#,
            r#"{"timing":{"interval":0.5,"repeat-for":30},"callback":{"http":{"uri":"http://h:81/p?q=1","opaque":"o"}},
               "reliability":{"replication-factor":2},"statistics":{"tag-info":[{"type":"CALL"},{"type":"SUB","count":3}]}}"#,
            " {\"timing\" : {\"interval\" : 1} ,\r\n\t\"callback\":{\"http\":{\"uri\":\"http://a/\"}}}\n ",
            r#"{"timing":{"interval":1,"start-time-delta":250,"sequence-number":2,"version":7},
               "callback":{},"reliability":{"cluster-view-id":"12","replicas":["10.0.0.1:7253","b:1"],"sites":["s"]}}"#,
            r#"{"callback":{"http":{"opaque":"x","uri":"http://a/"}},"timing":{"repeat-for":null,"interval":2}}"#,
            r#"{"timing":{"interval":1,"sequence-number":1,"version":9},"callback":{},"reliability":{"replicas":["a:1"],"only-newer":true}}"#,
            r#"{"timing":{"interval":1},"callback":{},"reliability":{"replicas":["a:1"],"only-newer":false}}"#,
            r#"{"timing":{"interval":1},"callback":{},"reliability":{"replicas":["a:1"],"only-newer":null}}"#,
        ];
        for body in bodies {
            same(body, true);
            assert!(parse(body.as_bytes(), check).is_ok(), "{body}");
        }
    }

    /// The fast reader keeps a number as an `f64` or `u64`, as serde_json
    /// does without its `arbitrary_precision` feature; with that feature
    /// (a dependency could turn it on) serde keeps `0.50` as its text and
    /// the two readings would differ. This fails if the feature is on.
    #[test]
    fn serde_json_reads_numbers_as_values_not_text() {
        let v: serde_json::Value = serde_json::from_str("0.50").unwrap();
        assert_eq!(v, serde_json::Value::from(0.5));
        assert_eq!(v.to_string(), "0.5");
    }

    #[test]
    fn numbers_read_as_serde_reads_them() {
        let read = [
            "0",
            "10",
            "0.1",
            "1.5",
            "0.001",
            "0.0015",
            "2.999",
            "4294967.295",
            "4294967.296",
            "4294968",
            "53.0",
            "0.000000000000001",
            "999999999999999",
            "18446744073709551615",
            "900719925474099.1",
            "4294967.295000001",
        ];
        for n in read {
            same(&timer(n, ""), true);
            same(
                &timer(
                    "1",
                    &format!(r#","reliability":{{"replication-factor":{n}}}"#),
                ),
                true,
            );
            let tag = format!(r#","statistics":{{"tag-info":[{{"type":"A","count":{n}}}]}}"#);
            same(&timer("1", &tag), true);
        }
        let declined = [
            "5e-324",
            "1e3",
            "1E3",
            "-1",
            "-0",
            "-0.0",
            "01",
            "00",
            "1.",
            ".5",
            "1.5.3",
            "+1",
            "18446744073709551616",
            "0.30000000000000004",
            "0.0000000000000001",
            "9007199254740993.5",
            "1e400",
            "-",
            "\"10\"",
            "true",
            "{}",
            "[]",
            "1x",
            "NaN",
        ];
        for n in declined {
            same(&timer(n, ""), false);
        }
        // 2^53 and beyond as a significand with a fraction: serde's float.
        same(&timer("9007199254740992.0", ""), false);
    }

    #[test]
    fn replication_integers_in_range_are_read() {
        for (field, ok, bad) in [
            ("start-time-delta", "250.0", "9223372036854775808"),
            ("start-time-delta", "-1234", "-9223372036854775809"),
            ("start-time-delta", "-9223372036854775808", "-0"),
            ("start-time-delta", "-1", "-1.0"),
            ("start-time-delta", "-7", "-07"),
            ("sequence-number", "2", "-1"),
            ("version", "7", "-5"),
            ("sequence-number", "2", "4294967296"),
            ("version", "7.0", "0.5"),
        ] {
            let body = |v: &str| {
                format!(
                    r#"{{"timing":{{"interval":1,"{field}":{v}}},"callback":{{}},"reliability":{{"replicas":["a:1"]}}}}"#
                )
            };
            same(&body(ok), true);
            same(&body(bad), false);
            same(&body("null"), true);
        }
    }

    #[test]
    fn shapes_serde_treats_its_own_way_are_declined() {
        let declined = [
            // Duplicate keys: serde refuses a struct's, keeps the last `http`.
            r#"{"timing":{"interval":1},"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1,"interval":2},"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"},"http":{"uri":"http://b/"}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/","uri":"http://b/"}}}"#,
            r#"{"timing":null,"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}}"#,
            // A struct written as an array, an object not written at all.
            r#"{"timing":[1],"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":null}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"},"sip":{}}}"#,
            r#"{"timing":{"interval":1},"callback":{"sip":{}}}"#,
            r#"{"timing":{"interval":1},"callback":[]}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":5}}}"#,
            // Escapes, control and form-feed bytes, trailing bytes, commas.
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http:\/\/a/"}}}"#,
            r#"{"timin\u0067":{"interval":1},"callback":{"http":{"uri":"http://a/"}}}"#,
            "{\"timing\":{\"interval\":1},\"callback\":{\"http\":{\"uri\":\"http://a/\t\"}}}",
            "\u{c}{\"timing\":{\"interval\":1},\"callback\":{\"http\":{\"uri\":\"http://a/\"}}}",
            "{\"timing\":{\"interval\":1},\u{c}\"callback\":{\"http\":{\"uri\":\"http://a/\"}}}",
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}} x"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},}"#,
            r#"{"timing":{"interval":1,},"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}}"#,
            r#"{"timing":{"interval":1} "callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"x":[1,]}"#,
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"x":"é"}"#,
            r#"{"timing":{"interval":1},"statistics":{"tag-info":[{"type":"A"},5]},"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"reliability":{"replicas":["a",1]},"callback":{}}"#,
            r#"{"timing":{"interval":1},"reliability":{"replication-factor":"2"},"callback":{"http":{"uri":"http://a/"}}}"#,
            r#"{"timing":{"interval":1},"reliability":{"replicas":["a:1"],"only-newer":1},"callback":{}}"#,
            r#"{"timing":{"interval":1},"reliability":{"replicas":["a:1"],"only-newer":"true"},"callback":{}}"#,
            "[1,2]",
        ];
        for body in declined {
            same(body, false);
        }
        // Invalid UTF-8: serde refuses it in a field it reads, and skips
        // it unchecked in an unknown one; the fast reader declines both.
        for (rest, refused) in [(r#","x":"ab""#, false), ("", true)] {
            let mut bad = timer("1", rest).into_bytes();
            let at = if refused { 58 } else { bad.len() - 3 };
            bad[at] = 0xff;
            assert_eq!(fast_reader_agrees(&bad), None);
            assert_eq!(parse(&bad, check), parse_serde_only(&bad, check));
            assert_eq!(parse(&bad, check).is_err(), refused);
        }
    }

    #[test]
    fn validation_after_the_fast_reader_is_serdes() {
        let tag = |t: &str| format!(r#","statistics":{{"tag-info":[{{"type":"{t}"}}]}}"#);
        let read = [
            timer("1", r#","reliability":{"replicas":[],"sites":[]}"#),
            timer("1", r#","reliability":{"sites":["b"]}"#),
            timer("1", r#","reliability":{"sites":[]}"#),
            timer("1", r#","reliability":{"replication-factor":0}"#),
            timer("1", r#","reliability":{"replication-factor":200}"#),
            timer("1", r#","reliability":null,"statistics":null"#),
            timer("1", r#","statistics":{"tag-info":null}"#),
            timer("1", r#","statistics":{"tag-info":[{"count":2}]}"#),
            timer("1", r#","statistics":{"tag-info":[{"type":"A","count":0}]}"#),
            timer("1", r#","statistics":{"tag-info":[{"type":"A","count":4294967296}]}"#),
            timer("1", &tag("")),
            timer("1", &tag(&"é".repeat(256))),
            timer("1", &tag(&"é".repeat(257))),
            timer("1", &tag(&"a".repeat(257))),
            timer("0", r#","x":{"timing":{"interval":1}}"#),
            r#"{"timing":{"interval":0,"repeat-for":0.25},"callback":{"http":{"uri":"http://a/"}}}"#.into(),
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"ftp://a/"}}}"#.into(),
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":""}}}"#.into(),
            r#"{"timing":{"interval":1},"callback":{"http":{"opaque":"o"}}}"#.into(),
            r#"{"timing":{"interval":1},"callback":{}}"#.into(),
            r#"{"timing":{"interval":1},"callback":null}"#.into(),
            r#"{"timing":{},"callback":{"http":{"uri":"http://a/"}}}"#.into(),
            r#"{"timing":{"interval":null},"callback":{"http":{"uri":"http://a/"}}}"#.into(),
            r#"{"callback":{"http":{"uri":"http://a/"}}}"#.into(),
            r#"{"timing":{"interval":1},"callback":{"http":{"uri":"http://a/"}},"u":[{"a":[true,false,null,"s",0.5]}]}"#.into(),
            "{}".into(),
            " { } ".into(),
        ];
        for body in &read {
            same(body, true);
        }
        let deep = format!("{}1{}", "[".repeat(17), "]".repeat(17));
        same(&timer("1", &format!(r#","x":{deep}"#)), false);
        let shallow = format!("{}1{}", "[".repeat(16), "]".repeat(16));
        same(&timer("1", &format!(r#","x":{shallow}"#)), true);
    }

    #[test]
    fn strings_are_scanned_exactly_at_every_offset() {
        let specials: [&[u8]; 9] = [
            b"\\\"",
            b"\\n",
            b"\x01",
            b"\x1f",
            b" ",
            b"\x7f",
            "\u{e9}".as_bytes(),
            b"\x80",
            b"\xff",
        ];
        for len in 0..26 {
            for at in 0..=len {
                for special in specials {
                    let mut text = vec![b'a'; at];
                    text.extend_from_slice(special);
                    text.extend(std::iter::repeat_n(b'b', len - at));
                    for field in ["opaque", "x"] {
                        let mut body = format!(
                            r#"{{"timing":{{"interval":1}},"callback":{{"http":{{"uri":"http://a/","{field}":""#
                        )
                        .into_bytes();
                        body.extend_from_slice(&text);
                        body.extend_from_slice(b"\"}}}");
                        assert_eq!(parse(&body, check), parse_serde_only(&body, check));
                        assert_ne!(fast_reader_agrees(&body), Some(false));
                    }
                }
            }
        }
    }
}

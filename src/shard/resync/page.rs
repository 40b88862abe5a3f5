//! The requesting side's page reader: a page of a listing as the serving
//! node writes it, split into entries and parsed one by one, each first by
//! a one-pass reader of what this service writes and, for anything else,
//! by serde. Held equal to serde alone by the fuzz target `resync_page`
//! ([`parse_page_both`]).

use crate::http::uri;
use crate::runtime::bulk::{self, Pacer};
use crate::timer::spec::{self, TimerSpec};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// One page of a listing, as the serving node writes it, without its
/// `timers` (split off and parsed one by one: [`parse_page`]).
#[derive(Deserialize)]
struct PageRest {
    timers: Vec<IgnoredAny>,
    cursor: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Entry<'a> {
    #[serde(rename = "TimerID", borrow)]
    pub(super) id: Cow<'a, str>,
    #[serde(rename = "OldReplicas", borrow)]
    pub(super) old: Vec<Cow<'a, str>>,
    #[serde(rename = "Timer", borrow)]
    pub(super) timer: Listed<'a>,
}

/// An entry's timer: parsed already, by [`fast_entry`] (one pass over
/// its bytes), or its JSON as serde found it, parsed when applied.
pub(super) enum Listed<'a> {
    Parsed(Result<TimerSpec<'a>, String>),
    Raw(&'a RawValue),
}

impl<'de: 'a, 'a> Deserialize<'de> for Listed<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(Listed::Raw)
    }
}

impl<'a> Listed<'a> {
    /// The timer, checked (a JSON that is no timer is this entry's error).
    pub(super) fn spec(self) -> Result<TimerSpec<'a>, String> {
        match self {
            Listed::Parsed(spec) => spec,
            Listed::Raw(raw) => spec::parse(raw.get().as_bytes(), uri::check),
        }
    }
}

/// The entry at the start of `text` as this service writes it,
/// `{"TimerID":"..","OldReplicas":[".."],"Timer":{..}}`, read in one pass
/// with the timer's fast reader ([`spec::parse_prefix`]), and the bytes it
/// took; `None` for anything else (escapes in a string, whitespace, other
/// keys or another order, a timer that reader declines): serde reads it.
fn fast_entry(text: &[u8]) -> Option<(Entry<'_>, usize)> {
    let mut at = text.strip_prefix(b"{\"TimerID\":")?;
    let id = plain_str(&mut at)?;
    at = at.strip_prefix(b",\"OldReplicas\":[")?;
    let mut old = Vec::new();
    if let Some(rest) = at.strip_prefix(b"]") {
        at = rest;
    } else {
        loop {
            old.push(plain_str(&mut at)?);
            let (&next, rest) = at.split_first()?;
            at = rest;
            match next {
                b',' => {}
                b']' => break,
                _ => return None,
            }
        }
    }
    at = at.strip_prefix(b",\"Timer\":")?;
    let (spec, used) = spec::parse_prefix(at, uri::check)?;
    at = at[used..].strip_prefix(b"}")?;
    let entry = Entry {
        id,
        old,
        timer: Listed::Parsed(spec),
    };
    Some((entry, text.len() - at.len()))
}

/// A JSON string at the start of `*at` with no escape and no control
/// character (serde borrows such a string as it is), moving `*at` past it.
fn plain_str<'a>(at: &mut &'a [u8]) -> Option<Cow<'a, str>> {
    let rest = at.strip_prefix(b"\"")?;
    let end = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    (rest[end] == b'"').then_some(())?;
    let text = std::str::from_utf8(&rest[..end]).ok()?;
    *at = &rest[end + 1..];
    Some(Cow::Borrowed(text))
}

/// A page's entries and its cursor. The page (about 400 KB for 1,000
/// timers) is parsed entry by entry, with a breath whenever the pacer's
/// stretch is used up: parsed in one go it held the reactor for about a
/// millisecond. Any part that is
/// not JSON fails the whole page, as one parse would.
pub(super) async fn parse_page<'a>(
    body: &'a [u8],
    pacer: &mut Pacer,
) -> Result<(Vec<Entry<'a>>, Option<String>), String> {
    let bad = |e: &dyn std::fmt::Display| format!("a resync page that is not JSON: {e}");
    let (entries, rest) = bulk::parse_array_fast(body, "timers", pacer, fast_entry)
        .await
        .map_err(|e| bad(&e))?;
    let rest: PageRest = serde_json::from_slice(&rest).map_err(|e| bad(&e))?;
    // Emptied by the split, unless the key came escaped (never, from us).
    if !rest.timers.is_empty() {
        return Err(bad(&"a timers key spelled with escapes"));
    }
    Ok((entries, rest.cursor))
}

/// For the fuzz target `resync_page` (issue 40: the hand-written reader
/// had none): a page read as a resync reads it (the one-pass entry reader
/// first, serde behind it) and by serde alone, each as its entry count or
/// its error. Whatever serde refuses the resync must refuse too, and where
/// both read the page they find the same entries.
pub fn parse_page_both(body: &[u8]) -> (Result<usize, String>, Result<usize, String>) {
    let mut pacer = Pacer::unpaced();
    let fast = futures_lite::future::block_on(parse_page(body, &mut pacer)).map(|(e, _)| e.len());
    let serde_only = futures_lite::future::block_on(async {
        let (entries, _rest) = bulk::parse_array::<Entry>(body, "timers", &mut pacer).await?;
        Ok(entries.len())
    });
    (fast, serde_only)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as `serve.rs` writes it (the timer through the
    /// replication encoder), with `old` replicas and `extra` tags.
    fn written(old: &str, tags: &[(&str, u32)], opaque: &str) -> String {
        let body = crate::cluster::replicate::Body {
            interval_ms: 3_600_000,
            repeat_for_ms: 3_600_000,
            start_time_delta_ms: -1234,
            sequence: 3,
            version_us: 1_764_000_000_000_000,
            uri: "http://127.0.0.1:9000/cb?x=1",
            opaque,
            view_id: 77,
            replicas: &["127.0.0.1:7253", "127.0.0.2:7253"],
            sites: &[],
            factor_requested: 2,
            tags,
            start_time_unix_ms: Some(1_764_000_000_123),
            only_newer: false,
            ext: &[],
            attempt: None,
        };
        let mut timer = Vec::new();
        crate::cluster::replicate::encode_body(&mut timer, &body);
        let timer = String::from_utf8(timer).unwrap();
        let id = "0123456789abcdef0000000000000003";
        format!(r#"{{"TimerID":"{id}","OldReplicas":[{old}],"Timer":{timer}}}"#)
    }

    /// What the fuzz target `resync_page` holds the page reader to: both
    /// readings find the same entries; what serde refuses, both refuse.
    #[test]
    fn a_page_reads_alike_fast_and_by_serde_alone() {
        let entry = written(r#""127.0.0.1:7253""#, &[("CALL", 2)], "o");
        let page = format!(r#"{{"timers":[{entry},{entry}],"cursor":"c"}}"#);
        let (fast, serde_only) = parse_page_both(page.as_bytes());
        assert_eq!(fast, Ok(2));
        assert_eq!(serde_only, Ok(2));
        for bad in [
            &b"{\"timers\":[{\"TimerID\":"[..],
            b"",
            b"[]",
            b"{\"timers\":[1,]}",
        ] {
            let (fast, serde_only) = parse_page_both(bad);
            assert!(fast.is_err() && serde_only.is_err(), "{bad:?}");
        }
    }

    /// What an entry reads as: ID, old replicas, the timer's verdict.
    type Read<'a> = (
        Cow<'a, str>,
        Vec<Cow<'a, str>>,
        Result<TimerSpec<'a>, String>,
    );

    fn read(e: Entry<'_>) -> Read<'_> {
        (e.id, e.old, e.timer.spec())
    }

    /// The one-pass reading gives what serde and `spec::parse` give, takes
    /// exactly the entry's bytes, and declines what it does not know.
    #[test]
    fn fast_entry_reads_as_serde_and_spec_parse_do() {
        let plain = written(r#""127.0.0.1:7253""#, &[], "o");
        let cases = [
            (plain.clone(), true),
            (written("", &[], "o"), true),
            (written(r#""a:1","b:2","c:3""#, &[("CALL", 2)], "ü"), true),
            // Valid JSON, but no valid timer: this entry's error.
            (
                plain.replace("\"interval\":3600", "\"interval\":-3600"),
                false,
            ),
            (plain.replace("\"uri\":\"http:", "\"uri\":\"ftp:"), true),
            // Not as written: serde's.
            (
                plain.replace("\"OldReplicas\":", "\"OldReplicas\": "),
                false,
            ),
            (
                plain.replace("127.0.0.1:7253\"]", "127.0.0.1:7253\\u0041\"]"),
                false,
            ),
            (
                plain.replace("\"TimerID\"", "\"Other\":1,\"TimerID\""),
                false,
            ),
            (written("", &[], "a\\\"b"), false),
        ];
        for (text, fast) in &cases {
            let serde: Entry = serde_json::from_str(text).expect(text);
            let want = read(serde);
            let followed = format!("{text},{text}]");
            match fast_entry(followed.as_bytes()) {
                Some((e, used)) => {
                    assert!(fast, "read: {text}");
                    assert_eq!(used, text.len(), "{text}");
                    assert_eq!(read(e), want, "{text}");
                }
                None => assert!(!fast, "declined: {text}"),
            }
        }
        assert!(read(fast_entry(plain.as_bytes()).unwrap().0).2.is_ok());
        for bad in [&plain[..plain.len() - 1], "{\"TimerID\":\"x", "", "{"] {
            assert!(fast_entry(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    /// A page of entries read in one pass and by serde, mixed, reads as
    /// serde alone reads it; what is not JSON still fails the page.
    #[test]
    fn a_page_reads_as_serde_alone_reads_it() {
        let a = written(r#""127.0.0.1:7253""#, &[("T", 1)], "o");
        let b = a.replace("\"Timer\":", "\"Timer\": ");
        let page = format!(r#"{{"timers":[{a},{b} , {a}],"cursor":"12-00ff"}}"#);
        let run = |body: &[u8], fast: bool| {
            let body = body.to_vec();
            glommio::LocalExecutor::default().run(async move {
                let mut pacer = Pacer::unpaced();
                let got = match fast {
                    true => parse_page(&body, &mut pacer).await,
                    false => bulk::parse_array::<Entry>(&body, "timers", &mut pacer)
                        .await
                        .map(|(e, _)| (e, Some("12-00ff".to_string()))),
                };
                got.map(|(entries, cursor)| {
                    let read: Vec<String> = entries
                        .into_iter()
                        .map(|e| format!("{:?}", read(e)))
                        .collect();
                    (read, cursor)
                })
            })
        };
        let fast = run(page.as_bytes(), true).unwrap();
        assert_eq!(fast, run(page.as_bytes(), false).unwrap());
        assert_eq!(fast.0.len(), 3);
        assert_eq!(fast.1.as_deref(), Some("12-00ff"));
        let broken = page.replacen("},{", "},x{", 1);
        assert!(run(broken.as_bytes(), true).is_err());
    }
}

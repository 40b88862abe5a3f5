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

use super::{
    integral, RawCallback, RawHttp, RawReliability, RawStatistics, RawTag, RawTimer, RawTiming,
};
use serde_json::{Number, Value};
use std::borrow::Cow;

/// Nesting the reader skips in the value of an unknown key (serde_json
/// allows 128 levels in all).
const SKIP_DEPTH_MAX: u32 = 16;

/// `10^k` for k <= 15, each exact in an `f64`: a significand below 2^53
/// divided by one of them is one correctly rounded division, the one
/// serde_json makes for these numbers.
const POW10: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

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

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each zero byte of `w` set (and possibly of bytes above
/// a zero byte: the lowest set bit is exact).
fn zero_byte(w: u64) -> u64 {
    w.wrapping_sub(ONES) & !w & HIGHS
}

impl<'a> Cursor<'a> {
    /// JSON's whitespace (not `is_ascii_whitespace`: no form feed).
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed. Bodies mostly have
    /// no whitespace between tokens: a byte above space at the cursor is
    /// that byte, one load and compare (the loop cost ~5 instructions
    /// more per call, ~35 calls per body).
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        match self.b.get(self.i) {
            Some(&c) if c > b' ' => Some(c),
            _ => {
                self.ws();
                self.b.get(self.i).copied()
            }
        }
    }

    /// `byte` at the cursor, consumed. Values (objects, arrays, strings,
    /// numbers) are read from their first byte: every caller has just
    /// peeked past the whitespace before them (`opt`, `skip`, `array`),
    /// which cost ~5 instructions per call to skip again.
    #[inline]
    fn here(&mut self, byte: u8) -> Option<()> {
        (*self.b.get(self.i)? == byte).then(|| self.i += 1)
    }

    /// `byte` (never whitespace) after whitespace, consumed.
    #[inline]
    fn eat(&mut self, byte: u8) -> Option<()> {
        if self.b.get(self.i) == Some(&byte) {
            self.i += 1;
            return Some(());
        }
        (self.peek()? == byte).then(|| self.i += 1)
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        self.word_here(word)
    }

    /// `word` at the cursor (no whitespace before it).
    #[inline]
    fn word_here(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// `None` for `null`, else `read`'s value (the `Option` fields). No
    /// reader takes a value that starts with `n`, so an `n` not starting
    /// a `null` is declined here, as `read` would decline it.
    #[inline]
    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            return self.word_here(b"null").map(|()| None);
        }
        read(self).map(Some)
    }

    /// An object whose known keys are `keys`; `member` reads the value of
    /// key `n`, where `n == N` stands for any other key (the cursor before
    /// the value). A known key twice is declined: serde's derive refuses
    /// a duplicate field.
    #[inline(always)]
    fn object<const N: usize>(
        &mut self,
        keys: &[&[u8]; N],
        mut member: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        self.here(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        let mut seen = 0u32;
        loop {
            let n = self.key(keys)?;
            if n < N {
                (seen & 1 << n == 0).then_some(())?;
                seen |= 1 << n;
            }
            self.eat(b':')?;
            member(self, n)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.here(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    // Items are read from their first byte.
                    self.ws();
                }
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An object's key: the index of the one of `keys` it is, else `N`
    /// for another key. A known key is compared in place (its bytes and
    /// then its closing quote: the key is exactly it, as no known key
    /// holds a quote or a backslash), not scanned a byte at a time, which
    /// cost ~8 instructions per byte.
    #[inline(always)]
    fn key<const N: usize>(&mut self, keys: &[&[u8]; N]) -> Option<usize> {
        self.eat(b'"')?;
        let rest = &self.b[self.i..];
        for (n, k) in keys.iter().enumerate() {
            if rest.get(k.len()) == Some(&b'"') && rest.starts_with(k) {
                self.i += k.len() + 1;
                return Some(n);
            }
        }
        self.other_key()?;
        Some(N)
    }

    /// The rest of another key, after its opening quote: ASCII from space
    /// to DEL (serde takes DEL too) without escapes. Keys are short: a
    /// byte at a time beats [`Cursor::raw_str`]'s words.
    #[inline]
    fn other_key(&mut self) -> Option<()> {
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                b'\\' => return None,
                // Below 0x20 or from 0x80: declined (serde: an error, or a
                // UTF-8 key this reader does not compare).
                c if c.wrapping_sub(0x20) >= 0x60 => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        Some(())
    }

    /// A string's bytes between its quotes, when it has no escape and no
    /// control character, and whether they are all ASCII (`false` may
    /// also mean "not known": the caller then checks them as UTF-8).
    #[inline]
    fn raw_str(&mut self) -> Option<(&'a [u8], bool)> {
        self.here(b'"')?;
        let (b, start) = (self.b, self.i);
        let mut i = start;
        let mut high = 0;
        // Eight bytes at a time: a byte is flagged when it is `"`, `\` or
        // below 0x20 (the lowest flagged byte is exact: a borrow only
        // flags bytes above a true one).
        while let Some(chunk) = b.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().ok()?);
            let special = zero_byte(w ^ (ONES * u64::from(b'"')))
                | zero_byte(w ^ (ONES * u64::from(b'\\')))
                | (w.wrapping_sub(ONES * 0x20) & !w & HIGHS);
            if special != 0 {
                // The high bits of the bytes before the first flagged one.
                let lowest = special & special.wrapping_neg();
                high |= w & HIGHS & (lowest - 1);
                i += (special.trailing_zeros() / 8) as usize;
                return self.close_str(start, i, high == 0);
            }
            high |= w & HIGHS;
            i += 8;
        }
        while let Some(&c) = b.get(i) {
            if c == b'"' || c == b'\\' || c < 0x20 {
                return self.close_str(start, i, high == 0);
            }
            high |= u64::from(c & 0x80);
            i += 1;
        }
        None
    }

    /// The string `start..end`, when the byte at `end` is its closing quote.
    #[inline]
    fn close_str(&mut self, start: usize, end: usize, ascii: bool) -> Option<(&'a [u8], bool)> {
        (self.b[end] == b'"').then_some(())?;
        self.i = end + 1;
        Some((&self.b[start..end], ascii))
    }

    /// A string field's value (UTF-8 checked, as serde_json checks it).
    #[inline]
    fn text(&mut self) -> Option<Cow<'a, str>> {
        let text = match self.raw_str()? {
            // SAFETY: ASCII bytes are UTF-8.
            (bytes, true) => unsafe { std::str::from_utf8_unchecked(bytes) },
            (bytes, false) => std::str::from_utf8(bytes).ok()?,
        };
        Some(Cow::Borrowed(text))
    }

    fn texts(&mut self) -> Option<Vec<Cow<'a, str>>> {
        let mut list = Vec::new();
        self.array(|c| {
            list.push(c.text()?);
            Some(())
        })?;
        Some(list)
    }

    /// Decimal digits into `value` (`None` past `u64`), how many.
    #[inline]
    fn digits(&mut self, value: &mut u64) -> Option<usize> {
        let start = self.i;
        while let Some(&c @ b'0'..=b'9') = self.b.get(self.i) {
            *value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        Some(self.i - start)
    }

    /// A non-negative number, as serde_json reads it: an integer within
    /// `u64` is exact; one with a fraction is its significand over a power
    /// of ten, both exact in an `f64`, so the one division rounds
    /// correctly, as both of serde_json's float parsers do.
    #[inline]
    fn number(&mut self) -> Option<Number> {
        let first = *self.b.get(self.i)?;
        let mut significand = 0;
        let integer_digits = self.digits(&mut significand)?;
        // No digit (a sign, say), or a leading zero before another digit.
        if integer_digits == 0 || (first == b'0' && integer_digits > 1) {
            return None;
        }
        let mut fraction_digits = 0;
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            fraction_digits = self.digits(&mut significand)?;
            if fraction_digits == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E' | b'.') = self.b.get(self.i) {
            return None;
        }
        match fraction_digits {
            0 => Some(Number::from(significand)),
            d if d < POW10.len() && significand < 1 << 53 => {
                Number::from_f64(significand as f64 / POW10[d])
            }
            _ => None,
        }
    }

    /// A number or `null` field serde reads as `Option<Value>`: kept as a
    /// `Number` until the struct is built (an `Option<Value>` field
    /// assigned in a member's closure was dropped first, by a call).
    #[inline]
    fn opt_number(&mut self) -> Option<Option<Number>> {
        self.opt(Self::number)
    }

    /// A `true`, `false` or `null` field serde reads as `Option<Value>`
    /// (another value: `None`, left to serde's error).
    fn opt_bool(&mut self) -> Option<Option<bool>> {
        self.opt(|c| match c.peek()? {
            b't' => c.word(b"true").map(|()| true),
            b'f' => c.word(b"false").map(|()| false),
            _ => None,
        })
    }

    /// An integer field (`opt_integer`), when it is in `T`'s range.
    fn opt_integer<T: TryFrom<i128>>(&mut self) -> Option<Option<T>> {
        self.opt(|c| T::try_from(c.integer()?).ok())
    }

    /// An integer field's value, as `integral` makes it of serde's number.
    /// A negative one (`start-time-delta` in every resync entry and in a
    /// replication body sent late) is read when serde reads it as an
    /// `i64`, exactly: `-1` to `-2^63`; `-0` (serde's float) and anything
    /// else negative are declined.
    #[inline]
    fn integer(&mut self) -> Option<i128> {
        if self.b.get(self.i) != Some(&b'-') {
            return integral(&self.number()?);
        }
        self.i += 1;
        let first = *self.b.get(self.i)?;
        let mut magnitude = 0;
        let digits = self.digits(&mut magnitude)?;
        // No digit, `-0`, or a leading zero (`-01`: serde's error).
        if digits == 0 || first == b'0' {
            return None;
        }
        if let Some(b'e' | b'E' | b'.') = self.b.get(self.i) {
            return None;
        }
        (magnitude <= 1 << 63).then(|| -i128::from(magnitude))
    }

    /// The value of an unknown key, skipped (strings ASCII only).
    fn skip(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.raw_str()?.1.then_some(()),
            b'{' if depth > 0 => self.object(&[], |c, _| c.skip(depth - 1)),
            b'[' if depth > 0 => self.array(|c| c.skip(depth - 1)),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number().map(drop),
        }
    }

    fn timer(&mut self, raw: &mut RawTimer<'a>) -> Option<()> {
        let keys: &[&[u8]; 4] = &[b"timing", b"callback", b"reliability", b"statistics"];
        self.object(keys, |c, key| {
            match key {
                0 => raw.timing = c.opt(Self::timing)?,
                1 => raw.callback = c.opt(Self::callback)?,
                2 => raw.reliability = c.opt(Self::reliability)?,
                3 => raw.statistics = c.opt(Self::statistics)?,
                _ => c.skip(SKIP_DEPTH_MAX)?,
            }
            Some(())
        })
    }

    fn timing(&mut self) -> Option<RawTiming> {
        let (mut interval, mut repeat_for) = (None, None);
        let (mut start_time_delta, mut sequence_number, mut version) = (None, None, None);
        let keys: &[&[u8]; 5] = &[
            b"interval",
            b"repeat-for",
            b"start-time-delta",
            b"sequence-number",
            b"version",
        ];
        self.object(keys, |c, key| {
            match key {
                0 => interval = c.opt_number()?,
                1 => repeat_for = c.opt_number()?,
                2 => start_time_delta = c.opt_integer()?,
                3 => sequence_number = c.opt_integer()?,
                4 => version = c.opt_integer()?,
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
        Some(RawCallback { http, other: None })
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

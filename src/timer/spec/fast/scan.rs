//! The fast reader's byte scanner: a cursor over a JSON body that reads
//! its tokens (whitespace, literals, strings, numbers, integers), walks its
//! objects and arrays, and skips an unknown key's value. It knows JSON, not
//! timers: which keys a timer has, and what each holds, is `fast.rs`'s.
//! Every method declines (`None`) where serde's reading could differ.

use super::super::integral;
use serde_json::Number;
use std::borrow::Cow;

/// `10^k` for k <= 15, each exact in an `f64`: a significand below 2^53
/// divided by one of them is one correctly rounded division, the one
/// serde_json makes for these numbers.
const POW10: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// A position in the body being read.
pub(super) struct Cursor<'a> {
    pub(super) b: &'a [u8],
    pub(super) i: usize,
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
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed. Bodies mostly have
    /// no whitespace between tokens: a byte above space at the cursor is
    /// that byte, one load and compare (the loop cost ~5 instructions
    /// more per call, ~35 calls per body).
    #[inline]
    pub(super) fn peek(&mut self) -> Option<u8> {
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
    pub(super) fn here(&mut self, byte: u8) -> Option<()> {
        (*self.b.get(self.i)? == byte).then(|| self.i += 1)
    }

    /// `byte` (never whitespace) after whitespace, consumed.
    #[inline]
    pub(super) fn eat(&mut self, byte: u8) -> Option<()> {
        if self.b.get(self.i) == Some(&byte) {
            self.i += 1;
            return Some(());
        }
        (self.peek()? == byte).then(|| self.i += 1)
    }

    pub(super) fn word(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        self.word_here(word)
    }

    /// `word` at the cursor (no whitespace before it).
    #[inline]
    pub(super) fn word_here(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// `None` for `null`, else `read`'s value (the `Option` fields). No
    /// reader takes a value that starts with `n`, so an `n` not starting
    /// a `null` is declined here, as `read` would decline it.
    #[inline]
    pub(super) fn opt<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
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
    pub(super) fn object<const N: usize>(
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

    pub(super) fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
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
    pub(super) fn key<const N: usize>(&mut self, keys: &[&[u8]; N]) -> Option<usize> {
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
    pub(super) fn other_key(&mut self) -> Option<()> {
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
    pub(super) fn raw_str(&mut self) -> Option<(&'a [u8], bool)> {
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
    pub(super) fn close_str(
        &mut self,
        start: usize,
        end: usize,
        ascii: bool,
    ) -> Option<(&'a [u8], bool)> {
        (self.b[end] == b'"').then_some(())?;
        self.i = end + 1;
        Some((&self.b[start..end], ascii))
    }

    /// A string field's value (UTF-8 checked, as serde_json checks it).
    #[inline]
    pub(super) fn text(&mut self) -> Option<Cow<'a, str>> {
        let text = match self.raw_str()? {
            // SAFETY: ASCII bytes are UTF-8.
            (bytes, true) => unsafe { std::str::from_utf8_unchecked(bytes) },
            (bytes, false) => std::str::from_utf8(bytes).ok()?,
        };
        Some(Cow::Borrowed(text))
    }

    pub(super) fn texts(&mut self) -> Option<Vec<Cow<'a, str>>> {
        let mut list = Vec::new();
        self.array(|c| {
            list.push(c.text()?);
            Some(())
        })?;
        Some(list)
    }

    /// Decimal digits into `value` (`None` past `u64`), how many.
    #[inline]
    pub(super) fn digits(&mut self, value: &mut u64) -> Option<usize> {
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
    pub(super) fn number(&mut self) -> Option<Number> {
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
    pub(super) fn opt_number(&mut self) -> Option<Option<Number>> {
        self.opt(Self::number)
    }

    /// A `true`, `false` or `null` field serde reads as `Option<Value>`
    /// (another value: `None`, left to serde's error).
    pub(super) fn opt_bool(&mut self) -> Option<Option<bool>> {
        self.opt(|c| match c.peek()? {
            b't' => c.word(b"true").map(|()| true),
            b'f' => c.word(b"false").map(|()| false),
            _ => None,
        })
    }

    /// An integer field (`opt_integer`), when it is in `T`'s range.
    pub(super) fn opt_integer<T: TryFrom<i128>>(&mut self) -> Option<Option<T>> {
        self.opt(|c| T::try_from(c.integer()?).ok())
    }

    /// An integer field's value, as `integral` makes it of serde's number.
    /// A negative one (`start-time-delta` in every resync entry and in a
    /// replication body sent late) is read when serde reads it as an
    /// `i64`, exactly: `-1` to `-2^63`; `-0` (serde's float) and anything
    /// else negative are declined.
    #[inline]
    pub(super) fn integer(&mut self) -> Option<i128> {
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
    pub(super) fn skip(&mut self, depth: u32) -> Option<()> {
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
}

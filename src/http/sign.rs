//! Signed callbacks, to the Standard Webhooks specification: the signing
//! keys (`[timers] callback-signing-keys`) and the three headers a signed
//! request carries. Pure: no I/O, no clock (the caller passes the time).
//!
//! The rules, as the specification has them:
//! - a key is written `whsec_<base64>` (or the base64 alone); the HMAC key
//!   is the decoded bytes. Padding may be left out. A key must decode to
//!   16 to 64 bytes (the specification asks 24 to 64; 16 bytes, 128 bits,
//!   is the floor of an HMAC key's strength and what some providers issue).
//!   At most 8 keys: every request is signed with each, so a key can be
//!   rotated without a gap (add the new one, move the targets over, drop
//!   the old one).
//! - `webhook-id`: the message's ID, the same on every attempt of one
//!   message, so a target can deduplicate. Chronos's convention is the
//!   timer ID and the sequence ([`MessageId`]: `<timer ID>-<sequence>`).
//! - `webhook-timestamp`: Unix seconds when this attempt is sent (a
//!   target refuses one too far from its own clock, 5 minutes in the
//!   reference libraries).
//! - `webhook-signature`: `v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`
//!   for each key, space-separated.
//!
//! Bounds: signing allocates nothing beyond the [`Headers`] buffer, which a
//! caller may reuse; error messages name a key by its place in the list,
//! never by its text.

use ::ring::hmac;
use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::{DecodeError, DecodeSliceError, Engine};
use std::fmt;
use std::io::Write;

/// The prefix a Standard Webhooks secret is written with.
pub const SECRET_PREFIX: &str = "whsec_";
/// The shortest key accepted, in decoded bytes.
pub const KEY_BYTES_MIN: usize = 16;
/// The longest key accepted, in decoded bytes (the specification's bound).
pub const KEY_BYTES_MAX: usize = 64;
/// Keys signed with at once.
pub const KEYS_MAX: usize = 8;
/// One signature as written: `v1,` and the base64 of 32 bytes.
pub const SIGNATURE_CHARS: usize = 3 + 44;

/// The headers' names, as the specification writes them.
pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Base64 as the reference libraries read a secret: the standard alphabet,
/// padding optional, stray low bits in the last symbol ignored.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// The keys requests are signed with (none: requests are not signed).
#[derive(Clone, Default)]
pub struct SigningKeys {
    keys: Vec<hmac::Key>,
}

impl SigningKeys {
    /// Parse the configured secrets, each `whsec_<base64>` or bare base64.
    /// The error names the key by its place in the list (from 0), not by
    /// its text.
    pub fn parse<S: AsRef<str>>(secrets: &[S]) -> Result<SigningKeys, String> {
        if secrets.len() > KEYS_MAX {
            return Err(format!(
                "{} signing keys: at most {KEYS_MAX} (every request is signed with each)",
                secrets.len()
            ));
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(i, s)| key(s.as_ref()).map_err(|why| format!("signing key {i}: {why}")))
            .collect::<Result<_, _>>()?;
        Ok(SigningKeys { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl fmt::Debug for SigningKeys {
    /// The count only: a key's bytes never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SigningKeys {{ count: {} }}", self.keys.len())
    }
}

/// One secret's HMAC key.
fn key(secret: &str) -> Result<hmac::Key, String> {
    let text = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let mut bytes = [0u8; KEY_BYTES_MAX];
    let len = match LENIENT.decode_slice(text.trim_end_matches('='), &mut bytes) {
        Ok(len) => len,
        Err(DecodeSliceError::OutputSliceTooSmall) => {
            return Err(format!("longer than {KEY_BYTES_MAX} bytes once decoded"))
        }
        Err(DecodeSliceError::DecodeError(e)) => return Err(not_base64(e)),
    };
    if len < KEY_BYTES_MIN {
        return Err(format!(
            "{len} bytes once decoded: at least {KEY_BYTES_MIN} (the specification asks 24 to {KEY_BYTES_MAX})"
        ));
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, &bytes[..len]))
}

/// Why a secret is not base64, without quoting any of it.
fn not_base64(e: DecodeError) -> String {
    let what = "is not base64 (write whsec_ and the standard base64 of the key's bytes)";
    match e {
        DecodeError::InvalidByte(at, _) | DecodeError::InvalidLastSymbol(at, _) => {
            format!("{what}: a character that is not base64 at offset {at} after the prefix")
        }
        DecodeError::InvalidLength(len) => {
            format!("{what}: {len} characters is not a base64 length")
        }
        DecodeError::InvalidPadding => format!("{what}: bad padding"),
    }
}

/// The `webhook-id` of one pop: `<timer ID>-<sequence>`, the same on every
/// attempt of that pop (a later sequence of a repeating timer is another
/// message).
#[derive(Clone, Copy, Debug)]
pub struct MessageId<'a> {
    pub timer_id: &'a str,
    pub sequence: u32,
}

impl fmt::Display for MessageId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}-{}", self.timer_id, self.sequence)
    }
}

/// The three header values of one signed request, in one buffer that a
/// caller may keep and sign into again.
#[derive(Clone, Debug, Default)]
pub struct Headers {
    buf: Vec<u8>,
    id_end: usize,
    timestamp_end: usize,
}

impl Headers {
    /// Sign one attempt: `msg_id` (written with its `Display`, a
    /// [`MessageId`] for a pop), `timestamp_s` (Unix seconds, now) and the
    /// request body, with every key. With no keys the signature is empty
    /// (the caller sends no `webhook-*` header).
    pub fn sign(
        &mut self,
        keys: &SigningKeys,
        msg_id: impl fmt::Display,
        timestamp_s: u64,
        body: &[u8],
    ) {
        self.buf.clear();
        write!(self.buf, "{msg_id}").expect("a Vec takes every write");
        self.id_end = self.buf.len();
        assert!(
            !self.buf.iter().any(|&b| b == b'\r' || b == b'\n'),
            "a message ID goes in a header: the caller's IDs have no line breaks"
        );
        write!(self.buf, "{timestamp_s}").expect("a Vec takes every write");
        self.timestamp_end = self.buf.len();
        for (i, key) in keys.keys.iter().enumerate() {
            let mut ctx = hmac::Context::with_key(key);
            ctx.update(&self.buf[..self.id_end]);
            ctx.update(b".");
            ctx.update(&self.buf[self.id_end..self.timestamp_end]);
            ctx.update(b".");
            ctx.update(body);
            let tag = ctx.sign();
            if i > 0 {
                self.buf.push(b' ');
            }
            self.buf.extend_from_slice(b"v1,");
            let at = self.buf.len();
            self.buf.resize(at + SIGNATURE_CHARS - 3, 0);
            let written = STANDARD
                .encode_slice(tag.as_ref(), &mut self.buf[at..])
                .expect("44 characters hold 32 bytes");
            assert_eq!(written, SIGNATURE_CHARS - 3, "SHA-256 is 32 bytes");
        }
    }

    /// `webhook-id`'s value.
    pub fn id(&self) -> &str {
        self.text(0, self.id_end)
    }

    /// `webhook-timestamp`'s value.
    pub fn timestamp(&self) -> &str {
        self.text(self.id_end, self.timestamp_end)
    }

    /// `webhook-signature`'s value (empty when signed with no key).
    pub fn signature(&self) -> &str {
        self.text(self.timestamp_end, self.buf.len())
    }

    /// The three headers as the client takes them: `(name, value)`.
    pub fn pairs(&self) -> [(&'static str, &[u8]); 3] {
        [
            (ID_HEADER, self.id().as_bytes()),
            (TIMESTAMP_HEADER, self.timestamp().as_bytes()),
            (SIGNATURE_HEADER, self.signature().as_bytes()),
        ]
    }

    fn text(&self, from: usize, to: usize) -> &str {
        std::str::from_utf8(&self.buf[from..to]).expect("written from Display and ASCII")
    }
}

/// Sign one attempt into a new [`Headers`] (see [`Headers::sign`]).
pub fn sign(
    keys: &SigningKeys,
    msg_id: impl fmt::Display,
    timestamp_s: u64,
    body: &[u8],
) -> Headers {
    let mut headers = Headers::default();
    headers.sign(keys, msg_id, timestamp_s, body);
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's example (and its reference libraries' tests).
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: u64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    /// Another key: 32 bytes, 0 to 31.
    const OTHER: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn keys(secrets: &[&str]) -> SigningKeys {
        SigningKeys::parse(secrets).expect("valid keys")
    }

    #[test]
    fn the_specification_test_vector() {
        let h = sign(&keys(&[SECRET]), MSG_ID, TIMESTAMP, BODY);
        assert_eq!(h.id(), MSG_ID);
        assert_eq!(h.timestamp(), "1614265330");
        assert_eq!(h.signature(), EXPECTED);
        assert_eq!(
            h.pairs(),
            [
                ("webhook-id", MSG_ID.as_bytes()),
                ("webhook-timestamp", &b"1614265330"[..]),
                ("webhook-signature", EXPECTED.as_bytes()),
            ]
        );
    }

    #[test]
    fn the_prefix_and_the_padding_are_optional() {
        let bare = SECRET.strip_prefix(SECRET_PREFIX).unwrap();
        let other_unpadded = OTHER.trim_end_matches('=');
        let other_bare = other_unpadded.strip_prefix(SECRET_PREFIX).unwrap();
        for (a, b) in [(SECRET, bare), (OTHER, other_unpadded), (OTHER, other_bare)] {
            let one = sign(&keys(&[a]), MSG_ID, TIMESTAMP, BODY);
            let two = sign(&keys(&[b]), MSG_ID, TIMESTAMP, BODY);
            assert_eq!(one.signature(), two.signature(), "{b}");
        }
    }

    #[test]
    fn every_key_signs_in_order_space_separated() {
        let both = sign(&keys(&[SECRET, OTHER]), MSG_ID, TIMESTAMP, BODY);
        let other = sign(&keys(&[OTHER]), MSG_ID, TIMESTAMP, BODY);
        assert_eq!(
            both.signature(),
            format!("{EXPECTED} {}", other.signature())
        );
        assert_eq!(other.signature().len(), SIGNATURE_CHARS);
        assert_ne!(other.signature(), EXPECTED);
        let none = sign(&SigningKeys::default(), MSG_ID, TIMESTAMP, BODY);
        assert_eq!((none.id(), none.signature()), (MSG_ID, ""));
    }

    #[test]
    fn the_signature_covers_id_timestamp_and_body() {
        let k = keys(&[SECRET]);
        for (id, ts, body) in [
            ("msg_p5jXN8AQM9LWM0D4loKWxJeK", TIMESTAMP, BODY),
            (MSG_ID, TIMESTAMP + 1, BODY),
            (MSG_ID, TIMESTAMP, &br#"{"test": 2432232315}"#[..]),
        ] {
            assert_ne!(sign(&k, id, ts, body).signature(), EXPECTED);
        }
    }

    #[test]
    fn a_kept_buffer_signs_again_without_leftovers() {
        let mut h = sign(&keys(&[SECRET, OTHER]), "long-message-id-1", 99, b"x");
        h.sign(&keys(&[SECRET]), MSG_ID, TIMESTAMP, BODY);
        assert_eq!(
            (h.id(), h.timestamp(), h.signature()),
            (MSG_ID, "1614265330", EXPECTED)
        );
    }

    #[test]
    fn the_message_id_is_the_timer_and_the_sequence() {
        let id = MessageId {
            timer_id: "0000000000000001000000000000002a",
            sequence: 3,
        };
        assert_eq!(id.to_string(), "0000000000000001000000000000002a-3");
        let h = sign(&keys(&[SECRET]), id, 1, b"");
        assert_eq!(h.id(), "0000000000000001000000000000002a-3");
    }

    #[test]
    fn bad_keys_are_refused_by_place_never_quoted() {
        let short = "whsec_AAECAwQFBgcICQoLDA0O"; // 15 bytes
        let long = format!("whsec_{}", STANDARD.encode([7u8; KEY_BYTES_MAX + 1]));
        let table: &[(&[&str], &str)] = &[
            (&["whsec_not!base64secret"], "signing key 0: is not base64"),
            (&[SECRET, "whsec_"], "signing key 1: 0 bytes once decoded"),
            (&[short], "15 bytes once decoded: at least 16"),
            (&[long.as_str()], "longer than 64 bytes"),
            (&["whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY*"], "offset 32"),
            (&[SECRET; KEYS_MAX + 1], "9 signing keys: at most 8"),
        ];
        for &(secrets, want) in table {
            let err = SigningKeys::parse(secrets).expect_err(want);
            assert!(err.contains(want), "{err:?} lacks {want:?}");
            assert!(!err.contains("Mf") && !err.contains("QUJD"), "{err}");
        }
        let exact = format!("whsec_{}", STANDARD.encode([7u8; KEY_BYTES_MAX]));
        let sixteen = "whsec_AAECAwQFBgcICQoLDA0ODw";
        assert_eq!(keys(&[exact.as_str(), sixteen]).len(), 2);
        assert_eq!(format!("{:?}", keys(&[SECRET])), "SigningKeys { count: 1 }");
        assert!(keys(&[]).is_empty());
    }
}

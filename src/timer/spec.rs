//! The timer JSON of seed 000: parsing and validation.
//!
//! Parsing borrows from the request body (strings are copied only when they
//! contain escapes). Every rejection carries a reason for the `400` body.

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

mod delivery;
mod fast;
mod timing;

pub use super::ms_of_seconds;

pub use delivery::{AttemptState, Delivery};
pub use timing::Timing;

/// The longest callback URI accepted.
pub const URI_BYTES_MAX: usize = 8 * 1024;
/// Tags per timer.
pub const TAGS_MAX: usize = 32;
/// Replicas named in a replication body.
pub const REPLICAS_MAX: usize = super::NODES_MAX;
/// Sites named in a replication body.
pub const SITES_LISTED_MAX: usize = 16;

/// A validated timer definition, public or internal (replication) form.
#[derive(Clone, Debug, PartialEq)]
pub struct TimerSpec<'a> {
    pub interval_ms: u32,
    pub repeat_for_ms: u32,
    /// Empty for a tombstone (replication form only).
    pub uri: Cow<'a, str>,
    pub opaque: Cow<'a, str>,
    pub replication_factor: Option<u8>,
    pub tags: Vec<(Cow<'a, str>, u32)>,
    /// `callback.retry` and `callback.dead-letter` (issue 41).
    /// Boxed: rare, and every spec would carry its bytes otherwise.
    pub delivery: Option<Box<Delivery<'a>>>,
    /// `timing.at`, `start-at` or `cron` (issue 42; `spec/timing.rs`).
    /// Boxed, as `delivery`.
    pub timing: Option<Box<Timing<'a>>>,
    /// Present when the body carries `reliability.replicas` (a message from
    /// a node of this site, applied locally and never forwarded again) or
    /// only `reliability.sites` (from another site: this site places it).
    pub replication: Option<Replication<'a>>,
}

/// The internal-API fields of a replication `PUT`.
#[derive(Clone, Debug, PartialEq)]
pub struct Replication<'a> {
    pub start_time_delta_ms: i64,
    /// The incarnation's version, when the sender is a chronos of this project.
    pub version_us: Option<u64>,
    pub sequence_number: u32,
    pub cluster_view_id: Option<Cow<'a, str>>,
    pub replicas: Vec<Cow<'a, str>>,
    pub sites: Vec<Cow<'a, str>>,
    /// `reliability.only-newer`: apply only over an older version.
    pub only_newer: bool,
    /// `delivery-state`: a report of one pop's attempts, not a change of
    /// the timer (issue 41).
    /// Boxed: rare, and every replication body would carry its bytes.
    pub attempt: Option<Box<AttemptState>>,
}

impl TimerSpec<'_> {
    /// A tombstone: a replication body with an empty callback.
    pub fn is_tombstone(&self) -> bool {
        self.uri.is_empty()
    }

    /// A copy that owns its strings, to cross to another core.
    pub fn into_owned(self) -> TimerSpec<'static> {
        fn own(c: Cow<'_, str>) -> Cow<'static, str> {
            Cow::Owned(c.into_owned())
        }
        TimerSpec {
            interval_ms: self.interval_ms,
            repeat_for_ms: self.repeat_for_ms,
            uri: own(self.uri),
            opaque: own(self.opaque),
            replication_factor: self.replication_factor,
            tags: self.tags.into_iter().map(|(t, c)| (own(t), c)).collect(),
            delivery: self.delivery.map(|d| Box::new(d.into_owned())),
            timing: self.timing.map(|t| Box::new(t.into_owned())),
            replication: self.replication.map(|r| Replication {
                start_time_delta_ms: r.start_time_delta_ms,
                version_us: r.version_us,
                sequence_number: r.sequence_number,
                cluster_view_id: r.cluster_view_id.map(own),
                replicas: r.replicas.into_iter().map(own).collect(),
                sites: r.sites.into_iter().map(own).collect(),
                only_newer: r.only_newer,
                attempt: r.attempt,
            }),
        }
    }
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "a JSON object")]
struct RawTimer<'a> {
    timing: Option<RawTiming>,
    #[serde(borrow)]
    callback: Option<RawCallback<'a>>,
    #[serde(borrow)]
    reliability: Option<RawReliability<'a>>,
    #[serde(borrow)]
    statistics: Option<RawStatistics<'a>>,
    #[serde(rename = "delivery-state")]
    delivery_state: Option<Box<delivery::RawState>>,
}

impl RawTimer<'_> {
    fn empty() -> Self {
        RawTimer {
            timing: None,
            callback: None,
            reliability: None,
            statistics: None,
            delivery_state: None,
        }
    }
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "timing to be an object")]
struct RawTiming {
    // `Value`, not `Number`, so a wrong type gets a reason naming the field.
    interval: Option<serde_json::Value>,
    #[serde(rename = "repeat-for")]
    repeat_for: Option<serde_json::Value>,
    #[serde(rename = "start-time-delta", default, deserialize_with = "opt_integer")]
    start_time_delta: Option<i64>,
    #[serde(rename = "sequence-number", default, deserialize_with = "opt_integer")]
    sequence_number: Option<u32>,
    /// This project's extension: the incarnation's version (wall-clock µs of
    /// the client operation that made it), identical on every replica.
    #[serde(default, deserialize_with = "opt_integer")]
    version: Option<u64>,
    // Issue 42 (`spec/timing.rs`): boxed, so a body without them pays a
    // pointer each. `Value`, so a wrong type gets a reason naming the field.
    at: Option<Box<serde_json::Value>>,
    #[serde(rename = "start-at")]
    start_at: Option<Box<serde_json::Value>>,
    cron: Option<Box<serde_json::Value>>,
    #[serde(rename = "time-zone")]
    time_zone: Option<Box<serde_json::Value>>,
    /// Between nodes: the absolute start of a timer with `at`, `start-at`
    /// or `cron` (wall-clock Unix ms).
    #[serde(rename = "start-unix-ms", default, deserialize_with = "opt_integer")]
    start_unix_ms: Option<i64>,
    /// Between nodes: a cron timer's cursor (`timer/timing.rs`), in ms.
    #[serde(rename = "cron-cursor-ms", default, deserialize_with = "opt_integer")]
    cron_cursor_ms: Option<u32>,
}

/// `callback`: one key naming the mechanism. Only `http` is supported; an
/// empty object is a tombstone's callback.
#[derive(Debug, PartialEq)]
struct RawCallback<'a> {
    http: Option<RawHttp<'a>>,
    other: Option<String>,
    /// Boxed, as the fields below: rare, and every body's raw struct
    /// would carry their bytes (their zeroing and moves cost a `POST`).
    retry: Option<Box<crate::timer::retry::RawRetry>>,
    dead_letter: Option<Box<crate::timer::retry::RawDeadLetter>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "callback.http to be an object with uri and opaque")]
struct RawHttp<'a> {
    #[serde(borrow, default, deserialize_with = "opt_text")]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_text")]
    opaque: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for RawCallback<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawCallback<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object such as {\"http\": {...}}")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut out = RawCallback {
                    http: None,
                    other: None,
                    retry: None,
                    dead_letter: None,
                };
                while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
                    if key == "http" {
                        out.http = Some(map.next_value()?);
                    } else if key == "retry" {
                        // `null` is as if absent, as for every optional key.
                        out.retry = map.next_value()?;
                    } else if key == "dead-letter" {
                        out.dead_letter = map.next_value()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                        out.other.get_or_insert_with(|| key.into_owned());
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A string that borrows from the body when it has no escapes: serde's
/// `Cow<str>` alone always copies, and `#[serde(borrow)]` does not reach
/// inside an `Option` (a copy per field per request).
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

fn opt_text<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    Ok(Option::<Text<'a>>::deserialize(d)?.map(|t| t.0))
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "reliability to be an object")]
struct RawReliability<'a> {
    #[serde(rename = "replication-factor")]
    replication_factor: Option<serde_json::Value>,
    #[serde(
        rename = "cluster-view-id",
        borrow,
        default,
        deserialize_with = "opt_text"
    )]
    cluster_view_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    replicas: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow)]
    sites: Option<Vec<Cow<'a, str>>>,
    #[serde(rename = "only-newer")]
    only_newer: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "statistics to be an object")]
struct RawStatistics<'a> {
    #[serde(rename = "tag-info", borrow)]
    tag_info: Option<Vec<RawTag<'a>>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(expecting = "each statistics.tag-info entry to be an object with type and count")]
struct RawTag<'a> {
    #[serde(rename = "type", borrow, default, deserialize_with = "opt_text")]
    kind: Option<Cow<'a, str>>,
    count: Option<serde_json::Value>,
}

/// A JSON number without a fraction as an integer: JSON has one number
/// type and JSON Schema's `integer` is any number without a fraction, so
/// `53.0` is 53 (a client that writes every number as a float is
/// understood). `None` for a fraction, or a float beyond ±2^53: there an
/// f64 is no longer exact, and an integer too large for `u64` or `i64`
/// (`-9223372036854775809`) reaches here as its rounded float. ±2^53
/// itself is accepted: it is exact, and JSON Schema's `integer` (the
/// OpenAPI description, schemathesis in CI) counts `-9007199254740992.0`
/// as one; only a float written just past it (`9007199254740993.0`)
/// would be read as it, one off.
pub fn integral(n: &serde_json::Number) -> Option<i128> {
    if let Some(u) = n.as_u64() {
        return Some(u.into());
    }
    if let Some(i) = n.as_i64() {
        return Some(i.into());
    }
    let f = n.as_f64()?;
    let exact = 9_007_199_254_740_992.0; // 2^53
    (f.fract() == 0.0 && f.abs() <= exact).then_some(f as i128)
}

/// `integral` in `T`'s range, as a serde field (`deserialize_with`).
pub fn integer<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    integral(&n)
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("{n} is not an integer in range")))
}

/// [`integer`] for an optional field (absent or `null`: `None`).
fn opt_integer<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<T>, D::Error> {
    #[derive(Deserialize)]
    struct Int<T: TryFrom<i128>>(#[serde(deserialize_with = "integer")] T);
    Ok(Option::<Int<T>>::deserialize(d)?.map(|i| i.0))
}

/// A positive integer within `u64` (`integral`), from a JSON value.
fn positive(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => integral(n)
            .and_then(|i| u64::try_from(i).ok())
            .filter(|u| *u >= 1),
        _ => None,
    }
}

/// The longest interval or repeat-for, in seconds: `u32::MAX` ms.
const SECONDS_MAX: f64 = 4_294_967.295;

/// Seconds (integer or fractional) to whole milliseconds, never rounding a
/// value down below what was asked.
fn seconds_to_ms(field: &str, value: &serde_json::Value) -> Result<u32, String> {
    let n = match value {
        serde_json::Value::Number(n) => n,
        _ => return Err(format!("{field} must be a number of seconds")),
    };
    if let Some(u) = n.as_u64() {
        return u
            .checked_mul(1000)
            .and_then(|ms| u32::try_from(ms).ok())
            .ok_or_else(|| format!("{field} is too large (at most {} s)", seconds(u32::MAX)));
    }
    let secs = n
        .as_f64()
        .ok_or_else(|| format!("{field} must be a number of seconds"))?;
    if secs < 0.0 {
        return Err(format!("{field} must not be negative"));
    }
    // u32::MAX ms, compared in seconds as the description's `maximum` is
    // (the rounding below took 4294967.295000001 s for 2^32 - 1 ms).
    if secs > SECONDS_MAX {
        return Err(format!(
            "{field} is too large (at most {} s)",
            seconds(u32::MAX)
        ));
    }
    let ms = ms_of_seconds(secs);
    // A positive interval far below a millisecond (5e-324) is 1 ms, not 0:
    // 0 means "once, at once" and refuses a repeat-for.
    let ms = if secs > 0.0 { ms.max(1.0) } else { ms };
    if ms > u32::MAX as f64 {
        return Err(format!(
            "{field} is too large (at most {} s)",
            seconds(u32::MAX)
        ));
    }
    Ok(ms as u32)
}

/// Checks a callback URI (the HTTP layer's parser, handed in by the
/// caller: this module knows no transport). `Err` says what is wrong.
pub type CheckUri = fn(&str) -> Result<(), String>;

/// Parse and validate a timer body; `check_uri` validates the callback URI.
pub fn parse(body: &[u8], check_uri: CheckUri) -> Result<TimerSpec<'_>, String> {
    // Read into one place and validated from there: the raw structs
    // (~350 bytes) returned by value were copied twice on the way.
    let mut raw = RawTimer::empty();
    read_into(body, true, &mut raw)?;
    validate(&mut raw, check_uri)
}

/// [`parse`] of the timer object at the start of `text` (after
/// whitespace), which more text may follow (a timer inside a larger
/// document, such as a resync page's entry): `None` when the single-pass
/// reader declines it (the caller then reads the document as before);
/// else the verdict [`parse`] gives the object's bytes, and how many
/// bytes it took (the reader never looks past the object's last byte).
pub fn parse_prefix(
    text: &[u8],
    check_uri: CheckUri,
) -> Option<(Result<TimerSpec<'_>, String>, usize)> {
    let mut raw = RawTimer::empty();
    let used = fast::read_prefix(text, &mut raw)?;
    Some((validate(&mut raw, check_uri), used))
}

/// [`parse`] with serde alone (no fast reader), for the differential
/// fuzz target and tests.
#[doc(hidden)]
pub fn parse_serde_only(body: &[u8], check_uri: CheckUri) -> Result<TimerSpec<'_>, String> {
    validate(&mut read(body, false)?, check_uri)
}

/// `None` when the fast reader declines `body`; else whether what it read
/// equals serde's reading (which must then succeed): `Some(false)` is a
/// bug.
#[doc(hidden)]
pub fn fast_reader_agrees(body: &[u8]) -> Option<bool> {
    let fast = fast::raw_timer(body)?;
    Some(read(body, false).is_ok_and(|raw| raw == fast))
}

/// The body's JSON, as the raw structs; `fast`: try the single-pass
/// reader first (`fast.rs`), serde when it declines.
fn read(body: &[u8], fast: bool) -> Result<RawTimer<'_>, String> {
    let mut raw = RawTimer::empty();
    read_into(body, fast, &mut raw)?;
    Ok(raw)
}

/// [`read`] into `raw` (empty), where it stays.
fn read_into<'a>(body: &'a [u8], fast: bool, raw: &mut RawTimer<'a>) -> Result<(), String> {
    // serde would also accept a struct written as an array; the API wants an object.
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => return Err("invalid JSON body: the body is empty; expected a JSON object".into()),
        Some(_) => return Err("invalid JSON body: expected a JSON object".into()),
    }
    // The fast reader may leave `raw` half filled when it declines:
    // serde's reading replaces all of it.
    if fast && fast::read_into(body, raw).is_some() {
        return Ok(());
    }
    *raw = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    Ok(())
}

/// The raw body's fields checked and converted.
/// Takes the strings it keeps out of `raw`.
fn validate<'a>(raw: &mut RawTimer<'a>, check_uri: CheckUri) -> Result<TimerSpec<'a>, String> {
    let timing = raw.timing.as_ref().ok_or("missing timing object")?;
    let (interval_ms, repeat_for_ms, mut replication, calendar) = parse_all_timing(timing, raw)?;
    let attempt = delivery::parse_state(raw)?;
    if let Some(r) = replication.as_mut() {
        r.attempt = attempt.map(Box::new);
    }
    let mut callback = raw.callback.take();
    let policy = callback
        .as_mut()
        .map(|c| (c.retry.take(), c.dead_letter.take()));
    let (uri, opaque) = parse_callback(callback, replication.is_some(), check_uri)?;
    // Checked in every body, as the description says; kept only with a
    // callback (a tombstone has nothing to deliver).
    let delivery = match policy {
        Some((None, None)) | None => None,
        Some((retry, dead_letter)) => delivery::parse_policy(retry, dead_letter, check_uri)?,
    };
    let delivery = delivery.filter(|_| !uri.is_empty()).map(Box::new);
    let replication_factor = parse_factor(raw.reliability.as_ref())?;
    let tags = match raw.statistics.take() {
        Some(stats) => parse_tags(stats)?,
        None => Vec::new(),
    };
    assert!(
        !uri.is_empty() || replication.is_some(),
        "only a replication body may have no callback"
    );
    Ok(TimerSpec {
        interval_ms,
        repeat_for_ms,
        uri,
        opaque,
        replication_factor,
        tags,
        delivery,
        timing: calendar,
        replication,
    })
}

/// The timing keys and the internal-API fields: `interval` and
/// `repeat-for` in ms, the replication fields, the wall-clock or
/// calendar timing (read only when the body names one of its keys).
#[allow(clippy::type_complexity)]
fn parse_all_timing<'a>(
    timing: &RawTiming,
    raw: &RawTimer<'a>,
) -> Result<
    (
        u32,
        u32,
        Option<Replication<'a>>,
        Option<Box<Timing<'static>>>,
    ),
    String,
> {
    if !timing::present(timing) {
        let (interval_ms, repeat_for_ms) = parse_timing(timing)?;
        let replication = parse_replication(timing, raw.reliability.as_ref())?;
        return Ok((interval_ms, repeat_for_ms, replication, None));
    }
    let replication = parse_replication(timing, raw.reliability.as_ref())?;
    let (t, interval_ms, repeat_for_ms) = timing::parse(timing, replication.is_some())?;
    Ok((interval_ms, repeat_for_ms, replication, Some(Box::new(t))))
}

/// `(interval, repeat-for)` in ms; `repeat-for` defaults to the interval.
fn parse_timing(timing: &RawTiming) -> Result<(u32, u32), String> {
    let interval = timing
        .interval
        .as_ref()
        .filter(|v| !v.is_null())
        .ok_or("missing timing.interval")?;
    let interval_ms = seconds_to_ms("timing.interval", interval)?;
    let repeat_for_ms = match &timing.repeat_for {
        Some(v) if !v.is_null() => seconds_to_ms("timing.repeat-for", v)?,
        _ => interval_ms,
    };
    // The reference's rule: a zero interval with a repeat-for would pop
    // for ever at once. (A repeat-for below a positive interval is
    // accepted and never pops, as in the reference: seed 000.)
    if interval_ms == 0 && repeat_for_ms > 0 {
        return Err(format!(
            "timing.interval 0 with timing.repeat-for {}: a repeating timer needs a positive interval (interval 0 pops once, at once, with no repeat-for or repeat-for 0)",
            seconds(repeat_for_ms)
        ));
    }
    Ok((interval_ms, repeat_for_ms))
}

/// Milliseconds as the seconds a client writes (`1500` → `1.5`).
fn seconds(ms: u32) -> String {
    match ms % 1000 {
        0 => (ms / 1000).to_string(),
        frac => {
            let text = format!("{}.{frac:03}", ms / 1000);
            text.trim_end_matches('0').to_string()
        }
    }
}

/// The internal-API fields, when the body names `reliability.replicas`.
fn parse_replication<'a>(
    timing: &RawTiming,
    reliability: Option<&RawReliability<'a>>,
) -> Result<Option<Replication<'a>>, String> {
    let Some(RawReliability {
        replicas,
        cluster_view_id,
        sites,
        only_newer,
        ..
    }) = reliability
    else {
        return Ok(None);
    };
    // Checked in every body (a client's too, where it is then ignored).
    let only_newer = match only_newer {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => return Err("reliability.only-newer must be true or false".into()),
    };
    // An empty list is never a replication body, whatever `sites` says
    // (nodes leave an empty list out; `"replicas": [], "sites": []` used
    // to pass as a cross-site body with no site).
    if replicas
        .as_ref()
        .is_some_and(|r| r.is_empty() || r.len() > REPLICAS_MAX)
    {
        return Err(format!(
            "reliability.replicas must list 1 to {REPLICAS_MAX} nodes"
        ));
    }
    // A body from another site (GR) names `sites` but no `replicas`: the
    // receiving site places it among its own nodes.
    let none = Vec::new();
    let replicas = match (replicas, sites) {
        (Some(r), _) => r,
        (None, Some(s)) if !s.is_empty() => &none,
        (None, _) => return Ok(None),
    };
    if sites.as_ref().is_some_and(|s| s.len() > SITES_LISTED_MAX) {
        return Err(format!(
            "reliability.sites lists more than {SITES_LISTED_MAX} sites"
        ));
    }
    Ok(Some(Replication {
        start_time_delta_ms: timing.start_time_delta.unwrap_or(0),
        version_us: timing.version,
        sequence_number: timing.sequence_number.unwrap_or(0),
        cluster_view_id: cluster_view_id.clone(),
        replicas: replicas.clone(),
        sites: sites.clone().unwrap_or_default(),
        only_newer,
        attempt: None,
    }))
}

/// `(uri, opaque)`; both empty only in a replication body (a tombstone).
fn parse_callback<'a>(
    callback: Option<RawCallback<'a>>,
    replication: bool,
    check_uri: CheckUri,
) -> Result<(Cow<'a, str>, Cow<'a, str>), String> {
    let callback = callback.ok_or("missing callback object")?;
    let (uri, opaque) = match (callback.http, callback.other) {
        (Some(http), _) => {
            let uri = http.uri.ok_or("missing callback.http.uri")?;
            (uri, http.opaque.unwrap_or(Cow::Borrowed("")))
        }
        (None, Some(other)) => {
            return Err(format!(
                "unsupported callback type {other:?}: only \"http\" callbacks are supported"
            ))
        }
        (None, None) if replication => (Cow::Borrowed(""), Cow::Borrowed("")),
        (None, None) => return Err("callback must contain an \"http\" object".into()),
    };
    if uri.is_empty() {
        if !replication {
            return Err("callback.http.uri must not be empty".into());
        }
    } else {
        validate_uri(&uri, check_uri)?;
    }
    Ok((uri, opaque))
}

fn parse_factor(reliability: Option<&RawReliability>) -> Result<Option<u8>, String> {
    let Some(n) = reliability.and_then(|r| r.replication_factor.as_ref()) else {
        return Ok(None);
    };
    match positive(n) {
        Some(f) => Ok(Some(f.min(super::NODES_MAX as u64) as u8)),
        None => Err("reliability.replication-factor must be a positive integer".into()),
    }
}

fn parse_tags(stats: RawStatistics<'_>) -> Result<Vec<(Cow<'_, str>, u32)>, String> {
    let list = stats.tag_info.unwrap_or_default();
    if list.len() > TAGS_MAX {
        return Err(format!("statistics.tag-info has more than {TAGS_MAX} tags"));
    }
    let mut tags = Vec::with_capacity(list.len());
    for tag in list {
        let kind = tag
            .kind
            .ok_or("statistics.tag-info entry is missing its type")?;
        // Characters, as the reason says and JSON Schema's `maxLength`
        // counts (at most 1 KiB of UTF-8); the length check first skips
        // the count for what cannot fit.
        if kind.is_empty() || kind.len() > 4 * 256 || kind.chars().count() > 256 {
            return Err("statistics.tag-info type must be 1 to 256 characters".into());
        }
        let count = match tag.count {
            None => 1,
            Some(n) => match positive(&n) {
                Some(c) if c <= u32::MAX as u64 => c as u32,
                _ => {
                    return Err(format!(
                        "statistics.tag-info count for {kind:?} must be a positive integer"
                    ))
                }
            },
        };
        tags.push((kind, count));
    }
    assert!(tags.len() <= TAGS_MAX, "the codec keeps to TAGS_MAX");
    Ok(tags)
}

fn validate_uri(uri: &str, check_uri: CheckUri) -> Result<(), String> {
    if uri.len() > URI_BYTES_MAX {
        return Err(format!(
            "callback.http.uri is longer than {URI_BYTES_MAX} bytes"
        ));
    }
    check_uri(uri).map_err(|e| format!("callback.http.uri {e}"))
}

#[cfg(test)]
mod tests;

//! `Idempotency-Key` on `POST /timers` (issue 42, item 4; the IETF draft
//! "The Idempotency-Key HTTP Header Field").
//!
//! The key names the timer: its ID's unique part is a hash of the key
//! (`shard::lookup::idempotent_unique`), the same on every node, so a
//! retry through any node finds what the first request made. The second
//! request is compared with the timer as stored, by the fields a client
//! writes (`timing`, `callback`, `reliability`, `statistics`):
//! - the same: `200` with the same `Location`, and nothing changes;
//! - another body: `422`, and nothing changes;
//! - the timer's tombstone (deleted, or ended) is still held: `200` with
//!   its `Location`, and nothing is created again (a tombstone keeps no
//!   body to compare).
//!
//! The window is therefore as long as the timer or its tombstone lives
//! (`tombstone-ms`, or a repeating timer's whole life). With none held by
//! this node or any node the key's ID names, the request creates the
//! timer as a `PUT` of that ID does. Two first requests with one key
//! racing through two nodes make one timer (one ID); with different
//! bodies the conflict rules keep one of them.
//!
//! Limits: the probe carries no replica filter, so it finds copies placed
//! under this view and the one before; a retry after two reloads that
//! moved the timer may make it again. A held tombstone answers the
//! `Location` the body would be placed at now. The factor compared is
//! each node's default where the body names none: nodes should agree.
//!
//! Bounds: a key is 1 to 255 visible ASCII characters; a look-up asks at
//! most the nodes that may hold the ID (`api/lookup.rs`).

use super::lookup::{ask_others, Elsewhere, Lookups, RECOVERING};
use crate::shard::lookup::{idempotent_unique, Found};
use crate::shard::{OpError, Shard};
use crate::timer::{TimerId, TimerSpec};

/// The longest key taken, in bytes.
pub const KEY_BYTES_MAX: usize = 255;

/// A `POST /timers` with `Idempotency-Key: key`: the timer's ID, or why
/// not (`400` a bad key, `422` the key with another body, `503` no node
/// that may hold it answered).
pub async fn create(
    lookups: &Lookups,
    shard: &Shard,
    key: &[u8],
    spec: &TimerSpec<'_>,
) -> Result<TimerId, OpError> {
    check_key(key)?;
    if shard.recovering() {
        return Err(OpError::new(503, RECOVERING));
    }
    let unique = idempotent_unique(key);
    let probe = TimerId { unique, bloom: 0 };
    // A tombstone here is not the last word: the node that took the
    // first request keeps one where it is not a replica.
    let (body, tombstone_here) = match shard.look_up(probe).await {
        Found::Live(body) => (Some(body), false),
        Found::Deleted => (None, true),
        Found::Absent => (None, false),
    };
    let body = match body {
        Some(body) => body,
        None => match ask_others(lookups, shard, probe).await {
            Ok(Elsewhere::Live(body)) => body,
            Ok(Elsewhere::Deleted) => return Ok(shard.placed_id(unique, spec)),
            Ok(Elsewhere::Absent) if tombstone_here => return Ok(shard.placed_id(unique, spec)),
            Ok(Elsewhere::Absent) => {
                shard.storage_admits_growth()?;
                return shard.client_update(probe, spec.clone()).await;
            }
            Err(reason) => return Err(OpError::new(503, reason)),
        },
    };
    same_or_refused(shard, &body, spec)
}

/// The stored timer's ID if its client fields are `spec`'s; `422` if not.
fn same_or_refused(shard: &Shard, body: &str, spec: &TimerSpec<'_>) -> Result<TimerId, OpError> {
    let stored: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| OpError::new(503, format!("a node's look-up answer is not JSON: {e}")))?;
    let id = stored["id"]
        .as_str()
        .and_then(|t| TimerId::parse(t.as_bytes()))
        .ok_or_else(|| OpError::new(503, "a node's look-up answer has no timer ID"))?;
    let stored = client_fields_of(&stored);
    match stored == shard.client_fields(spec) {
        true => Ok(id),
        false => Err(OpError::new(
            422,
            "this Idempotency-Key was used with another request body: nothing was changed",
        )),
    }
}

/// The client's fields of a look-up answer (`stored`, maybe another
/// node's, of any shape), tags in name order, as `client_fields` writes a
/// request's.
fn client_fields_of(stored: &serde_json::Value) -> serde_json::Value {
    let mut fields = serde_json::Map::new();
    for key in ["timing", "callback", "reliability", "statistics"] {
        fields.insert(key.to_string(), stored[key].clone());
    }
    let mut stored = serde_json::Value::Object(fields);
    // `get_mut`, not indexing: the answer may be another node's, and
    // serde_json's `IndexMut` panics on a value of another type.
    let tags = stored
        .get_mut("statistics")
        .and_then(|s| s.get_mut("tag-info"))
        .and_then(|t| t.as_array_mut());
    if let Some(tags) = tags {
        tags.sort_by(|a, b| {
            let key = |v: &serde_json::Value| {
                (v["type"].as_str().map(str::to_owned), v["count"].as_u64())
            };
            key(a).cmp(&key(b))
        });
    }
    stored
}

/// A key: 1 to [`KEY_BYTES_MAX`] visible ASCII characters.
fn check_key(key: &[u8]) -> Result<(), OpError> {
    let visible = key.iter().all(|b| (0x21..=0x7e).contains(b));
    match !key.is_empty() && key.len() <= KEY_BYTES_MAX && visible {
        true => Ok(()),
        false => Err(OpError::new(
            400,
            format!("Idempotency-Key must be 1 to {KEY_BYTES_MAX} visible ASCII characters"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_short_visible_ascii() {
        assert!(check_key(b"order-42").is_ok());
        assert!(check_key(b"\"quoted\"").is_ok());
        assert_eq!(check_key(b"").unwrap_err().status, 400);
        assert_eq!(check_key(b"a b").unwrap_err().status, 400);
        assert_eq!(check_key(&[b'k'; 256]).unwrap_err().status, 400);
        assert_eq!(check_key("é".as_bytes()).unwrap_err().status, 400);
    }

    #[test]
    fn an_answer_of_any_shape_is_compared_without_a_panic() {
        for body in [
            r#"{"statistics":1}"#,
            r#"{"statistics":{"tag-info":7}}"#,
            "[]",
            "3",
        ] {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            let fields = client_fields_of(&v);
            assert!(fields.get("timing").is_some(), "{body}");
        }
        let v = serde_json::json!({"statistics": {"tag-info": [
            {"type": "B", "count": 1}, {"type": "A", "count": 2}, {"type": "A", "count": 1}
        ]}});
        let sorted = &client_fields_of(&v)["statistics"]["tag-info"];
        assert_eq!(sorted[0], serde_json::json!({"type": "A", "count": 1}));
        assert_eq!(sorted[2], serde_json::json!({"type": "B", "count": 1}));
    }
}

//! The header codec: the two chronos headers an input message must carry,
//! and the other headers as they are stored in the table and relayed.

use super::deadline;

/// The two headers every input message needs.
pub const HEADER_ID: &str = "chronosMessageId";
pub const HEADER_DEADLINE: &str = "chronosDeadline";
/// Longest message ID (the table's `varchar(128)`).
pub const ID_CHARS_MAX: usize = 128;

/// A message's headers as received: name and value (`None`: no value).
pub type HeaderList = Vec<(String, Option<Vec<u8>>)>;

/// Check the chronos headers: `(id, deadline in Unix µs)`.
pub fn validate(headers: &[(String, Option<Vec<u8>>)]) -> Result<(String, i64), String> {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref())
    };
    let id = match find(HEADER_ID) {
        None => return Err(format!("no {HEADER_ID} header")),
        Some(None) => return Err(format!("{HEADER_ID} header has no value")),
        Some(Some(v)) => std::str::from_utf8(v)
            .map_err(|_| format!("{HEADER_ID} is not UTF-8"))?
            .to_string(),
    };
    if id.is_empty() || id.chars().count() > ID_CHARS_MAX {
        return Err(format!(
            "{HEADER_ID} must be 1 to {ID_CHARS_MAX} characters"
        ));
    }
    let deadline = match find(HEADER_DEADLINE) {
        None => return Err(format!("no {HEADER_DEADLINE} header (message {id})")),
        Some(None) => {
            return Err(format!(
                "{HEADER_DEADLINE} header has no value (message {id})"
            ))
        }
        Some(Some(v)) => std::str::from_utf8(v)
            .map_err(|_| format!("{HEADER_DEADLINE} is not UTF-8 (message {id})"))?,
    };
    let us = deadline::parse_unix_us(deadline).map_err(|e| format!("{e} (message {id})"))?;
    assert!(!id.is_empty() && id.chars().count() <= ID_CHARS_MAX);
    Ok((id, us))
}

/// Headers as stored: `[{"name": "value"}, ...]` (a value that is not
/// UTF-8 is stored lossily; a valueless header as `null`).
pub fn headers_json(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Some(b) => serde_json::Value::String(String::from_utf8_lossy(b).into_owned()),
                None => serde_json::Value::Null,
            };
            let mut o = serde_json::Map::new();
            o.insert(k.clone(), value);
            serde_json::Value::Object(o)
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

pub fn parse_headers_json(text: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in list {
        if let serde_json::Value::Object(o) = item {
            for (k, v) in o {
                let value = match v {
                    serde_json::Value::String(s) => Some(s.into_bytes()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string().into_bytes()),
                };
                out.push((k, value));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(k: &str, v: &str) -> (String, Option<Vec<u8>>) {
        (k.to_string(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn header_validation() {
        let ok = [
            h(HEADER_ID, "m1"),
            h(HEADER_DEADLINE, "1970-01-01T00:00:01Z"),
        ];
        assert_eq!(validate(&ok).unwrap(), ("m1".to_string(), 1_000_000));
        assert!(validate(&[h(HEADER_ID, "m1")]).is_err());
        assert!(validate(&[h(HEADER_DEADLINE, "1970-01-01T00:00:01Z")]).is_err());
        assert!(validate(&[h(HEADER_ID, "m1"), h(HEADER_DEADLINE, "soon")]).is_err());
        let long = "x".repeat(129);
        assert!(validate(&[
            h(HEADER_ID, &long),
            h(HEADER_DEADLINE, "1970-01-01T00:00:01")
        ])
        .is_err());
    }

    #[test]
    fn headers_round_trip_through_json() {
        let list = vec![h("a", "1"), ("b".to_string(), None), h("c\"", "x\ny")];
        assert_eq!(parse_headers_json(&headers_json(&list)), list);
    }
}

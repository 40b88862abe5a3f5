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
    assert!(
        !id.is_empty() && id.chars().count() <= ID_CHARS_MAX,
        "the ID was checked above"
    );
    Ok((id, us))
}

/// Headers as stored: `[{"name": "value"}, ...]`, a valueless header as
/// `null`. A value that is not UTF-8, or holds a NUL (which `jsonb` cannot),
/// is stored as `{"hex": "..."}`, so every value is relayed byte for byte.
pub fn headers_json(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Some(b) => match std::str::from_utf8(b) {
                    Ok(text) if !b.contains(&0) => serde_json::Value::String(text.to_string()),
                    _ => {
                        let mut o = serde_json::Map::new();
                        o.insert("hex".into(), serde_json::Value::String(hex(b)));
                        serde_json::Value::Object(o)
                    }
                },
                None => serde_json::Value::Null,
            };
            let mut o = serde_json::Map::new();
            o.insert(k.clone(), value);
            serde_json::Value::Object(o)
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    digits
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The stored form back to headers (what `headers_json` wrote; anything
/// else is relayed as its JSON text).
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
                    serde_json::Value::Object(ref m) if m.len() == 1 => {
                        match m.get("hex").and_then(|h| h.as_str()).and_then(unhex) {
                            Some(bytes) => Some(bytes),
                            None => Some(v.to_string().into_bytes()),
                        }
                    }
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
        let mut list = vec![h("a", "1"), ("b".to_string(), None), h("c\"", "x\ny")];
        list.push(("raw".to_string(), Some(vec![0xff, 0x00, 0x80, b'"'])));
        list.push(("nul".to_string(), Some(b"a\0b".to_vec())));
        list.push(("empty".to_string(), Some(Vec::new())));
        let stored = headers_json(&list);
        assert!(
            !stored.contains("\\u0000"),
            "jsonb cannot hold NUL: {stored}"
        );
        assert_eq!(parse_headers_json(&stored), list);
    }
}

//! The protocol's shared terms: what a resync GET asks (`Query`, checked
//! here against the cluster view as seed 000 specifies), a position in a
//! listing (`Cursor`), and what one shard answers (`ShardPage`), which the
//! mesh carries between shards. It names no other file of the protocol.

use crate::cluster::Cluster;
use crate::http::uri::percent_decode;
use crate::runtime::clock;

/// Timers per GET when the request has no `Range`.
pub const RANGE_DEFAULT: usize = 100;
/// The largest `Range` honoured.
pub const RANGE_MAX: usize = 10_000;

/// A position in a listing: pop-time order, ties broken by ID. `due_ms`
/// is the serving node's engine clock, so a cursor is opaque elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub due_ms: u64,
    pub unique: u64,
}

impl Cursor {
    pub fn to_text(self) -> String {
        format!("{}-{:016x}", self.due_ms, self.unique)
    }

    pub fn parse(text: &str) -> Option<Cursor> {
        let (due, unique) = text.split_once('-')?;
        Some(Cursor {
            due_ms: due.parse().ok()?,
            unique: u64::from_str_radix(unique, 16).ok()?,
        })
    }
}

/// A validated resync GET.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The requesting node's index in the cluster's members.
    pub node: usize,
    /// Engine-clock ms: only timers due at or after this.
    pub from_ms: u64,
    pub limit: usize,
    /// Continue after this position (a new listing when `None`).
    pub cursor: Option<Cursor>,
    /// List current-view timers too (a restarted node's restore).
    pub all_views: bool,
}

/// One shard's part of a page.
pub struct ShardPage {
    /// `(position, JSON entry)`, in order.
    pub entries: Vec<(Cursor, Vec<u8>)>,
    /// `Some(c)`: everything up to `c` was looked at and more may follow;
    /// `None`: nothing follows the entries.
    pub looked_to: Option<Cursor>,
}

/// Check a resync GET: `Err((status, reason))` as seed 000 specifies (400
/// for a missing or mismatched parameter, 404 for an unknown node).
pub fn parse_query(
    cluster: &Cluster,
    query: &str,
    range: Option<&[u8]>,
) -> Result<Query, (u16, String)> {
    let (mut node, mut view, mut time_from, mut cursor, mut all) = (None, None, None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or((400, format!("{k}: bad percent-encoding")))?;
        match k {
            "node-for-replicas" => node = Some(v),
            "cluster-view-id" => view = Some(v),
            "time-from" => time_from = Some(v),
            "cursor" => cursor = Some(v),
            "all-views" => all = Some(v),
            _ => {}
        }
    }
    let node = node.ok_or((400, "missing node-for-replicas".to_string()))?;
    let view = view.ok_or((400, "missing cluster-view-id".to_string()))?;
    let index = cluster
        .nodes
        .iter()
        .position(|n| n.address == node)
        .ok_or((404, format!("{node} is not a node of this cluster")))?;
    if view != cluster.view_id_string() {
        return Err((
            400,
            format!(
                "cluster-view-id {view} does not match this node's {}",
                cluster.view_id
            ),
        ));
    }
    let from_ms = match time_from {
        None => 0,
        Some(t) => {
            let us: u64 = t
                .parse()
                .map_err(|_| (400, format!("time-from {t:?} is not µs since the epoch")))?;
            // Wall clock to engine clock.
            let ahead_ms = (us / 1000) as i64 - clock::unix_ms() as i64;
            (clock::now_ms() as i64).saturating_add(ahead_ms).max(0) as u64
        }
    };
    let cursor = match cursor {
        None => None,
        Some(c) => Some(Cursor::parse(&c).ok_or((400, format!("cursor {c:?} is malformed")))?),
    };
    let all_views = match all.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err((400, format!("all-views {other:?} is not true or false"))),
    };
    let limit = parse_range(range)?;
    assert!(
        (1..=RANGE_MAX).contains(&limit) && index < cluster.nodes.len(),
        "the query's checks bound the page and name a member"
    );
    Ok(Query {
        node: index,
        from_ms,
        limit,
        cursor,
        all_views,
    })
}

/// `Range: 100` (seed 000), tolerating a unit prefix (`timers=100`,
/// `timers = 100`, `timers 100`: letters, `_` or `-`, then `=` or spaces);
/// more than `RANGE_MAX` is `RANGE_MAX`. Exactly the OpenAPI pattern
/// `^([A-Za-z][A-Za-z_-]*( *= *| +))?0*[1-9][0-9]*$` (anything before the
/// last `=` used to pass as a prefix).
fn parse_range(range: Option<&[u8]>) -> Result<usize, (u16, String)> {
    let Some(r) = range else {
        return Ok(RANGE_DEFAULT);
    };
    let text = std::str::from_utf8(r).unwrap_or("").trim();
    let bad = || (400, format!("Range {text:?} is not a positive count"));
    let unit_end = text
        .bytes()
        .position(|b| !(b.is_ascii_alphabetic() || b == b'_' || b == b'-'))
        .unwrap_or(0);
    let digits = match text[unit_end..].trim_start_matches(' ') {
        rest if unit_end == 0 => rest,
        _ if !text.as_bytes()[0].is_ascii_alphabetic() => return Err(bad()),
        rest => match rest.strip_prefix('=') {
            Some(after) => after.trim_start_matches(' '),
            None if rest.len() < text.len() - unit_end => rest,
            None => return Err(bad()),
        },
    };
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // All digits: a count too large for usize is still "more than the most".
    Ok(significant
        .parse::<usize>()
        .map_or(RANGE_MAX, |n| n.min(RANGE_MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Range header: a count with an optional letters-only unit prefix.
    #[test]
    fn range_header_is_exactly_the_documented_pattern() {
        assert_eq!(parse_range(None), Ok(RANGE_DEFAULT));
        for (text, n) in [
            ("7", 7),
            ("0007", 7),
            ("timers=7", 7),
            ("timers 7", 7),
            ("timers = 7", 7),
            ("x-timers=7", 7),
            ("items_per_page =7", 7),
            (" 10000 ", RANGE_MAX),
            ("999999999", RANGE_MAX),
            ("99999999999999999999999", RANGE_MAX),
        ] {
            assert_eq!(parse_range(Some(text.as_bytes())), Ok(n), "{text}");
        }
        for bad in [
            "",
            "0",
            "000",
            "-1",
            "+5",
            "1e3",
            "7x",
            "=7",
            "t1=7",
            "){L^NUmI^CN=4",
            "a=b=7",
            "timers=",
            "timers",
            "timers:7",
            "_x=7",
            "timers==7",
            "timers=-7",
            "t=0",
        ] {
            assert!(parse_range(Some(bad.as_bytes())).is_err(), "{bad}");
        }
    }

    #[test]
    fn cursor_round_trips_and_rejects_junk() {
        let c = Cursor {
            due_ms: 123_456,
            unique: 0xdead_beef,
        };
        assert_eq!(Cursor::parse(&c.to_text()), Some(c));
        for bad in ["", "12", "x-1", "1-zz", "-1"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}

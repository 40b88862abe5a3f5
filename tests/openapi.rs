//! The OpenAPI description (src/dist/openapi.json) as a contract: it
//! parses, is OpenAPI 3.1, names exactly the routes the router answers (a
//! live node agrees, operation by operation), and `GET /openapi.json`
//! serves it byte for byte. CI runs schemathesis against it too
//! (.ci/schemathesis.sh); what that found is pinned at the end.

mod common;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;

/// The file as the node embeds it.
const DOCUMENT: &str = include_str!("../src/dist/openapi.json");

const SECRET: &str = "openapi-test-secret-0123456789";

/// Every (method, path) the router in src/api/mod.rs handles, written out
/// here by hand: the document must list exactly these.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/timers"),
    ("GET", "/timers"),
    ("DELETE", "/timers/references"),
    ("GET", "/timers/{id}"),
    ("PUT", "/timers/{id}"),
    ("DELETE", "/timers/{id}"),
    ("GET", "/cluster"),
    ("POST", "/resync"),
    ("GET", "/handoff"),
    ("GET", "/metrics"),
    ("GET", "/ping"),
    ("HEAD", "/ping"),
    ("GET", "/ready"),
    ("HEAD", "/ready"),
    ("GET", "/openapi.json"),
];

/// Methods a client may try on any path.
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// Paths near the real ones that are no route.
const NOT_ROUTES: &[&str] = &[
    "/",
    "/timer",
    "/timers/",
    "/timers/0123",
    "/timers/references/x",
    "/timers/0123456789abcdef0123456789abcdef/x",
    "/openapi",
    "/openapi.yaml",
    "/metrics/",
    "/pings",
    "/cluster/x",
];

fn document() -> Value {
    serde_json::from_str(DOCUMENT).expect("src/dist/openapi.json is JSON")
}

/// The (METHOD, path) pairs the document describes.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut out = BTreeSet::new();
    for (path, item) in paths {
        for method in item.as_object().expect("a path item is an object").keys() {
            if METHODS.contains(&method.to_uppercase().as_str()) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

fn node_with_secret() -> Node {
    Node::start(&format!(
        "[runtime]\ncores = 2\n[cluster]\nshared-secret = \"{SECRET}\"\n"
    ))
}

fn send(node: &Node, method: &str, path: &str, body: &str) -> Response {
    let auth = format!("Bearer {SECRET}");
    request(
        node.addr,
        method,
        path,
        &[("Authorization", &auth)],
        body.as_bytes(),
    )
}

/// A concrete path for a documented template.
fn concrete(path: &str) -> String {
    path.replace("{id}", "0123456789abcdef0123456789abcdef")
}

#[test]
fn the_document_is_openapi_3_1_and_lists_exactly_the_routes() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("openapi is a string");
    assert!(version.starts_with("3.1."), "openapi {version:?} is 3.1.x");
    // The API's version is the package's (a release bumps both).
    assert_eq!(
        doc["info"]["version"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "info.version is Cargo.toml's version"
    );
    let table: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let doc_routes = documented(&doc);
    let missing: Vec<_> = table.difference(&doc_routes).collect();
    let extra: Vec<_> = doc_routes.difference(&table).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "routes the router handles but the document lacks: {missing:?}; documented but not routed: {extra:?}"
    );
    // Every operation says what it answers, and every reference resolves.
    for (method, path) in &doc_routes {
        let op = &doc["paths"][path][method.to_lowercase()];
        let responses = op["responses"].as_object().expect("responses");
        assert!(!responses.is_empty(), "{method} {path} has responses");
        assert!(op["operationId"].is_string(), "{method} {path} operationId");
    }
    let mut unresolved = Vec::new();
    find_refs(&doc, &doc, &mut unresolved);
    assert!(unresolved.is_empty(), "unresolved $refs: {unresolved:?}");
}

/// Collect every `$ref` in `v` that does not resolve in `doc`.
fn find_refs(doc: &Value, v: &Value, unresolved: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                let pointer = r.strip_prefix('#').unwrap_or("!");
                if doc.pointer(pointer).is_none() {
                    unresolved.push(r.clone());
                }
            }
            map.values().for_each(|x| find_refs(doc, x, unresolved));
        }
        Value::Array(list) => list.iter().for_each(|x| find_refs(doc, x, unresolved)),
        _ => {}
    }
}

#[test]
fn a_live_node_answers_every_documented_operation_and_nothing_else() {
    let node = node_with_secret();
    let doc = document();
    let doc_routes = documented(&doc);
    for (method, path) in &doc_routes {
        let r = send(&node, method, &concrete(path), "");
        // A route that looked the timer up and found none answers `404 no
        // such timer`; the router's own `404` (no route) says `not found`.
        let unrouted = r.status == 404 && !r.text().starts_with("no such timer");
        assert!(
            !unrouted && r.status != 405,
            "{method} {path} is documented but answered {} {}",
            r.status,
            r.text()
        );
        assert!(r.status < 500, "{method} {path}: {} {}", r.status, r.text());
    }
    let paths: BTreeSet<&String> = doc_routes.iter().map(|(_, p)| p).collect();
    for path in paths {
        let allowed: BTreeSet<&str> = doc_routes
            .iter()
            .filter(|(_, p)| p == path)
            .map(|(m, _)| m.as_str())
            .collect();
        for method in METHODS.iter().filter(|m| !allowed.contains(**m)) {
            let r = send(&node, method, &concrete(path), "");
            assert_eq!(
                r.status,
                405,
                "{method} {path} is not documented but answered {} {}",
                r.status,
                r.text()
            );
            // `Allow` names exactly the documented methods.
            let allow: BTreeSet<&str> = r
                .header("Allow")
                .unwrap_or_else(|| panic!("{method} {path}: 405 without Allow"))
                .split(',')
                .map(str::trim)
                .collect();
            assert_eq!(allow, allowed, "{method} {path}: Allow");
        }
    }
    for path in NOT_ROUTES {
        for method in METHODS {
            let r = send(&node, method, path, "");
            assert_eq!(r.status, 404, "{method} {path}: {} {}", r.status, r.text());
        }
    }
}

#[test]
fn get_openapi_json_serves_the_file_without_the_secret() {
    let node = node_with_secret();
    // No Authorization: the document is public, as /ping is.
    let r = node.request("GET", "/openapi.json", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert!(r.body == DOCUMENT.as_bytes(), "the same bytes as the file");
    assert_eq!(node.request("HEAD", "/openapi.json", "").status, 405);
}

// ---- Found while writing the contract and running schemathesis ----

/// The bytes of the first response in `raw` (head and `Content-Length`
/// body) and what follows it.
fn split_first(raw: &[u8], body_expected: bool) -> (&[u8], &[u8]) {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head")
        + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let end = if body_expected {
        head_end + length
    } else {
        head_end
    };
    raw.split_at(end)
}

/// A response to `HEAD` carries no body (RFC 9110 9.3.2), whatever its
/// status: a `405` or `404` to a `HEAD` used to carry its reason, and a
/// client on a kept-alive connection read those bytes as the start of the
/// next response.
#[test]
fn a_head_answer_has_no_body_so_the_next_answer_on_the_connection_is_whole() {
    let node = node_with_secret();
    for path in ["/timers", "/nothing", "/ping", "/ready", "/openapi.json"] {
        let raw = raw_exchange(
            node.addr,
            format!("HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let (first, rest) = split_first(&raw, false);
        assert!(
            rest.starts_with(b"HTTP/1.1 200 OK\r\n") && rest.ends_with(b"\r\n\r\nOK"),
            "HEAD {path}: the first answer {:?} is followed by {:?}, not the ping's answer",
            String::from_utf8_lossy(first),
            String::from_utf8_lossy(rest)
        );
    }
}

/// A callback URI's authority goes into the callback's `Host` header: a
/// control character or space in it used to be accepted (`http://[::1]`
/// followed by CR LF and a header of the client's choosing took port 80
/// and put that header into every pop's request).
#[test]
fn a_callback_authority_with_control_characters_or_junk_after_the_host_is_400() {
    let node = node_with_secret();
    for uri in [
        "http://[::1]\\r\\nX-Injected: yes/cb",
        "http://[::1]junk/cb",
        "http://127.0.0.1\\r\\nX-Injected: yes:80/cb",
        "http://a b:80/cb",
        "http://127.0.0.1\\t:80/cb",
    ] {
        let body = timer_body("100", None, uri, "o");
        let r = node.request("POST", "/timers", &body);
        assert_eq!(r.status, 400, "{uri}: {} {}", r.status, r.text());
        assert!(
            r.text().contains("callback.http.uri"),
            "{uri}: {}",
            r.text()
        );
    }
    // What stays accepted.
    for uri in [
        "http://[::1]:9/cb",
        "http://[::1]/cb",
        "http://localhost:9?x=1",
    ] {
        let body = timer_body("100", None, uri, "o");
        let r = node.request("POST", "/timers", &body);
        assert_eq!(r.status, 200, "{uri}: {} {}", r.status, r.text());
    }
}

/// `http://host:port?query` (no path) is accepted, and its pop's request
/// target is `/?query`: it used to be `?query`, which no HTTP server takes.
#[test]
fn a_callback_uri_with_a_query_and_no_path_pops_to_slash_query() {
    let node = node_with_secret();
    let sink = Sink::start(Behaviour::Ok);
    let uri = format!("http://{}?x=1", sink.addr);
    let r = node.request("POST", "/timers", &timer_body("0", None, &uri, "o"));
    assert_eq!(r.status, 200, "{}", r.text());
    let pops = sink.wait_for(1, std::time::Duration::from_secs(10));
    assert_eq!(pops.len(), 1, "the timer popped");
    assert_eq!(pops[0].path, "/?x=1");
}

/// A `#fragment` is the client's own (RFC 3986 section 3.5) and is never
/// sent: it went into the pop's request target (`POST /p#frag`) or, with no
/// path, into the host (`127.0.0.1:port#frag`), so every pop failed. curl,
/// the reference's HTTP client, drops it too.
#[test]
fn a_callback_uri_fragment_is_not_sent() {
    let node = node_with_secret();
    let sink = Sink::start(Behaviour::Ok);
    let cases = [
        (format!("http://{}/p?q=1#frag", sink.addr), "/p?q=1"),
        (format!("http://{}#frag", sink.addr), "/"),
    ];
    for (i, (uri, path)) in cases.iter().enumerate() {
        let r = node.request("POST", "/timers", &timer_body("0", None, uri, "o"));
        assert_eq!(r.status, 200, "{uri}: {}", r.text());
        let pops = sink.wait_for(i + 1, std::time::Duration::from_secs(10));
        assert_eq!(pops.len(), i + 1, "{uri}: the timer popped");
        assert_eq!(pops[i].path, *path, "{uri}");
    }
}

/// Schemathesis: `"interval": 5e-324` (a positive interval far below a
/// millisecond) was taken as 0, so with a `repeat-for` the timer was
/// refused as "interval 0 with repeat-for"; a positive interval is at
/// least 1 ms (never earlier than asked, and never 0).
#[test]
fn a_positive_interval_below_a_millisecond_is_one_millisecond_not_zero() {
    let node = node_with_secret();
    for (interval, repeat_for) in [("5e-324", "4294966"), ("0.0000001", "0.5")] {
        let body = timer_body(interval, Some(repeat_for), "http://127.0.0.1:9/cb", "o");
        let r = node.request("POST", "/timers", &body);
        assert_eq!(
            r.status,
            200,
            "interval {interval}: {} {}",
            r.status,
            r.text()
        );
        let r = node.request("DELETE", &format!("/timers/{}", r.location_id()), "");
        assert_eq!(r.status, 200);
    }
}

/// Schemathesis: JSON has one number type, and JSON Schema's `integer` is
/// any number without a fraction, so `53.0` is the integer 53; the codec
/// refused it wherever it wanted an integer (`ReplicaIndex`, a tag's
/// `count`, `replication-factor`, a replication body's `sequence-number`,
/// `start-time-delta` and `version`). A real fraction is still `400`.
#[test]
fn integers_written_with_a_zero_fraction_are_integers() {
    let node = node_with_secret();
    let auth = format!("Bearer {SECRET}");
    let refs = r#"{"IDs":[{"ID":"0123456789abcdef0123456789abcdef","ReplicaIndex":53.0}]}"#;
    let r = send(&node, "DELETE", "/timers/references", refs);
    assert_eq!(r.status, 202, "{}", r.text());
    let refs = r#"{"IDs":[{"ID":"0123456789abcdef0123456789abcdef","ReplicaIndex":1.5}]}"#;
    assert_eq!(
        send(&node, "DELETE", "/timers/references", refs).status,
        400
    );
    let client = r#"{"timing":{"interval":100},"callback":{"http":{"uri":"http://127.0.0.1:9/cb"}},
        "reliability":{"replication-factor":1.0},"statistics":{"tag-info":[{"type":"A","count":2.0}]}}"#;
    let r = node.request("POST", "/timers", client);
    assert_eq!(r.status, 200, "{}", r.text());
    let replica = format!(
        r#"{{"timing":{{"interval":100,"repeat-for":100,"start-time-delta":-250.0,"sequence-number":2.0,"version":1e6}},
        "callback":{{"http":{{"uri":"http://127.0.0.1:9/cb"}}}},
        "reliability":{{"cluster-view-id":"1","replicas":["{}"]}}}}"#,
        node.addr
    );
    let r = request(
        node.addr,
        "PUT",
        "/timers/00000000000000110000000000000000",
        &[("Authorization", &auth)],
        replica.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let fraction = replica.replace("\"sequence-number\":2.0", "\"sequence-number\":2.5");
    let r = request(
        node.addr,
        "PUT",
        "/timers/00000000000000110000000000000000",
        &[("Authorization", &auth)],
        fraction.as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// Schemathesis (negative data): a tag type is "1 to 256 characters" (the
/// codec's own reason, and JSON Schema's `maxLength`), but the codec
/// counted bytes, so 200 two-byte characters were refused.
#[test]
fn a_tag_type_is_limited_in_characters_not_bytes() {
    let node = node_with_secret();
    let tagged = |kind: &str| {
        format!(
            r#"{{"timing":{{"interval":100}},"callback":{{"http":{{"uri":"http://127.0.0.1:9/cb"}}}},"statistics":{{"tag-info":[{{"type":"{kind}"}}]}}}}"#
        )
    };
    let r = node.request("POST", "/timers", &tagged(&"é".repeat(256)));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = node.request("POST", "/timers", &tagged(&"a".repeat(257)));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("1 to 256 characters"), "{}", r.text());
}

/// Schemathesis (negative data): `"replicas": [], "sites": []` was taken
/// as a body from another site with an empty site list (only `sites`
/// that name a site make a cross-site body), placed and replicated like a
/// client's timer past the token bucket; it is `400`, as `"replicas": []`
/// alone is.
#[test]
fn empty_replicas_with_empty_sites_is_400() {
    let node = node_with_secret();
    for reliability in [r#""replicas":[],"sites":[]"#, r#""replicas":[]"#] {
        let body = format!(
            r#"{{"timing":{{"interval":100}},"callback":{{"http":{{"uri":"http://127.0.0.1:9/cb"}}}},"reliability":{{{reliability}}}}}"#
        );
        for (method, path) in [
            ("POST", "/timers".to_string()),
            (
                "PUT",
                "/timers/00000000000000220000000000000000".to_string(),
            ),
        ] {
            let r = send(&node, method, &path, &body);
            assert_eq!(r.status, 400, "{method} {reliability}: {}", r.text());
            assert!(r.text().contains("reliability.replicas"), "{}", r.text());
        }
    }
}

/// Schemathesis (negative data): `"start-time-delta":
/// -9223372036854775809` (below `i64`) reached the codec as its rounded
/// float, -2^63, and was taken; an integer out of its field's range is
/// `400`.
#[test]
fn an_integer_beyond_its_range_is_400_not_rounded_into_it() {
    let node = node_with_secret();
    let body = format!(
        r#"{{"timing":{{"interval":100,"start-time-delta":-9223372036854775809}},"callback":{{"http":{{"uri":"http://127.0.0.1:9/cb"}}}},"reliability":{{"replicas":["{}"]}}}}"#,
        node.addr
    );
    let r = send(
        &node,
        "PUT",
        "/timers/00000000000000330000000000000000",
        &body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("not an integer in range"), "{}", r.text());
}

/// Schemathesis (negative data), and RFC 3986: a URI is ASCII. A raw
/// non-ASCII byte in a callback URI went into the pop's request line
/// (invalid HTTP, refused by the target at every pop); it is `400` at
/// create time, naming the URI, and its percent-encoded form is taken.
#[test]
fn a_callback_uri_with_raw_non_ascii_is_400_and_its_percent_encoding_is_taken() {
    let node = node_with_secret();
    for uri in ["http://127.0.0.1:9/caf\u{e9}", "http://h\u{e9}te:9/"] {
        let r = node.request("POST", "/timers", &timer_body("100", None, uri, "o"));
        assert_eq!(r.status, 400, "{uri}: {}", r.text());
        assert!(r.text().contains("non-ASCII"), "{uri}: {}", r.text());
    }
    let uri = "http://127.0.0.1:9/caf%C3%A9";
    let r = node.request("POST", "/timers", &timer_body("100", None, uri, "o"));
    assert_eq!(r.status, 200, "{uri}: {}", r.text());
}

/// Schemathesis (the schema's client and replication forms): a `POST`
/// whose body named `reliability.replicas` could leave the callback out
/// (`"callback": {}`, a replication tombstone's form) and made a timer
/// with no callback, popped for nothing; a `POST` needs a callback.
#[test]
fn a_post_without_a_callback_is_400_even_in_the_replication_form() {
    let node = node_with_secret();
    let body = format!(
        r#"{{"timing":{{"interval":100}},"callback":{{}},"reliability":{{"replicas":["{}"]}}}}"#,
        node.addr
    );
    let r = send(&node, "POST", "/timers", &body);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("callback"), "{}", r.text());
}

/// The rule the schema states: `"replicas": []` is never a replication
/// body (this project's nodes leave an empty list out; a body from
/// another site names only `sites`), whatever `sites` says.
#[test]
fn empty_replicas_beside_sites_is_400() {
    let node = node_with_secret();
    let body = r#"{"timing":{"interval":100},"callback":{"http":{"uri":"http://127.0.0.1:9/cb"}},"reliability":{"replicas":[],"sites":["site1"]}}"#;
    let r = send(
        &node,
        "PUT",
        "/timers/00000000000000440000000000000000",
        body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("reliability.replicas"), "{}", r.text());
}

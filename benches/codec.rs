//! The request path's parsers and encoders, per request:
//!
//! - `http/parse_post`: frame one `POST /timers` (httparse + our checks);
//! - `http/parse_pipelined_16`: frame 16 pipelined requests from one buffer;
//! - `json/parse_timer`: validate a seed 000 timer body (borrowing);
//! - `json/parse_replication`: the internal replication form;
//! - `json/encode_replication`: write a replication body (what every create
//!   sends each backup).
//!
//! `cargo bench --bench codec`; results are recorded in `perf/README.md`.

use chronos::cluster::replicate::{encode_body, Body};
use chronos::http::{parse_request, Parsed};
use chronos::timer::spec;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

const TIMER: &str = r#"{"timing":{"interval":30,"repeat-for":300},"callback":{"http":{"uri":"http://10.0.0.1:8080/callback/abc","opaque":"c2Vzc2lvbi0xMjM0NTY3ODkw"}},"reliability":{"replication-factor":2},"statistics":{"tag-info":[{"type":"CALL","count":1}]}}"#;

fn request(body: &str) -> Vec<u8> {
    format!(
        "POST /timers HTTP/1.1\r\nHost: 127.0.0.1:7253\r\nUser-Agent: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn http(c: &mut Criterion) {
    let mut g = c.benchmark_group("http");
    let one = request(TIMER);
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_post", |b| {
        b.iter(
            || match parse_request(black_box(&one), 16 * 1024, 256 * 1024) {
                Parsed::Complete(req, used) => {
                    black_box((req.body.len(), used));
                }
                _ => unreachable!("a complete request"),
            },
        )
    });
    let many: Vec<u8> = (0..16).flat_map(|_| one.clone()).collect();
    g.throughput(Throughput::Elements(16));
    g.bench_function("parse_pipelined_16", |b| {
        b.iter(|| {
            let mut at = 0;
            let mut n = 0;
            while at < many.len() {
                match parse_request(black_box(&many[at..]), 16 * 1024, 256 * 1024) {
                    Parsed::Complete(_, used) => {
                        at += used;
                        n += 1;
                    }
                    _ => unreachable!(),
                }
            }
            black_box(n)
        })
    });
    g.finish();
}

fn json(c: &mut Criterion) {
    let mut g = c.benchmark_group("json");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_timer", |b| {
        b.iter(|| {
            black_box(
                spec::parse(black_box(TIMER.as_bytes()), chronos::http::uri::check)
                    .unwrap()
                    .interval_ms,
            )
        })
    });
    let replicas = ["10.0.0.1:7253", "10.0.0.2:7253"];
    let tags = [("CALL", 1u32)];
    let body = Body {
        interval_ms: 30_000,
        repeat_for_ms: 300_000,
        start_time_delta_ms: -3,
        sequence: 0,
        version_us: 1_763_800_000_000_000,
        uri: "http://10.0.0.1:8080/callback/abc",
        opaque: "c2Vzc2lvbi0xMjM0NTY3ODkw",
        view_id: 90691053180028962,
        replicas: &replicas,
        sites: &[],
        factor_requested: 2,
        tags: &tags,
        start_time_unix_ms: None,
        only_newer: false,
        ext: &[],
        attempt: None,
    };
    let mut out = Vec::with_capacity(1024);
    encode_body(&mut out, &body);
    let encoded = out.clone();
    g.bench_function("parse_replication", |b| {
        b.iter(|| {
            black_box(
                spec::parse(black_box(&encoded), chronos::http::uri::check)
                    .unwrap()
                    .replication
                    .is_some(),
            )
        })
    });
    g.bench_function("encode_replication", |b| {
        b.iter(|| {
            out.clear();
            encode_body(&mut out, black_box(&body));
            black_box(out.len())
        })
    });
    g.finish();
}

criterion_group!(benches, http, json);
criterion_main!(benches);

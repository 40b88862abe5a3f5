//! Routes: the public timer API of seed 000, plus `/ping` and `/metrics`.
//!
//! | path                  | methods           |
//! |-----------------------|-------------------|
//! | `/timers`             | `POST`; `GET` (resync, seed 000's internal API) |
//! | `/timers/references`  | `DELETE` (resync) |
//! | `/timers/<32 hex>`    | `PUT`, `DELETE`   |
//! | `/ping`               | `GET`, `HEAD`     |
//! | `/metrics`            | `GET`             |
//!
//! Every error carries its reason in the body.

use crate::http::{write_response, Method, Request};
use crate::shard::{OpError, Shard};
use crate::timer::{spec, TimerId};

/// Answer one request into `out`; returns the status written.
pub async fn handle(shard: &Shard, req: &Request<'_>, out: &mut Vec<u8>, close: bool) -> u16 {
    match req.path {
        "/timers" => match req.method {
            Method::Post => match spec::parse(req.body) {
                Ok(s) => timer_result(out, shard.create(&s), close),
                Err(reason) => error(out, 400, &reason, close),
            },
            Method::Get => match shard.resync_query(req.query, req.range) {
                Ok(q) => {
                    let (status, count, body) = shard.resync_get(q).await;
                    let mut digits = [0u8; 10];
                    let range = crate::http::client::format_u32(&mut digits, count as u32);
                    let mut headers: Vec<(&str, &[u8])> =
                        vec![("Content-Type", b"application/json")];
                    if status == 206 {
                        headers.push(("Content-Range", range));
                    }
                    write_response(out, status, &headers, body.as_bytes(), close);
                    status
                }
                Err((status, reason)) => error(out, status, &reason, close),
            },
            _ => not_allowed(out, "GET, POST", close),
        },
        "/timers/references" => match req.method {
            Method::Delete => match shard.resync_references(req.body).await {
                Ok(_) => {
                    write_response(out, 202, &[], b"", close);
                    202
                }
                Err(reason) => error(out, 400, &reason, close),
            },
            _ => not_allowed(out, "DELETE", close),
        },
        "/ping" => match req.method {
            Method::Get => {
                write_response(out, 200, &[], b"OK", close);
                200
            }
            Method::Head => {
                write_response(out, 200, &[], b"", close);
                200
            }
            _ => not_allowed(out, "GET, HEAD", close),
        },
        "/ready" => match req.method {
            Method::Get | Method::Head => {
                let (status, body) = match shard.readiness() {
                    Ok(()) => (200, "ready".to_string()),
                    Err(why) => (503, format!("not ready: {why}")),
                };
                let body = if req.method == Method::Head {
                    ""
                } else {
                    body.as_str()
                };
                write_response(out, status, &[], body.as_bytes(), close);
                status
            }
            _ => not_allowed(out, "GET, HEAD", close),
        },
        "/metrics" => match req.method {
            Method::Get => {
                let tags = shard.all_tags().await;
                let mut text = String::with_capacity(4096);
                crate::stats::render(&shard.stats, &tags, &mut text);
                write_response(
                    out,
                    200,
                    &[("Content-Type", b"text/plain; version=0.0.4")],
                    text.as_bytes(),
                    close,
                );
                200
            }
            _ => not_allowed(out, "GET", close),
        },
        path => match path.strip_prefix("/timers/") {
            Some(id_text) => {
                let Some(id) = TimerId::parse(id_text.as_bytes()) else {
                    return error(
                        out,
                        404,
                        "no such timer: a timer ID is 32 hex digits",
                        close,
                    );
                };
                match req.method {
                    Method::Put => match spec::parse(req.body) {
                        Ok(s) if s.replication.is_some() => {
                            let result = shard.replica_update(id, s).await;
                            timer_result(out, result, close)
                        }
                        Ok(s) => {
                            let result = shard.client_update(id, s).await;
                            timer_result(out, result, close)
                        }
                        Err(reason) => error(out, 400, &reason, close),
                    },
                    Method::Delete => match shard.client_delete(id).await {
                        Ok(()) => {
                            write_response(out, 200, &[], b"", close);
                            200
                        }
                        Err(e) => error(out, e.status, &e.reason, close),
                    },
                    _ => not_allowed(out, "PUT, DELETE", close),
                }
            }
            None => error(out, 404, "not found", close),
        },
    }
}

fn timer_result(out: &mut Vec<u8>, result: Result<TimerId, OpError>, close: bool) -> u16 {
    match result {
        Ok(id) => {
            let mut location = [0u8; 8 + 32];
            location[..8].copy_from_slice(b"/timers/");
            location[8..].copy_from_slice(&id.to_hex());
            write_response(out, 200, &[("Location", &location)], b"", close);
            200
        }
        Err(e) => error(out, e.status, &e.reason, close),
    }
}

fn error(out: &mut Vec<u8>, status: u16, reason: &str, close: bool) -> u16 {
    write_response(out, status, &[], reason.as_bytes(), close);
    status
}

fn not_allowed(out: &mut Vec<u8>, allow: &str, close: bool) -> u16 {
    let reason = format!("method not allowed; allowed: {allow}");
    write_response(
        out,
        405,
        &[("Allow", allow.as_bytes())],
        reason.as_bytes(),
        close,
    );
    405
}

//! Routes: the public timer API of seed 000, its internal API (replication
//! and resync), plus `/ping`, `/ready` and `/metrics`.
//!
//! | path                  | methods           |
//! |-----------------------|-------------------|
//! | `/timers`             | `POST` (with `Idempotency-Key`, safe to retry); `GET` (resync, seed 000's internal API) |
//! | `/timers/references`  | `DELETE` (resync) |
//! | `/timers/<32 hex>`    | `GET` (the timer, from any node), `PUT`, `DELETE` |
//! | `/cluster`            | `GET`: the node's view and resync state |
//! | `/resync`             | `POST`: start a resync (`chronos resync`) |
//! | `/handoff`            | `GET`: what this node still owes a peer's replication; brings a repair owed to it forward (internal) |
//! | `/ping`               | `GET`, `HEAD`     |
//! | `/ready`              | `GET`, `HEAD`     |
//! | `/metrics`            | `GET`             |
//! | `/openapi.json`       | `GET`: [`OPENAPI`], this table as a contract |
//!
//! With `[cluster] shared-secret`, the internal API (replication and
//! cross-site `PUT`s, the resync `GET` and `DELETE`, the hand-off) and the admin routes
//! (`/cluster`, `/resync`, `/metrics`) need `Authorization: Bearer
//! <secret>`; `/ping`, `/ready` and the client API stay open. Every error
//! carries its reason in the body. A refused request is logged at warn,
//! at most once per [`REFUSED_LOG_EVERY`] per shard and kind (internal,
//! admin), with the count of the ones not logged.

pub mod admission;
mod cluster;
mod idempotent;
pub mod lookup;

use crate::http::server::Handler;
use crate::http::{uri, write_response, Method, Request};
use crate::runtime::loglimit::{log_due, LogLimit};
use crate::runtime::throttle::Throttle;
use crate::shard::{OpError, Shard};
use crate::stats::{REQUEST_BOUNDS_US, ROUTES};
use crate::timer::{spec, TimerId};
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The OpenAPI 3.1 description of every route here (`src/dist/`, served
/// as it is: tests/openapi.rs holds it and the router to each other).
/// Public, as `/ping` is: it says nothing of this node's configuration.
pub const OPENAPI: &str = include_str!("../dist/openapi.json");

/// Readiness beyond the shards themselves (e.g. the delay queue's
/// Postgres and broker): `Err` names what is not ready.
pub type ReadyCheck = Box<dyn Fn() -> Result<(), String>>;

/// The API of one shard: what the HTTP server calls.
pub struct Api {
    shard: Rc<Shard>,
    /// Admission of client requests (`[throttling]`).
    admission: admission::Admission,
    ready: ReadyCheck,
    /// Refused internal and admin requests ([`Refused`]): when one was
    /// last logged, and how many were refused since without a line.
    refused_log: [LogLimit; 2],
    /// The client of `GET /timers/<id>` on a node without a copy.
    lookups: lookup::Lookups,
}

impl Api {
    /// The API of `shard`; `throttle`: its share of `[throttling]`'s
    /// bucket ([`admission::throttle`]), the one its pops steer too.
    pub fn new(shard: Rc<Shard>, ready: ReadyCheck, throttle: Option<Rc<Throttle>>) -> Api {
        Api {
            shard,
            admission: admission::Admission::new(throttle),
            ready,
            refused_log: Default::default(),
            lookups: lookup::Lookups::default(),
        }
    }
}

impl Handler for Api {
    fn handle<'a>(
        &'a self,
        req: &'a Request<'a>,
        out: &'a mut Vec<u8>,
        close: bool,
    ) -> impl Future<Output = u16> + 'a {
        handle(self, req, out, close)
    }
}

/// Answer one request into `out`; returns the status written. Timed from
/// here (the request parsed) until its answer is in `out`, per route
/// (`chronos_http_request_duration_seconds`).
pub async fn handle(api: &Api, req: &Request<'_>, out: &mut Vec<u8>, close: bool) -> u16 {
    let started = Instant::now();
    let route = Cell::new(route_of(req));
    let status = answer(api, req, out, close, &route).await;
    api.shard.base.my_stats().request_duration[route.get()]
        .record_duration(&REQUEST_BOUNDS_US, started.elapsed());
    status
}

/// A request's `route` label ([`ROUTES`]) by method and path; a `PUT` to a
/// timer is `timers_put` until its body shows it is a replication
/// (`timer` then says which).
fn route_of(req: &Request<'_>) -> usize {
    match (req.method, req.path) {
        (Method::Post, "/timers") => const { route_index("timers_post") },
        (Method::Get, "/timers") => const { route_index("resync_get") },
        (Method::Delete, "/timers/references") => const { route_index("references_delete") },
        (Method::Get, "/cluster") => const { route_index("cluster") },
        (Method::Post, "/resync") => const { route_index("resync_post") },
        (Method::Get, "/handoff") => const { route_index("handoff") },
        (Method::Get | Method::Head, "/ping") => const { route_index("ping") },
        (Method::Get | Method::Head, "/ready") => const { route_index("ready") },
        (Method::Get, "/metrics") => const { route_index("metrics") },
        (Method::Get, "/openapi.json") => const { route_index("openapi") },
        (Method::Put, path) if path.starts_with("/timers/") => const { route_index("timers_put") },
        (Method::Get, path) if path.starts_with("/timers/") && path != "/timers/references" => {
            const { route_index("timers_get") }
        }
        (Method::Delete, path) if path.starts_with("/timers/") => {
            const { route_index("timers_delete") }
        }
        _ => const { route_index("other") },
    }
}

/// The index of `name` in [`ROUTES`], found at compile time (every
/// caller is a `const` block, so a name not there fails the build): a
/// search per request cost a ping ~60 instructions.
const fn route_index(name: &str) -> usize {
    let mut i = 0;
    while i < ROUTES.len() {
        if same_bytes(ROUTES[i].as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("a route of stats::ROUTES")
}

/// `a == b`, in a `const fn`.
const fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// What `handle` answers, by path (`route` may be refined on the way).
async fn answer(
    api: &Api,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    close: bool,
    route: &Cell<usize>,
) -> u16 {
    let shard = &*api.shard;
    match req.path {
        "/timers" => timers(api, req, out, close).await,
        "/cluster" | "/resync" | "/metrics" if !authorized(shard, req) => {
            forbidden(api, req, Refused::Admin, out, close)
        }
        "/cluster" => match req.method {
            Method::Get => json(out, 200, &cluster::cluster_report(shard), close),
            _ => not_allowed(out, "GET", close),
        },
        "/resync" => match req.method {
            Method::Post => resync(shard, req, out, close).await,
            _ => not_allowed(out, "POST", close),
        },
        "/timers/references" | "/handoff" if !internal_authorized(shard, req) => {
            forbidden(api, req, Refused::Internal, out, close)
        }
        "/handoff" => match req.method {
            Method::Get => match shard.handoff(req.query).await {
                Ok(body) => json(out, 200, &body, close),
                Err((status, reason)) => error(out, status, &reason, close),
            },
            _ => not_allowed(out, "GET", close),
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
            Method::Get if !close => {
                out.extend_from_slice(crate::http::PING_OK);
                200
            }
            Method::Get => text(out, 200, "OK", close),
            Method::Head => text(out, 200, "", close),
            _ => not_allowed(out, "GET, HEAD", close),
        },
        "/ready" => match req.method {
            Method::Get | Method::Head => ready(api, req.method, out, close),
            _ => not_allowed(out, "GET, HEAD", close),
        },
        "/metrics" => match req.method {
            Method::Get => metrics(shard, out, close).await,
            _ => not_allowed(out, "GET", close),
        },
        "/openapi.json" => match req.method {
            Method::Get => json(out, 200, OPENAPI, close),
            _ => not_allowed(out, "GET", close),
        },
        path => match path.strip_prefix("/timers/") {
            Some(id_text) => timer(api, id_text, req, out, close, route).await,
            None => error(out, 404, "not found", close),
        },
    }
}

/// `POST /resync[?all-views=true]`: ask for a resync run; `202` with the
/// number of the run that will serve it (`GET /cluster` shows
/// `finished-runs` reach it).
async fn resync(shard: &Shard, req: &Request<'_>, out: &mut Vec<u8>, close: bool) -> u16 {
    let all_views = match req.query {
        "" | "all-views=false" => false,
        "all-views=true" => true,
        other => {
            return error(
                out,
                400,
                &format!("unknown query {other:?}; expected all-views=true or none"),
                close,
            )
        }
    };
    if shard.timers.cluster().local.is_none() {
        return error(
            out,
            409,
            "this node is leaving the cluster: it serves resyncs but runs none",
            close,
        );
    }
    match shard.request_resync(all_views).await {
        Some(run) => json(out, 202, &format!("{{\"run\":{run}}}"), close),
        None => error(out, 503, "shard 0 is unavailable", close),
    }
}

fn json(out: &mut Vec<u8>, status: u16, body: &str, close: bool) -> u16 {
    write_response(
        out,
        status,
        &[("Content-Type", b"application/json")],
        body.as_bytes(),
        close,
    );
    status
}

/// `/timers`: `POST` creates; `GET` is a resync page.
async fn timers(api: &Api, req: &Request<'_>, out: &mut Vec<u8>, close: bool) -> u16 {
    let shard = &api.shard;
    if req.method == Method::Get && shard.recovering() {
        return error(
            out,
            503,
            "recovering: the node is replaying its timer log; retry shortly",
            close,
        );
    }
    match req.method {
        Method::Post if !api.admission.admit(shard.base.my_stats()) => overloaded(out, close),
        // Matched by reference: moving the spec out of the `Result` was a
        // ~150-byte copy per POST.
        Method::Post => match &spec::parse(req.body, uri::check) {
            // The replication form may leave the callback out (a
            // tombstone); a POST creates a timer, which needs one.
            Ok(s) if s.is_tombstone() => error(out, 400, POST_NEEDS_CALLBACK, close),
            Ok(s) => {
                let started = api.admission.latency_start();
                if let Err((status, reason)) = guard_admits(shard, s).await {
                    return error(out, status, &reason, close);
                }
                let result = match req.idempotency_key {
                    Some(key) => idempotent::create(&api.lookups, shard, key, s).await,
                    None => shard.create_anywhere(s).await,
                };
                api.admission.record_latency_since(started);
                timer_result(out, result, close)
            }
            Err(reason) => error(out, 400, reason, close),
        },
        Method::Get if !internal_authorized(shard, req) => {
            forbidden(api, req, Refused::Internal, out, close)
        }
        Method::Get => match shard.resync_query(req.query, req.range) {
            Ok(q) => {
                let (status, count, body) = shard.resync_get(q).await;
                let mut digits = [0u8; 10];
                let range = crate::http::format_u32(&mut digits, count as u32);
                let mut headers: Vec<(&str, &[u8])> = vec![("Content-Type", b"application/json")];
                if status == 206 {
                    headers.push(("Content-Range", range));
                }
                write_response(out, status, &headers, &body, close);
                status
            }
            Err((status, reason)) => error(out, status, &reason, close),
        },
        _ => not_allowed(out, "GET, POST", close),
    }
}

/// `[timers] callback-allow` for a client's `POST` or `PUT`: every address
/// the callback's host stands for must be allowed (a name is resolved
/// off the shard's thread, within `callback-timeout-ms`). `Err` is the
/// status and reason: `400` the rule that refused, or that none matched,
/// or that the name did not resolve in time; `503` too many names being
/// resolved on this shard. Without a list, nothing is done.
/// Timers from other nodes are not checked here: their callbacks meet
/// this node's list when they pop (the client checks every callback's
/// address).
async fn guard_admits(shard: &Shard, s: &spec::TimerSpec<'_>) -> Result<(), (u16, String)> {
    let Some(guard) = shard.outbound.guard() else {
        return Ok(());
    };
    let target = uri::parse(&s.uri).map_err(|e| (400, e))?;
    let limit = Duration::from_millis(shard.base.resolved.config.timers.callback_timeout_ms);
    guard.check_host(target.host, target.port, limit).await
}

/// Why a `POST` with an empty callback got `400`.
const POST_NEEDS_CALLBACK: &str = "callback must contain an \"http\" object with a uri: a POST creates a timer (an empty callback is a replication tombstone, sent by PUT)";

/// `/timers/<id>`: `PUT` (a client's, or a replication body naming
/// `replicas`) and `DELETE`. `route`: set to the replication routes for
/// replication bodies.
async fn timer(
    api: &Api,
    id_text: &str,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    close: bool,
    route: &Cell<usize>,
) -> u16 {
    let shard = &*api.shard;
    if let (Method::Put | Method::Delete, Err(e)) = (req.method, shard.storage_admits()) {
        return error(out, e.status, &e.reason, close);
    }
    let Some(id) = TimerId::parse(id_text.as_bytes()) else {
        return error(
            out,
            404,
            "no such timer: a timer ID is 32 hex digits",
            close,
        );
    };
    match req.method {
        Method::Put => match spec::parse(req.body, uri::check) {
            Ok(s) if s.replication.is_some() && !internal_authorized(shard, req) => {
                forbidden(api, req, Refused::Internal, out, close)
            }
            Ok(s)
                if s.replication
                    .as_ref()
                    .is_some_and(|r| r.replicas.is_empty()) =>
            {
                route.set(const { route_index("site_replicate") });
                let result = shard.site_update(id, s).await;
                timer_result(out, result, close)
            }
            Ok(s) if s.replication.is_some() => {
                route.set(const { route_index("replicate") });
                let result = shard.replica_update(id, s).await;
                timer_result(out, result, close)
            }
            Ok(_) if !api.admission.admit(shard.base.my_stats()) => overloaded(out, close),
            Ok(s) => {
                if let Err(e) = shard.storage_admits_growth() {
                    return error(out, e.status, &e.reason, close);
                }
                let started = api.admission.latency_start();
                if let Err((status, reason)) = guard_admits(shard, &s).await {
                    return error(out, status, &reason, close);
                }
                let result = shard.client_update(id, s).await;
                api.admission.record_latency_since(started);
                timer_result(out, result, close)
            }
            Err(reason) => error(out, 400, &reason, close),
        },
        Method::Delete if !api.admission.admit(shard.base.my_stats()) => overloaded(out, close),
        Method::Delete => {
            let started = api.admission.latency_start();
            let result = shard.client_delete(id).await;
            api.admission.record_latency_since(started);
            match result {
                Ok(()) => text(out, 200, "", close),
                Err(e) => error(out, e.status, &e.reason, close),
            }
        }
        Method::Get => lookup::timer_get(&api.lookups, shard, id, req, out, close).await,
        _ => not_allowed(out, "GET, PUT, DELETE", close),
    }
}

/// Why an internal request got `403`.
const INTERNAL_REFUSED: &str =
    "internal API: missing or wrong shared secret (Authorization: Bearer <[cluster] shared-secret>), or, with mutual TLS, no client certificate signed by [cluster] tls-ca-file";

/// Why an admin request got `403`.
const ADMIN_REFUSED: &str = "admin API (/cluster, /resync, /metrics): missing or wrong shared secret (Authorization: Bearer <[cluster] shared-secret>)";

/// Whether an internal (replication, cross-site, resync) or admin
/// (`/cluster`, `/resync`, `/metrics`) request may proceed: always without
/// `[cluster] shared-secret`, else only with it. Allocates nothing.
fn authorized(shard: &Shard, req: &Request<'_>) -> bool {
    match &shard.base.resolved.config.cluster.shared_secret {
        None => true,
        Some(secret) => secret.admits(req.authorization),
    }
}

/// Whether an internal request (replication, cross-site, resync) may
/// proceed: [`authorized`], and with mutual TLS (`[cluster] tls` and
/// `tls-client-certificate`, so every peer presents one) only over a
/// connection whose client certificate the listener verified against
/// `[cluster] tls-ca-file`.
fn internal_authorized(shard: &Shard, req: &Request<'_>) -> bool {
    let c = &shard.base.resolved.config.cluster;
    let mutual = c.tls && c.tls_client_certificate.is_some();
    authorized(shard, req) && (!mutual || req.peer_certified)
}

/// `503` for a client request the token bucket refused.
fn overloaded(out: &mut Vec<u8>, close: bool) -> u16 {
    let reason = "overloaded: the request rate is above what this node admits now ([throttling]); retry later";
    write_response(out, 503, &[("Retry-After", b"1")], reason.as_bytes(), close);
    503
}

/// The kinds of refused request, each logged on its own schedule (an
/// unconfigured scraper does not hide a node with the wrong secret).
#[derive(Clone, Copy)]
enum Refused {
    Internal = 0,
    Admin = 1,
}

/// The least time between two log lines of one kind of refusal on a shard.
pub const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// `403` for an internal or admin request without the shared secret,
/// with the reason; counted (`chronos_internal_refused_total`) and logged
/// (rate-limited).
fn forbidden(api: &Api, req: &Request<'_>, kind: Refused, out: &mut Vec<u8>, close: bool) -> u16 {
    crate::stats::ShardStats::add(&api.shard.base.my_stats().internal_refused, 1);
    let reason = match kind {
        Refused::Internal => INTERNAL_REFUSED,
        Refused::Admin => ADMIN_REFUSED,
    };
    let limit = &api.refused_log[kind as usize];
    if let Some(quiet) = log_due(limit, Instant::now(), REFUSED_LOG_EVERY) {
        let more = match quiet {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        tracing::warn!(target: "chronos::api", "refused {} {} from {}: {reason}; [cluster] shared-secret must be the same on every node and site{more}", method_name(req.method), req.path, peer_of(req));
    }
    error(out, 403, reason, close)
}

fn method_name(method: Method) -> &'static str {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Other => "a request",
    }
}

/// Who sent a refused request, as far as the request says: a resync
/// listing names the node asking (`node-for-replicas`); replication,
/// cross-site and admin requests do not name their sender.
fn peer_of(req: &Request<'_>) -> String {
    let named = req
        .query
        .split('&')
        .find_map(|pair| pair.strip_prefix("node-for-replicas="));
    // The connection's address, and what the request says it is (a
    // claim, not proof).
    let ip = req
        .peer
        .map_or_else(|| "an unknown address".to_string(), |ip| ip.to_string());
    match named {
        Some(node) => format!("{ip} (naming node {node} in node-for-replicas)"),
        None => ip,
    }
}

fn ready(api: &Api, method: Method, out: &mut Vec<u8>, close: bool) -> u16 {
    let (status, body) = match api.shard.readiness().and_then(|()| (api.ready)()) {
        Ok(()) => (200, "ready".to_string()),
        Err(why) => (503, format!("not ready: {why}")),
    };
    let body = if method == Method::Head {
        ""
    } else {
        body.as_str()
    };
    text(out, status, body, close)
}

async fn metrics(shard: &Shard, out: &mut Vec<u8>, close: bool) -> u16 {
    let tags = shard.all_tags().await;
    let mut text = String::with_capacity(4096);
    let sites: Vec<String> = shard
        .base
        .resolved
        .sites
        .remote
        .iter()
        .map(|r| r.name.clone())
        .collect();
    crate::stats::render(&shard.base.stats, &tags, &sites, &mut text);
    write_response(
        out,
        200,
        &[("Content-Type", b"text/plain; version=0.0.4")],
        text.as_bytes(),
        close,
    );
    200
}

fn timer_result(out: &mut Vec<u8>, result: Result<TimerId, OpError>, close: bool) -> u16 {
    match result {
        Ok(id) => {
            let mut location = [0u8; 8 + 32];
            location[..8].copy_from_slice(b"/timers/");
            location[8..].copy_from_slice(&id.to_hex());
            if close {
                write_response(out, 200, &[("Location", &location)], b"", close);
            } else {
                crate::http::write_ok_location(out, &location);
            }
            200
        }
        Err(e) => error(out, e.status, &e.reason, close),
    }
}

fn text(out: &mut Vec<u8>, status: u16, body: &str, close: bool) -> u16 {
    write_response(out, status, &[], body.as_bytes(), close);
    status
}

fn error(out: &mut Vec<u8>, status: u16, reason: &str, close: bool) -> u16 {
    assert!(status >= 400, "an error status");
    text(out, status, reason, close)
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

//! Wall-clock and calendar timers end to end (issue 42, items 2, 3, 5):
//! `at`, `start-at` with `interval`, and `cron` with `time-zone` and
//! `repeat-for`, on real nodes popping to a real sink: at their
//! wall-clock instants, never early; across a replica failover, a resync
//! to a joining node, another site, and a restart with `[storage]` (a
//! missed occurrence fires once); shown by `GET /timers/<id>` from a node
//! that is not a replica; refused with a reason when malformed; stopped
//! by a `DELETE`.
//!
//! Waits are on events with deadlines; the bounds on lateness leave room
//! for a loaded 2-core machine (`LATE`).

mod common;

use common::durable::Store;
use common::target::member_config;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How late a pop may be on a loaded machine (it is never early).
const LATE: Duration = Duration::from_millis(1500);
/// A pop is at or after its instant; this much slack covers the test's
/// own mapping from the sink's `Instant` to the wall clock.
const CLOCK_SLACK_MS: i64 = 15;
/// The replica skew (`replica-skew-ms`, default).
const SKEW_MS: i64 = 2000;

/// The wall clock (Unix ms) and the monotonic clock read together, to map
/// a sink's `Instant` to wall-clock ms.
struct Clocks {
    unix_ms: i64,
    at: Instant,
}

impl Clocks {
    fn now() -> Clocks {
        Clocks {
            unix_ms: unix_ms(),
            at: Instant::now(),
        }
    }

    fn unix_of(&self, at: Instant) -> i64 {
        match at.checked_duration_since(self.at) {
            Some(d) => self.unix_ms + d.as_millis() as i64,
            None => self.unix_ms - self.at.duration_since(at).as_millis() as i64,
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// RFC 3339, UTC, with ms.
fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).unwrap().to_string()
}

fn body(timing: &str, uri: &str, opaque: &str) -> String {
    format!(
        r#"{{"timing":{{{timing}}},"callback":{{"http":{{"uri":"{uri}","opaque":"{opaque}"}}}}}}"#
    )
}

/// Pops of `path`, with their wall-clock ms.
fn pops_of(sink: &Sink, path: &str, clocks: &Clocks) -> Vec<(u32, i64)> {
    sink.pops()
        .into_iter()
        .filter(|p| p.path == path && p.ok)
        .map(|p| (p.sequence, clocks.unix_of(p.at)))
        .collect()
}

/// Wait until `path` has `n` pops.
fn wait_pops(
    sink: &Sink,
    path: &str,
    n: usize,
    within: Duration,
    clocks: &Clocks,
) -> Vec<(u32, i64)> {
    wait_until(&format!("{n} pops of {path}"), within, || {
        let got = pops_of(sink, path, clocks);
        match got.len() >= n {
            true => Ok(got),
            false => Err(format!("{got:?}")),
        }
    })
}

/// `popped` is at or after `due`, and not later than `LATE`.
fn assert_on_time(popped_ms: i64, due_ms: i64, what: &str) {
    assert!(
        popped_ms + CLOCK_SLACK_MS >= due_ms,
        "{what}: early by {} ms",
        due_ms - popped_ms
    );
    assert!(
        popped_ms <= due_ms + LATE.as_millis() as i64,
        "{what}: late by {} ms",
        popped_ms - due_ms
    );
}

#[test]
fn an_at_timer_pops_at_its_instant_and_one_in_the_past_at_once() {
    let node = Node::start("[runtime]\ncores = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let at_ms = unix_ms() + 2_500;
    let text = rfc3339(at_ms);
    let id = node.create(&body(&format!(r#""at":"{text}""#), &sink.uri("/at"), "a"));
    let t = look_up(&node, &id);
    assert_eq!(t["timing"], serde_json::json!({"at": text}), "{t}");
    let due = t["next-pop"]["unix-ms"].as_i64().unwrap();
    assert!(
        (at_ms..=at_ms + 3).contains(&due),
        "next-pop {due} for {at_ms}"
    );
    assert_eq!(t["next-pop"]["sequence"], 1);
    let past = body(
        r#""at":"2020-01-01T00:00:00+01:00""#,
        &sink.uri("/past"),
        "p",
    );
    let created_ms = unix_ms();
    node.create(&past);
    let p = wait_pops(&sink, "/past", 1, Duration::from_secs(5), &clocks);
    assert_on_time(p[0].1, created_ms, "an `at` in the past pops at once");
    let a = wait_pops(&sink, "/at", 1, Duration::from_secs(10), &clocks);
    assert_on_time(a[0].1, at_ms, "the `at` pop");
    assert_eq!(a[0].0, 1, "one pop, sequence 1");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pops_of(&sink, "/at", &clocks).len(), 1, "a one-shot");
}

#[test]
fn a_start_at_timer_first_pops_at_start_at_then_every_interval() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let start_ms = unix_ms() + 2_000;
    let text = rfc3339(start_ms);
    let timing = format!(r#""start-at":"{text}","interval":1,"repeat-for":3"#);
    let id = node.create(&body(&timing, &sink.uri("/s"), "s"));
    let t = look_up(&node, &id);
    assert_eq!(
        t["timing"],
        serde_json::json!({"start-at": text, "interval": 1, "repeat-for": 3}),
        "{t}"
    );
    let pops = wait_pops(&sink, "/s", 3, Duration::from_secs(12), &clocks);
    for (k, (sequence, at)) in pops.iter().enumerate() {
        assert_eq!(*sequence as usize, k + 1, "{pops:?}");
        assert_on_time(*at, start_ms + 1000 * k as i64, &format!("pop {}", k + 1));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        pops_of(&sink, "/s", &clocks).len(),
        3,
        "repeat-for 3 s: 3 pops"
    );
}

#[test]
fn a_cron_timer_with_seconds_in_a_zone_pops_each_occurrence_then_ends() {
    let node = Node::start("[runtime]\ncores = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let timing = r#""cron":"*/2 * * * * *","time-zone":"Asia/Kolkata","repeat-for":7"#;
    let created_ms = unix_ms();
    let id = node.create(&body(timing, &sink.uri("/c"), "c"));
    // The node's start (its clock at the creation) lies between the two.
    let answered_ms = unix_ms();
    let t = look_up(&node, &id);
    assert_eq!(
        t["timing"],
        serde_json::json!({"cron": "*/2 * * * * *", "time-zone": "Asia/Kolkata", "repeat-for": 7}),
        "{t}"
    );
    let first = t["next-pop"]["unix-ms"].as_i64().unwrap();
    assert_eq!(first % 2000, 0, "an even second: {t}");
    assert!(
        first > created_ms - 1000 && first <= answered_ms + 2000,
        "{t}"
    );
    // The occurrences within 7 s of the start (the creation), for the
    // earliest and the latest start it can have been.
    let within = |start: i64| -> Vec<i64> {
        (0..5)
            .map(|k| first + 2000 * k)
            .filter(|o| *o <= start + 7000)
            .collect()
    };
    let expected = within(answered_ms);
    let fewest = within(created_ms).len() - 1;
    let pops = wait_pops(&sink, "/c", fewest, Duration::from_secs(15), &clocks);
    std::thread::sleep(Duration::from_millis(3500));
    let pops_now = pops_of(&sink, "/c", &clocks);
    assert!(
        (fewest..=expected.len()).contains(&pops_now.len()),
        "the occurrences within repeat-for, one of them maybe at its edge: {pops_now:?} for {expected:?}"
    );
    for (k, (sequence, at)) in pops_now.iter().enumerate() {
        assert_eq!(
            *sequence as usize,
            k + 1,
            "sequence numbers in order: {pops:?}"
        );
        assert_on_time(*at, expected[k], &format!("occurrence {}", k + 1));
    }
    let gone = node.request("GET", &format!("/timers/{id}"), "");
    assert_eq!(gone.status, 404, "ended after repeat-for: {}", gone.text());
}

#[test]
fn bad_timings_are_refused_with_a_reason() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let uri = "http://127.0.0.1:9/cb";
    let table = [
        (
            r#""at":"2026-12-01 09:00""#,
            "timing.at: expected an RFC 3339 instant",
        ),
        (
            r#""at":"2026-12-01T09:00:00Z","interval":5"#,
            "timing.at is a one-shot",
        ),
        (
            r#""start-at":"2026-12-01T09:00:00Z""#,
            "timing.start-at needs timing.interval",
        ),
        (
            r#""cron":"0 9 * * MON-FRI""#,
            "timing.cron needs timing.repeat-for",
        ),
        (r#""cron":"0 9 * * FUNDAY","repeat-for":60"#, "timing.cron:"),
        (
            r#""cron":"0 9 * * *","repeat-for":60,"time-zone":"Europe/Pariss""#,
            "not in the IANA time zone database",
        ),
        (
            r#""cron":"0 9 * * *","repeat-for":60,"interval":1"#,
            "timing.cron with timing.interval",
        ),
        (
            r#""time-zone":"UTC","interval":1"#,
            "timing.time-zone applies to timing.cron only",
        ),
        (
            r#""at":"2026-12-01T09:00:00Z","cron":"* * * * *","repeat-for":5"#,
            "exclude each other",
        ),
    ];
    for (timing, needle) in table {
        let r = node.request("POST", "/timers", &body(timing, uri, "x"));
        assert_eq!(r.status, 400, "{timing}: {}", r.text());
        assert!(r.text().contains(needle), "{timing}: {}", r.text());
    }
}

#[test]
fn a_deleted_cron_timer_stops_popping() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let timing = r#""cron":"* * * * * *","repeat-for":120"#;
    let id = node.create(&body(timing, &sink.uri("/d"), "d"));
    wait_pops(&sink, "/d", 2, Duration::from_secs(10), &clocks);
    assert_eq!(
        node.request("DELETE", &format!("/timers/{id}"), "").status,
        200
    );
    let at_delete = pops_of(&sink, "/d", &clocks).len();
    std::thread::sleep(Duration::from_millis(3000));
    let after = pops_of(&sink, "/d", &clocks).len();
    assert!(
        after <= at_delete + 1,
        "at most a pop in flight: {at_delete} then {after}"
    );
    assert_eq!(
        node.request("GET", &format!("/timers/{id}"), "").status,
        404
    );
}

/// The next instant whose second is `s` seconds away at least, as the
/// seconds field of a once-a-minute cron and its Unix ms.
fn a_second_ahead(at_least_ms: i64) -> (u32, i64) {
    let due = (unix_ms() + at_least_ms + 999) / 1000 * 1000;
    (((due / 1000) % 60) as u32, due)
}

/// `GET /timers/<id>` through `n` shows the weekday timer as written, its
/// next pop at 09:00:00 in Paris on a weekday within four days.
fn assert_weekdays_at_nine_in_paris(n: &Node, id: &str) {
    let t = look_up(n, id);
    assert_eq!(
        t["timing"],
        serde_json::json!({"cron": "0 9 * * MON-FRI", "time-zone": "Europe/Paris", "repeat-for": 2592000}),
        "through {}: {t}",
        n.addr
    );
    let next = t["next-pop"]["unix-ms"].as_i64().unwrap();
    let paris = jiff::Timestamp::from_millisecond(next)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::get("Europe/Paris").unwrap());
    assert_eq!(
        (paris.hour(), paris.minute(), paris.second()),
        (9, 0, 0),
        "{t}"
    );
    assert!(
        paris.weekday().to_monday_one_offset() <= 5,
        "a weekday: {paris}"
    );
    assert!(next > unix_ms() && next < unix_ms() + 4 * 86_400_000, "{t}");
}

#[test]
fn a_look_up_through_a_node_that_is_not_a_replica_and_a_failover() {
    let mut nodes = start_cluster(3, 1, "[timers]\ndefault-replication-factor = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let weekdays = r#""cron":"0 9 * * MON-FRI","time-zone":"Europe/Paris","repeat-for":2592000"#;
    let id = nodes[0].create(&body(weekdays, &sink.uri("/w"), "w"));
    let (second, due_ms) = a_second_ahead(5_000);
    let soon =
        format!(r#""cron":"{second} * * * * *","time-zone":"America/New_York","repeat-for":120"#);
    let soon_id = nodes[0].create(&body(&soon, &sink.uri("/f"), "f"));
    let replicas: Vec<String> = look_up(&nodes[0], &soon_id)["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    // The weekday timer, read through every node (one of them holds none).
    for n in &nodes {
        assert_weekdays_at_nine_in_paris(n, &id);
    }
    // Kill the first replica before the occurrence: the second pops it,
    // one skew late.
    let at = |addr: &str| {
        nodes
            .iter()
            .position(|n| n.addr.to_string() == addr)
            .unwrap()
    };
    let (primary, backup) = (at(&replicas[0]), at(&replicas[1]));
    wait_until(
        "the backup holds the timer",
        Duration::from_secs(10),
        || {
            let r = request(
                nodes[backup].addr,
                "GET",
                &format!("/timers/{soon_id}"),
                &[("X-Chronos-Local-Only", "1")],
                b"",
            );
            match r.status {
                200 => Ok(()),
                s => Err(format!("{s}")),
            }
        },
    );
    assert!(unix_ms() < due_ms - 1000, "killed before the occurrence");
    nodes[primary].kill9();
    let pops = wait_pops(&sink, "/f", 1, Duration::from_secs(15), &clocks);
    assert_eq!(pops[0].0, 1);
    assert_on_time(
        pops[0].1,
        due_ms + SKEW_MS,
        "the backup's pop, one skew late",
    );
}

#[test]
fn a_restart_with_storage_keeps_the_calendar_and_fires_a_missed_run_once() {
    let store = Store::new("calendar");
    let port = free_port();
    let cfg = store.config(1, "");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let node = Node::start_at("127.0.0.1", port, &cfg);
    let timing = r#""cron":"* * * * * *","time-zone":"Europe/Paris","repeat-for":600"#;
    let id = node.create(&body(timing, &sink.uri("/r"), "r"));
    wait_pops(&sink, "/r", 2, Duration::from_secs(10), &clocks);
    assert!(node.terminate().success());
    let before = pops_of(&sink, "/r", &clocks);
    // Down for at least 5 occurrences.
    std::thread::sleep(Duration::from_millis(5500));
    let restarted = Instant::now();
    let node = Node::start_at("127.0.0.1", port, &cfg);
    node.wait_ready_200(Duration::from_secs(30));
    let t = look_up(&node, &id);
    assert_eq!(
        t["timing"]["cron"], "* * * * * *",
        "the calendar came back: {t}"
    );
    assert_eq!(t["timing"]["time-zone"], "Europe/Paris", "{t}");
    let n = before.len();
    let all = wait_pops(&sink, "/r", n + 3, Duration::from_secs(10), &clocks);
    for (k, (sequence, _)) in all.iter().enumerate() {
        assert_eq!(
            *sequence as usize,
            k + 1,
            "each sequence once, in order: {all:?}"
        );
    }
    // Once per missed occurrence would be 5 or more at once; the rule
    // fires the missed one, then the schedule's next (which may follow
    // within a few hundred ms).
    let first_after = all[n].1;
    let burst = all[n..]
        .iter()
        .filter(|(_, at)| *at < first_after + 300)
        .count();
    assert!(
        burst <= 2,
        "a missed run fires once, not once per occurrence: {all:?}"
    );
    assert!(
        clocks.unix_of(restarted) <= first_after + CLOCK_SLACK_MS,
        "{all:?}"
    );
}

#[test]
fn a_joining_node_gets_the_calendar_timer_by_resync() {
    let port = cluster_port(2);
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let mut first = start_member(1, port, &member_config(1, port, &[1], &[]));
    let (second_field, due_ms) = a_second_ahead(20_000);
    let timing = format!(
        r#""cron":"{second_field} * * * * *","time-zone":"Australia/Lord_Howe","repeat-for":300"#
    );
    let id = first.create(&body(&timing, &sink.uri("/j"), "j"));
    let second = start_member(2, port, &member_config(2, port, &[1], &[2]));
    reload_view(&first, &member_config(1, port, &[1], &[2]));
    resync_cli(&first);
    resync_cli(&second);
    let local = request(
        second.addr,
        "GET",
        &format!("/timers/{id}"),
        &[("X-Chronos-Local-Only", "1")],
        b"",
    );
    assert_eq!(local.status, 200, "node 2 holds it: {}", local.text());
    let t: Value = serde_json::from_slice(&local.body).unwrap();
    assert_eq!(
        t["timing"]["cron"],
        format!("{second_field} * * * * *"),
        "{t}"
    );
    assert_eq!(t["timing"]["time-zone"], "Australia/Lord_Howe", "{t}");
    assert!(unix_ms() < due_ms - 1000, "the occurrence is still ahead");
    first.kill9();
    let pops = wait_pops(&sink, "/j", 1, Duration::from_secs(40), &clocks);
    assert_eq!(pops[0].0, 1);
    // Node 2 is the first or the second replica under the new view.
    let popped = pops[0].1;
    assert!(
        popped + CLOCK_SLACK_MS >= due_ms && popped <= due_ms + SKEW_MS + LATE.as_millis() as i64,
        "the resynced copy pops the occurrence at {due_ms}: {popped}"
    );
}

/// Two single-node sites: the other site gets the `at` timer with its
/// absolute instant and pops it one site skew later once the first site
/// is gone.
#[test]
fn another_site_pops_an_at_timer_at_its_instant_plus_the_site_skew() {
    let port = cluster_port(2);
    let cfg = |ip: &str, name: &str, other: (&str, &str)| {
        format!(
            "[runtime]\ncores = 1\n[cluster]\nlocalhost = \"{ip}:{port}\"\nnode = [\"{ip}:{port}\"]\n[sites]\nlocal_site = \"{name}\"\nremote_site = [\"{}={}:{port}\"]\nreplicate_timers_across_sites = true\n",
            other.0, other.1
        )
    };
    let mut s1 = Node::start_at(
        "127.0.0.1",
        port,
        &cfg("127.0.0.1", "S1", ("S2", "127.0.0.2")),
    );
    let s2 = Node::start_at(
        "127.0.0.2",
        port,
        &cfg("127.0.0.2", "S2", ("S1", "127.0.0.1")),
    );
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let at_ms = unix_ms() + 5_000;
    let text = rfc3339(at_ms);
    let id = s1.create(&body(&format!(r#""at":"{text}""#), &sink.uri("/g"), "g"));
    wait_until("site 2 holds it", Duration::from_secs(10), || {
        let r = request(
            s2.addr,
            "GET",
            &format!("/timers/{id}"),
            &[("X-Chronos-Local-Only", "1")],
            b"",
        );
        match r.status {
            200 => Ok(serde_json::from_slice::<Value>(&r.body).unwrap()),
            s => Err(format!("{s}")),
        }
    });
    let t = look_up(&s2, &id);
    assert_eq!(t["timing"], serde_json::json!({"at": text}), "{t}");
    s1.kill9();
    let pops = wait_pops(&sink, "/g", 1, Duration::from_secs(15), &clocks);
    // One site's skew: a whole replica list (factor 2, capped at 1 node,
    // counted by the requested factor) of skews.
    let site_skew_ms = t["reliability"]["replication-factor"].as_i64().unwrap() * SKEW_MS;
    assert_on_time(pops[0].1, at_ms + site_skew_ms, "site 2's pop");
}

/// `Idempotency-Key` compares the timing as written: the same cron body
/// twice is one timer, another schedule under the key is `422`.
#[test]
fn an_idempotent_create_compares_the_calendar() {
    let node = Node::start("[runtime]\ncores = 1\n");
    let uri = "http://127.0.0.1:9/cb";
    let post = |timing: &str| {
        request(
            node.addr,
            "POST",
            "/timers",
            &[("Idempotency-Key", "calendar-1")],
            body(timing, uri, "k").as_bytes(),
        )
    };
    let weekdays = r#""cron":"0 9 * * MON-FRI","time-zone":"Europe/Paris","repeat-for":2592000"#;
    let first = post(weekdays);
    assert_eq!(first.status, 200, "{}", first.text());
    let again = post(weekdays);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.location_id(), first.location_id(), "one timer");
    let other =
        post(r#""cron":"0 10 * * MON-FRI","time-zone":"Europe/Paris","repeat-for":2592000"#);
    assert_eq!(other.status, 422, "another schedule: {}", other.text());
}

/// A pop's replication carries the cron timer's next occurrence: once the
/// first replica popped one and is killed, the second pops the next
/// occurrence with the next sequence number, one skew late.
#[test]
fn after_a_pop_the_backup_takes_the_next_occurrence() {
    let mut nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    let sink = Sink::start(Behaviour::Ok);
    let clocks = Clocks::now();
    let timing = r#""cron":"*/4 * * * * *","time-zone":"Europe/London","repeat-for":60"#;
    let id = nodes[0].create(&body(timing, &sink.uri("/n"), "n"));
    let replicas = look_up(&nodes[0], &id)["replicas"].clone();
    let at = |k: usize| {
        nodes
            .iter()
            .position(|n| replicas[k] == n.addr.to_string().as_str())
            .unwrap()
    };
    let (primary, backup) = (at(0), at(1));
    let first = wait_pops(&sink, "/n", 1, Duration::from_secs(10), &clocks);
    assert_eq!(first[0].0, 1);
    let local = || {
        let r = request(
            nodes[backup].addr,
            "GET",
            &format!("/timers/{id}"),
            &[("X-Chronos-Local-Only", "1")],
            b"",
        );
        serde_json::from_slice::<Value>(&r.body).unwrap_or(Value::Null)
    };
    let next = wait_until(
        "the backup knows pop 1 done",
        Duration::from_secs(3),
        || {
            let t = local();
            match t["pops-done"].as_u64() {
                Some(1) => Ok(t["next-pop"]["unix-ms"].as_i64().unwrap()),
                _ => Err(t.to_string()),
            }
        },
    );
    assert_eq!(next % 4000, 0, "the next occurrence");
    assert!(unix_ms() < next - 300, "killed before the next occurrence");
    nodes[primary].kill9();
    let pops = wait_pops(&sink, "/n", 2, Duration::from_secs(10), &clocks);
    assert_eq!(pops[1].0, 2, "{pops:?}");
    assert_on_time(
        pops[1].1,
        next + SKEW_MS,
        "the backup's pop of the next occurrence",
    );
}

/// A cron timer with a retry policy on two replicas: pop 1 keeps failing
/// and is retried while later occurrences pop. Each retry's report must
/// carry the cursor that goes with its sequence: with the retried pop's
/// own cursor beside a later sequence (the cold review of issue 42), the
/// backup popped a past occurrence again and from then on every
/// occurrence twice, under the owner's sequence numbers.
#[test]
fn a_cron_timers_retried_pop_does_not_make_the_backup_pop_again() {
    use common::target::{Reply, Target};
    let nodes = start_cluster(2, 1, "[timers]\ndefault-replication-factor = 2\n");
    let target = Target::start(|hits| match hits.last().map(|h| h.sequence()) {
        Some(1) => Reply::status(500),
        _ => Reply {
            hold: Duration::from_millis(600),
            ..Reply::status(200)
        },
    });
    let retry =
        r#""retry":{"attempts":40,"initial-delay":0.25,"multiplier":1,"jitter":0,"max-delay":1}"#;
    let body = format!(
        r#"{{"timing":{{"cron":"* * * * * *","repeat-for":30}},"callback":{{"http":{{"uri":"{}","opaque":"x"}},{retry}}}}}"#,
        target.uri("/c")
    );
    nodes[0].create(&body);
    // Sequences 2 to 8 popped: several reports of pop 1's retries have
    // reached the backup meanwhile.
    wait_until("sequence 8", Duration::from_secs(30), || {
        let top = target
            .hits()
            .iter()
            .map(|h| h.sequence())
            .max()
            .unwrap_or(0);
        if top >= 8 {
            Ok(())
        } else {
            Err(format!("sequence {top}"))
        }
    });
    let mut firsts = std::collections::BTreeMap::new();
    for h in target.hits().iter().filter(|h| h.sequence() > 1) {
        *firsts.entry(h.sequence()).or_insert(0u32) += 1;
    }
    let twice: Vec<_> = firsts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "pops per sequence: {firsts:?}");
}

//! Callback admission and withdrawal (issue 20, from a review of the
//! shard's pop loop, its per-target admission, `callback_wanted` and the
//! HTTP client's lanes), with real processes: a callback is withdrawn only
//! after an operation that replaces it, a held pop is never promoted
//! early, a lane leaves no stale jobs behind, and a queued final pop
//! outliving its tombstone is still sent. Each test states the defect it
//! showed.

mod common;

use common::*;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pops_of(sink: &Sink, path: &str) -> Vec<Pop> {
    sink.pops().into_iter().filter(|p| p.path == path).collect()
}

/// A single node keeps no tombstones, so after a repeating timer's final
/// pop nothing of it is in the store. A callback of an earlier pop of the
/// same timer still waiting for its lane is then judged "not wanted"
/// (`callback_wanted`: store empty and `final_pop == false`) and withdrawn
/// unsent, with no DELETE or PUT anywhere: that pop is never delivered.
#[test]
fn review_single_node_repeating_pop_is_not_withdrawn_by_its_final_pop() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[timers]\ncallback-connections-per-host-max = 1\ncallback-timeout-ms = 5000\n",
    );
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(1000)));
    // Pops at 0.3, 0.6, 0.9 s (the last is final). Pop 1 holds the only
    // connection until ~1.3 s; pops 2 and 3 wait for it, and the final
    // pop (0.9 s) empties the store before pop 2 gets the lane.
    node.create(&timer_body("0.3", Some("0.9"), &sink.uri("/rep"), "x"));
    wait_until(
        "three pops or a withdrawal",
        Duration::from_secs(15),
        || {
            let withdrawn = node.metric("chronos_callbacks_withdrawn_total");
            let n = sink.pops().len();
            if n >= 3 || (withdrawn > 0.0 && n >= 2) {
                Ok(())
            } else {
                Err(format!("{n} pops, {withdrawn} withdrawn"))
            }
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    let seqs: Vec<u32> = sink.pops().iter().map(|p| p.sequence).collect();
    assert_eq!(
        seqs,
        vec![1, 2, 3],
        "every pop delivered once (withdrawn: {})",
        node.metric("chronos_callbacks_withdrawn_total")
    );
}

/// `PopState::finals` is a set of IDs: a PUT that re-creates a timer
/// whose final pop still waits for its lane removes the ID (right: the old
/// callback must be withdrawn), but the new incarnation's final pop puts
/// the same ID back, so the old callback is sent after all; and when the
/// old callback's slot is dropped it removes the ID again, so the new
/// incarnation's callback is withdrawn and never delivered.
#[test]
fn review_a_put_during_a_queued_final_pop_sends_the_new_timer_not_the_old() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[timers]\ncallback-connections-per-host-max = 1\ncallback-timeout-ms = 5000\n",
    );
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(400)));
    // Fillers: 8 pops at 0.5 s, sent one at a time (~3.2 s in all).
    for i in 0..8 {
        node.create(&timer_body("0.5", None, &sink.uri(&format!("/f/{i}")), "x"));
    }
    let id = node.create(&timer_body("0.7", None, &sink.uri("/x-old"), "old"));
    let created = Instant::now();
    // The old X has popped (0.7 s) and waits behind the fillers.
    sleep_until(created + Duration::from_millis(1100));
    assert!(
        pops_of(&sink, "/x-old").is_empty(),
        "the old X is still queued"
    );
    let r = node.request(
        "PUT",
        &format!("/timers/{id}"),
        &timer_body("0.2", None, &sink.uri("/x-new"), "new"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let new_pops = wait_for_path(&sink, "/x-new", Duration::from_secs(15));
    let old_pops = pops_of(&sink, "/x-old");
    assert!(
        new_pops == 1 && old_pops.is_empty(),
        "the PUT's timer popped {new_pops} times, the replaced one {} times (withdrawn: {})",
        old_pops.len(),
        node.metric("chronos_callbacks_withdrawn_total")
    );
}

fn wait_for_path(sink: &Sink, path: &str, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !pops_of(sink, path).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    pops_of(sink, path).len()
}

/// A held pop's ID stays in its target's held queue after the timer was
/// updated (or after its fallback time dispatched it). When one of the
/// target's callbacks ends, `promote_held` finds the ID, sees a live timer
/// for the same target due in the future, and moves it to "due now": the
/// timer pops early (here ~55 s early), breaking "never early".
#[test]
fn review_a_held_pop_updated_by_a_put_is_not_promoted_early() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[timers]\ncallback-in-flight-max = 4\ncallback-in-flight-per-target-max = 1\ncallback-timeout-ms = 20000\n",
    );
    let a = Sink::start(Behaviour::Slow(Duration::from_millis(4000)));
    let b = Sink::start(Behaviour::Hang);
    // Three slots taken: one by target A (until ~4.3 s), two by B.
    node.create(&timer_body("0.3", None, &a.uri("/fa"), "x"));
    node.create(&timer_body("0.3", None, &b.uri("/fb1"), "x"));
    node.create(&timer_body("0.3", None, &b.uri("/fb2"), "x"));
    // T is due at 1 s: A is at its share and the reserve is reached: held.
    let id = node.create(&timer_body("1", Some("100"), &a.uri("/t-old"), "x"));
    let created = Instant::now();
    wait_until("T held", Duration::from_secs(10), || {
        let held = node.metric("chronos_callbacks_held_total");
        if held >= 1.0 {
            Ok(())
        } else {
            Err(format!("{held} held"))
        }
    });
    // The client moves T a minute out (same target).
    let r = node.request(
        "PUT",
        &format!("/timers/{id}"),
        &timer_body("60", Some("120"), &a.uri("/t-new"), "x"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let put_at = Instant::now();
    // A's callback ends at ~4.3 s; wait well past it.
    sleep_until(created + Duration::from_secs(8));
    let early: Vec<Duration> = pops_of(&a, "/t-new")
        .iter()
        .map(|p| p.at.saturating_duration_since(put_at))
        .collect();
    assert!(
        early.is_empty(),
        "T (due 60 s after the PUT) popped {:?} after the PUT",
        early
    );
}

/// What the slow target of the lane test saw, per path.
type Seen = Arc<Mutex<Vec<String>>>;

/// A target that answers 200 after 200 ms, except for paths starting
/// with `/drop`, where it closes the connection without answering (a
/// transport failure for the client).
fn slow_or_dropping_target() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Default::default();
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let s = s.clone();
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                while let Some((path, _, _)) = read_request(&mut reader) {
                    s.lock().unwrap().push(path.clone());
                    if path.starts_with("/drop") {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    if writer
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// A target slower than an eighth of `callback-timeout-ms` per request
/// gets a batch limit of 1. A lane then takes only its own job, which it
/// takes out of order, and pops nothing off the target's job queue: every
/// callback leaves a dead `Rc<Job>` there (memory grows with every
/// callback to such a target), and `admit_waiter` counts them as waiting.
/// After one transport failure, every callback to the target for the next
/// 2 s fails at once ("1024 requests already wait") although none waits,
/// and on a single node those pops are lost.
#[test]
fn review_lane_leaves_no_stale_jobs_that_fail_later_callbacks() {
    later_callbacks_after_a_failure(1300);
}

/// The control: the same with 50 earlier callbacks (fewer than 1024
/// stale jobs can be left) delivers every later callback.
#[test]
fn review_lane_control_with_few_earlier_callbacks() {
    later_callbacks_after_a_failure(50);
}

fn later_callbacks_after_a_failure(n: usize) {
    let node = Node::start("[runtime]\ncores = 1\n");
    let (addr, seen) = slow_or_dropping_target();
    let uri = |p: &str| format!("http://{addr}{p}");
    let bodies: Vec<String> = (0..n)
        .map(|i| timer_body("1", None, &uri(&format!("/ok/{i}")), "x"))
        .collect();
    for b in &bodies {
        node.create(b);
    }
    wait_until("the slow callbacks", Duration::from_secs(60), || {
        let ok = node.metric("chronos_callbacks_succeeded_total") as usize;
        if ok >= n {
            Ok(())
        } else {
            Err(format!("{ok} of {n} answered"))
        }
    });
    // One transport failure marks the target failing for 2 s.
    node.create(&timer_body("0.5", None, &uri("/drop"), "x"));
    for i in 0..20 {
        node.create(&timer_body("1", None, &uri(&format!("/after/{i}")), "x"));
    }
    wait_until("the later callbacks", Duration::from_secs(20), || {
        let done = node.metric("chronos_callbacks_succeeded_total")
            + node.metric("chronos_callbacks_failed_total");
        if done as usize >= n + 21 {
            Ok(())
        } else {
            Err(format!("{done} done"))
        }
    });
    let after = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.starts_with("/after/"))
        .count();
    assert_eq!(
        after,
        20,
        "callbacks never sent ({} failed in all; only /drop failed on the wire)",
        node.metric("chronos_callbacks_failed_total")
    );
}

/// The same early promotion without any client operation: a repeating
/// timer held twice (its fallback came while its target was still at its
/// share) has two IDs in the held queue; the first promotion dispatches
/// it, and when its own callback ends the stale second ID promotes its
/// *next* pop to now.
#[test]
fn review_a_repeating_held_pop_is_not_promoted_before_its_next_schedule() {
    let node = Node::start(
        "[runtime]\ncores = 1\n[timers]\ncallback-in-flight-max = 4\ncallback-in-flight-per-target-max = 1\ncallback-timeout-ms = 20000\n",
    );
    let a = Sink::start(Behaviour::Slow(Duration::from_millis(2100)));
    let b = Sink::start(Behaviour::Hang);
    // At 5.5 s: one slot to A (until ~7.6 s), two to B (hanging).
    node.create(&timer_body("5.5", None, &a.uri("/fa"), "x"));
    node.create(&timer_body("5.5", None, &b.uri("/fb1"), "x"));
    node.create(&timer_body("5.5", None, &b.uri("/fb2"), "x"));
    // T pops every 6 s: held at 6 s and again at its 7 s fallback.
    let t0 = Instant::now();
    node.create(&timer_body("6", Some("60"), &a.uri("/t"), "x"));
    sleep_until(t0 + Duration::from_secs(14));
    let at: Vec<(u32, Duration)> = pops_of(&a, "/t")
        .iter()
        .map(|p| (p.sequence, p.at.saturating_duration_since(t0)))
        .collect();
    for &(seq, after) in &at {
        let due = Duration::from_secs(6 * seq as u64);
        assert!(
            after + Duration::from_millis(50) >= due,
            "pop {seq} of T came {after:?} after its creation, due at {due:?}: early (all: {at:?})"
        );
    }
    assert!(!at.is_empty(), "T popped at all");
}

/// In a cluster a final pop leaves a tombstone, and `callback_wanted`
/// asks the store for it. The last replica (here: replication factor 1)
/// waits for a connection as long as it takes, so a callback can wait
/// longer than the tombstone lives (`max(interval + skew,
/// deliver-within plus timeout)`: 2.5 s here, 31.5 s by default); once it
/// expired the store is empty and the callback is withdrawn unsent: the pop is lost with no
/// failure and no client operation.
#[test]
fn review_a_queued_final_pop_outliving_its_tombstone_is_still_sent() {
    let extra = "replication-deliver-within-ms = 1000\nreplication-timeout-ms = 500\n[timers]\ncallback-connections-per-host-max = 1\n";
    let nodes = start_cluster(2, 1, extra);
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(600)));
    let n = 16;
    for i in 0..n {
        let body = replicated_body("0.5", None, &sink.uri(&format!("/q/{i}")), "x", 1);
        nodes[0].create(&body);
    }
    wait_until("every callback done", Duration::from_secs(30), || {
        let done: f64 = nodes
            .iter()
            .map(|x| {
                x.metric("chronos_callbacks_succeeded_total")
                    + x.metric("chronos_callbacks_failed_total")
                    + x.metric("chronos_callbacks_withdrawn_total")
            })
            .sum();
        if done as usize >= n {
            Ok(())
        } else {
            Err(format!("{done} done"))
        }
    });
    let withdrawn: f64 = nodes
        .iter()
        .map(|x| x.metric("chronos_callbacks_withdrawn_total"))
        .sum();
    let mut paths: Vec<String> = sink.pops().into_iter().map(|p| p.path).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths.len(),
        n,
        "{} of {n} one-shot timers popped; {withdrawn} callbacks withdrawn with no client operation",
        paths.len()
    );
}

/// `tests/common::node_idle` counts a callback as done when it succeeded,
/// failed or was deferred, but not when it was withdrawn: after a
/// legitimate withdrawal (a DELETE of a queued callback) the node never
/// looks idle and `wait_idle` times out. (It also counts a pop deferred by
/// `hold_back`, which was never counted as popped, as done, so it can
/// call a node idle while callbacks are still in flight.)
#[test]
fn review_wait_idle_after_a_withdrawn_callback() {
    let config = "[runtime]\ncores = 1\n[timers]\ncallback-connections-per-host-max = 1\n";
    let node = Node::start(config);
    // One connection at 500 ms a callback: ten callbacks due are still
    // queued when their timers are deleted, however slow the creates.
    let sink = Sink::start(Behaviour::Slow(Duration::from_millis(500)));
    let ids: Vec<String> = (0..20)
        .map(|i| node.create(&timer_body("1", None, &sink.uri(&format!("/d/{i}")), "x")))
        .collect();
    let created = Instant::now();
    wait_until("the first pops", Duration::from_secs(10), || {
        if sink.pops().len() >= 2 {
            Ok(())
        } else {
            Err("none".into())
        }
    });
    // Every timer due (1 s after its create), most of them queued.
    sleep_until(created + Duration::from_millis(1200));
    for id in &ids[10..] {
        node.request("DELETE", &format!("/timers/{id}"), "");
    }
    wait_until("a withdrawal", Duration::from_secs(10), || {
        let w = node.metric("chronos_callbacks_withdrawn_total");
        if w > 0.0 {
            Ok(())
        } else {
            Err(format!("{w}"))
        }
    });
    // The node is idle once the remaining callbacks are answered.
    wait_idle(&[&node], Duration::from_secs(15));
}

//! Repairs and the hand-off: what a node owes a replica reaches it
//! (issue 37). A cold review's reproductions against the issue's first
//! cut (commit c178264), each failed there and passes now: a PUT
//! acknowledged by a node that only keeps a tombstone; deletes through a
//! non-replica dropped at a full queue; one 503 from a recovering node
//! giving up everything it was owed; a full repair every window for a
//! peer that refuses for good; the hand-off settling while a repair still
//! sends (and, found in CI on 2026-11-28, while its last messages are
//! still queued); the hand-off's 15 s bound exceeded with every peer
//! stopped; tombstones owed by a repair expiring during a long outage.
//! Found on 2026-11-29: a repair in back-off outlasting a restarted
//! peer's hand-off; deletes owed to a down replica lost to a view change.

mod common;

use common::*;
use std::time::{Duration, Instant};

fn config(i: usize, port: u16, nodes: &[usize], extra_cluster: &str, extra: &str) -> String {
    format!(
        "[runtime]\ncores = 1\n[cluster]\nlocalhost = {}\nnode = [{}]\nreplication-deliver-within-ms = 2000\n{extra_cluster}\n{extra}",
        member_addr(i, port),
        member_list(nodes, port),
    )
}

/// 0-based node indices of `id`'s replicas with `factor` in the 3-node
/// cluster on `port`.
fn replicas(id: &str, port: u16, factor: usize) -> Vec<usize> {
    let nodes: Vec<String> = (1..=3).map(|k| format!("127.0.0.{k}:{port}")).collect();
    let cluster = chronos::cluster::Cluster::new(&nodes[0], &nodes, &[]).unwrap();
    let unique = u64::from_str_radix(&id[..16], 16).unwrap();
    cluster.replicas(unique, factor)
}

/// A PUT through A (not a replica) is answered 200 because C, a former
/// holder that only gets a tombstone, acknowledged; B, the one new
/// replica, is down (kill -9, restarted later from its log). A then stops gracefully: the update is nowhere,
/// and B pops the old version.
#[test]
fn review_put_acknowledged_by_a_tombstone_holder_is_lost() {
    let port = cluster_port(3);
    let f1 = "[timers]\ndefault-replication-factor = 1\n";
    let a = start_member(1, port, &config(1, port, &[1, 2, 3], "", f1));
    let dir_b = std::env::temp_dir().join(format!("review37-b-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir_b);
    std::fs::create_dir_all(&dir_b).unwrap();
    let storage = format!("{f1}[storage]\npath = \"{}\"\n", dir_b.display());
    let config_b = config(2, port, &[1, 2, 3], "", &storage);
    let mut b = start_member(2, port, &config_b);
    let c = start_member(3, port, &config(3, port, &[1, 2, 3], "", f1));
    b.wait_ready_200(Duration::from_secs(20));
    let sink = Sink::start(Behaviour::Ok);
    let mut chosen = Vec::new();
    for i in 0..90 {
        let id = a.create(&timer_body_factor(
            10,
            &sink.uri(&format!("/u/{i}")),
            "old",
            Some(2),
        ));
        let r2 = replicas(&id, port, 2);
        if !r2.contains(&0) && replicas(&id, port, 1) == vec![1] {
            chosen.push((i, id));
        }
    }
    eprintln!("{} timers with replicas B (primary) and C", chosen.len());
    a.wait_replication_settled(Duration::from_secs(10));
    b.kill9();
    let mut acked = Vec::new();
    for (i, id) in &chosen {
        // Default factor 1: the new placement is B alone.
        let r = a.request(
            "PUT",
            &format!("/timers/{id}"),
            &timer_body_factor(12, &sink.uri(&format!("/u/{i}")), "new", None),
        );
        eprintln!("PUT {id} through A: {} {}", r.status, r.text());
        if r.status == 200 {
            acked.push(format!("/u/{i}"));
        }
    }
    let status = a.terminate();
    eprintln!("A stopped: {status:?}");
    let b = start_member(2, port, &config_b);
    b.wait_ready_200(Duration::from_secs(30));
    wait_pops_done(&[&b, &c], Duration::from_secs(40));
    let old: Vec<String> = sink
        .pops()
        .into_iter()
        .filter(|p| acked.contains(&p.path) && p.body.contains("old"))
        .map(|p| p.path)
        .collect();
    assert!(
        old.is_empty(),
        "{} of {} updates answered 200 lost; old versions popped: {old:?}",
        old.len(),
        acked.len()
    );
}

/// DELETEs through A (not a replica; C, a replica, acknowledges each)
/// overflow A's queue to B (stopped). The repair A owes B cannot carry
/// them (A holds non-replica tombstones only, which a repair skips), and
/// B popped the deleted timers: 19 of 24 acknowledged deletes undone. A
/// now refuses (503) a delete one replica's queue cannot take.
#[test]
fn review_deletes_dropped_at_a_non_replica_are_never_repaired() {
    let port = cluster_port(3);
    let q = QUEUE_OF_4;
    // A batch to the stopped B stays in flight for the whole test (it is
    // requeued, freeing the queue, only when its try times out): on a
    // loaded machine the deletes outlasted a 2 s try, and no queue filled.
    let patient = |i| {
        config(i, port, &[1, 2, 3], q, "").replace(
            "replication-deliver-within-ms = 2000",
            "replication-deliver-within-ms = 30000\nreplication-timeout-ms = 30000",
        )
    };
    let a = start_member(1, port, &patient(1));
    let b = start_member(2, port, &patient(2));
    let c = start_member(3, port, &patient(3));
    let sink = Sink::start(Behaviour::Ok);
    let mut chosen = Vec::new();
    for i in 0..60 {
        let id = a.create(&timer_body_factor(
            12,
            &sink.uri(&format!("/d/{i}")),
            "d",
            None,
        ));
        if !replicas(&id, port, 2).contains(&0) {
            chosen.push((format!("/d/{i}"), id));
        }
        // Stay under the queue bound while B is up.
        std::thread::sleep(Duration::from_millis(5));
    }
    a.wait_replication_settled(Duration::from_secs(10));
    let created = Instant::now();
    b.signal(libc::SIGSTOP);
    // A refuses (503) what B's full queue cannot take: only the deletes
    // answered 200 must hold.
    let mut refused = 0;
    let mut statuses = Vec::new();
    chosen.retain(|(_, id)| {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert!([200, 503].contains(&r.status), "DELETE {id}: {}", r.text());
        refused += usize::from(r.status == 503);
        statuses.push((r.status, created.elapsed().as_millis()));
        r.status == 200
    });
    assert!(
        refused > 0,
        "B's full queue refused no delete: {statuses:?}; A retried {}, enqueued {}",
        a.metric("chronos_replication_retried_total"),
        a.metric("chronos_replication_enqueued_total")
    );
    eprintln!("DELETE statuses (status, ms after B stopped): {statuses:?}");
    eprintln!(
        "{} deletes answered 200 in {:?}; A dropped {} messages",
        chosen.len(),
        created.elapsed(),
        a.metric("chronos_replication_dropped_total")
    );
    b.signal(libc::SIGCONT);
    wait_pops_done(&[&a, &b, &c], Duration::from_secs(40));
    eprintln!(
        "A repaired: {} messages",
        a.metric("chronos_replication_repaired_total")
    );
    let pops: Vec<String> = sink
        .pops()
        .into_iter()
        .map(|p| p.path)
        .filter(|p| chosen.iter().any(|(path, _)| path == p))
        .collect();
    assert!(
        pops.is_empty(),
        "{} of {} acknowledged deletes undone: {pops:?}",
        pops.len(),
        chosen.len()
    );
}

/// Stand in for B while it rebuilds its store: answer every request
/// `503 recovering` (what B's `storage_admits` answers then) for `d`.
fn answer_503_for(ip: &str, port: u16, d: Duration) -> usize {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind((ip, port)).unwrap();
    l.set_nonblocking(true).unwrap();
    let until = Instant::now() + d;
    let mut answered = 0;
    while Instant::now() < until {
        let Ok((s, _)) = l.accept() else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        loop {
            let mut len = 0usize;
            let mut line = String::new();
            let mut got = false;
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                got = true;
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            if !got {
                break;
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                break;
            }
            let reason = "recovering: the node is replaying its timer log";
            let _ = w.write_all(
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\n\r\n{reason}",
                    reason.len()
                )
                .as_bytes(),
            );
            answered += 1;
        }
    }
    answered
}

/// Issue 37's reproduction 1 again, B answering `503 recovering` once
/// (as it does while it rebuilds its store from a large log): A's
/// messages to B are then marked `refused`; they are older than
/// deliver-within, so A gives them up at once, and the repair cannot
/// replace them (A's tombstones expired while B was down).
#[test]
fn review_a_503_while_recovering_gives_up_what_a_down_replica_was_owed() {
    let (port, a, mut b, config_b) = durable_pair("review37", "");
    let sink = Sink::start(Behaviour::Ok);
    let early: Vec<String> = (0..10)
        .map(|i| {
            a.create(&timer_body_factor(
                3,
                &sink.uri(&format!("/early/{i}")),
                "e",
                None,
            ))
        })
        .collect();
    a.wait_replication_settled(Duration::from_secs(10));
    b.kill9();
    for id in &early {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
    }
    // Longer than the tombstones' life on A (3 s + 2 x 2 s skew).
    std::thread::sleep(Duration::from_secs(12));
    let answered = answer_503_for("127.0.0.2", port, Duration::from_secs(3));
    eprintln!("the stand-in answered {answered} requests 503");
    let b = start_member(2, port, &config_b);
    b.wait_ready_200(Duration::from_secs(60));
    // The early timers are overdue: B pops them at once if it has them.
    std::thread::sleep(Duration::from_secs(8));
    eprintln!(
        "A: failed (given up) {}, repaired {}",
        a.metric("chronos_replication_failed_total"),
        a.metric("chronos_replication_repaired_total")
    );
    echo_log("A", &a, &["given up", "repair"]);
    let pops: Vec<String> = sink
        .pops()
        .into_iter()
        .map(|p| p.path)
        .filter(|p| p.starts_with("/early/"))
        .collect();
    assert!(
        pops.is_empty(),
        "{} deleted timers popped: {pops:?}",
        pops.len()
    );
}

/// B is at its timer capacity and refuses A's creates with 503 for good:
/// each is given up after deliver-within, which owes B a full repair,
/// which sends everything again, which B refuses again: the whole store
/// is re-sent every deliver-within, for as long as B is full.
#[test]
fn review_a_full_peer_gets_a_full_repair_every_window() {
    let port = cluster_port(2);
    let a = start_member(1, port, &config(1, port, &[1, 2], "", ""));
    let b = start_member(
        2,
        port,
        &config(2, port, &[1, 2], "", "[timers]\ntimers-per-shard-max = 5\n"),
    );
    let sink = Sink::start(Behaviour::Ok);
    for i in 0..50 {
        a.create(&timer_body_factor(
            3600,
            &sink.uri(&format!("/c/{i}")),
            "c",
            None,
        ));
    }
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(3));
        eprintln!(
            "A: repaired {} given up {} sent {}",
            a.metric("chronos_replication_repaired_total"),
            a.metric("chronos_replication_failed_total"),
            a.metric("chronos_replication_sent_total"),
        );
    }
    let _ = b;
    // Repairs back off: the first at once, the next 5 s later at the
    // earliest, then 10 s: at most two in 15 s (there were 4, one per
    // window, for as long as B refused).
    let repairs = a.log_text().matches("repair of").count();
    assert!(repairs <= 2, "{repairs} full repairs of B in 15 s");
}

/// A restarted B is owed a repair by A (A's queue to B overflowed while B
/// was down). `take_repair` clears the mark when the repair starts, and
/// between two sends of the repair A's queue to B is often empty: the
/// hand-off sees `owed 0, repair false` and B pops before the repair has
/// sent it the deletes. And once the repair has queued its last message,
/// up to a queue of them are still unsent: the hand-off must wait for them
/// too (CI, 2026-11-28: 1 of 300 popped; a queue of 64 makes it likelier).
#[test]
fn review_the_handoff_settles_while_a_repair_is_still_sending() {
    let (port, a, mut b, config_b) = durable_pair("review37h", "replication-queue-max = 64\n");
    let sink = Sink::start(Behaviour::Ok);
    let n = 300;
    let ids: Vec<String> = (0..n)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(3));
            a.create(&timer_body_factor(
                9,
                &sink.uri(&format!("/h/{i}")),
                "h",
                None,
            ))
        })
        .collect();
    let created = Instant::now();
    a.wait_replication_settled(Duration::from_secs(10));
    b.kill9();
    for id in &ids {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
    }
    eprintln!(
        "deleted {n} in {:?} after the creates; A dropped {}",
        created.elapsed(),
        a.metric("chronos_replication_dropped_total")
    );
    // Back once the timers are overdue, well within their tombstones' life
    // on A (9 s + 2 x 2 s skew after each delete).
    sleep_until(created + Duration::from_secs(10));
    let b = start_member(2, port, &config_b);
    b.wait_ready_200(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(6));
    echo_log("A", &a, &["repair"]);
    echo_log("B", &b, &["caught up", "owed"]);
    let repaired = a.metric("chronos_replication_repaired_total");
    eprintln!("A repaired {repaired}");
    // The premise: A's queue to B overflowed and a repair ran.
    assert!(a.metric("chronos_replication_dropped_total") > 0.0);
    assert!(repaired > 0.0, "a repair of B ran");
    let pops: Vec<String> = sink.pops().into_iter().map(|p| p.path).collect();
    assert!(
        pops.is_empty(),
        "{} of {n} deleted timers popped",
        pops.len()
    );
}

/// The hand-off at start is documented as bounded by 15 s; each request
/// to a peer that accepts but never answers (stopped) still gets its
/// full client timeout (replication-timeout-ms + 5 s) however little of
/// the 15 s is left.
#[test]
fn review_the_handoff_wait_exceeds_its_15_s_bound() {
    let port = cluster_port(4);
    let all = [1, 2, 3, 4];
    let d = std::env::temp_dir().join(format!("review37w-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let config_b = config(
        2,
        port,
        &all,
        "",
        &format!("[storage]\npath = \"{}\"\n", d.display()),
    );
    let others: Vec<Node> = [1, 3, 4]
        .iter()
        .map(|&i| start_member(i, port, &config(i, port, &all, "", "")))
        .collect();
    let mut b = start_member(2, port, &config_b);
    b.wait_ready_200(Duration::from_secs(40));
    b.kill9();
    for n in &others {
        n.signal(libc::SIGSTOP);
    }
    let b = start_member(2, port, &config_b);
    let t = Instant::now();
    let ready = b.wait_ready_200(Duration::from_secs(60));
    let waited = ready.duration_since(t);
    for n in &others {
        n.signal(libc::SIGCONT);
    }
    echo_log("B", &b, &["hand-off", "caught up", "owed"]);
    assert!(waited < Duration::from_secs(17), "ready after {waited:?}");
}

/// A's queue to B overflows while B is down (the deletes are dropped, a
/// repair is owed), and B stays down past the tombstones' life. A
/// tombstone whose delete a down replica is owed by a repair must outlive
/// the wait, or the repair has nothing to send and B, back from its log,
/// pops every deleted timer.
#[test]
fn review_tombstones_owed_by_a_repair_outlive_a_long_outage() {
    let (port, a, mut b, config_b) = durable_pair("review37t", QUEUE_OF_4);
    let sink = Sink::start(Behaviour::Ok);
    let created = delete_twenty_while_b_is_down(&a, &mut b, &sink);
    // Past every tombstone's life on A: the last pop (6 s + a 2 s skew)
    // plus the interval and two skews, or the replication window.
    sleep_until(created + Duration::from_secs(24));
    eprintln!("A: {}", tombstone_counts(&a));
    let _b = back_with_no_pops(&a, port, &config_b, &sink, 4);
    // Repaired, the tombstones are owed nothing more and live out their
    // life: held only while needed.
    let deadline = Instant::now() + Duration::from_secs(40);
    while a.metric("chronos_tombstones") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "A still holds its tombstones after the repair"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A reload re-indexes the peers while A repairs C (the same members in
/// another order: the view ID does not change). The repair's peer mask
/// named C by its old index: it must stop and start again under the new
/// order, and end. Before (cold review of c95b557), `repair_done` cleared
/// another peer's mark and C stayed "owed a repair" for good: its
/// hand-off waited its full bound, and every tombstone of a timer it
/// replicates was held forever (5 of 5 still held after 45 s).
#[test]
fn review_a_reload_during_a_repair_ends_it_under_the_new_order() {
    let reorder = true;
    let port = cluster_port(3);
    let q = QUEUE_OF_4;
    let a = start_member(1, port, &config(1, port, &[1, 2, 3], q, ""));
    let b = start_member(2, port, &config(2, port, &[1, 2, 3], q, ""));
    let mut c = start_member(3, port, &config(3, port, &[1, 2, 3], q, ""));
    for node in [&a, &b, &c] {
        node.wait_ready_200(Duration::from_secs(20));
    }
    let sink = Sink::start(Behaviour::Ok);
    c.kill9();
    // Timers far in the future, replicated to all three: A's queue to C
    // overflows (a repair is owed), and the repair has thousands to send
    // through a queue of 4 (seconds).
    for i in 0..4000 {
        a.create(&timer_body_factor(
            3600,
            &sink.uri(&format!("/r/{i}")),
            "r",
            Some(3),
        ));
    }
    assert!(a.metric("chronos_replication_dropped_total") > 0.0);
    let c = start_member(3, port, &config(3, port, &[1, 2, 3], q, ""));
    c.wait_ready_200(Duration::from_secs(30));
    let c_addr = format!("127.0.0.3:{port}");
    let line_at = |log: &str, what: &str| {
        let mut at = 0;
        for l in log.lines() {
            if l.contains(what) && l.contains(&c_addr) {
                return Some(at);
            }
            at += l.len() + 1;
        }
        None
    };
    wait_until_true("A repairing C", Duration::from_secs(30), || {
        line_at(&a.log_text(), "repairing").is_some()
    });
    let order: &[usize] = if reorder { &[3, 1, 2] } else { &[1, 2, 3] };
    reload_config(&a, &config(1, port, order, q, ""));
    wait_until_true("the repair's end", Duration::from_secs(60), || {
        line_at(&a.log_text(), "repair of").is_some()
    });
    let log = a.log_text();
    let reloaded_at = log.find("cluster reloaded").unwrap();
    let done_at = line_at(&log, "repair of").unwrap();
    assert!(
        reloaded_at < done_at,
        "the repair ended before the reload: race lost\n{log}"
    );
    a.wait_replication_settled(Duration::from_secs(30));
    // The repair starts again under the new order and ends.
    let handoff = format!("/handoff?node=127.0.0.3:{port}&wait-ms=3000");
    wait_until_true("C no longer owed a repair", Duration::from_secs(90), || {
        a.get(&handoff).text().contains("\"repair\":false")
    });
    // Deletes made now: their tombstones should live out their life.
    // One at a time, so that no queue overflows (a drop would mark C
    // again, and the next repair, under the new order, clears it).
    for i in 0..5 {
        let id = a.create(&timer_body_factor(
            2,
            &sink.uri(&format!("/t/{i}")),
            "t",
            Some(3),
        ));
        a.wait_replication_settled(Duration::from_secs(10));
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
        a.wait_replication_settled(Duration::from_secs(10));
    }
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut left = a.metric("chronos_tombstones");
    while left > 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        left = a.metric("chronos_tombstones");
    }
    eprintln!(
        "A: tombstones {left}, expired {}",
        a.metric("chronos_tombstones_expired_total")
    );
    echo_log("A", &a, &["repair", "reloaded"]);
    assert_eq!(left, 0.0, "A still holds tombstones 45 s after the deletes");
    drop(b);
}

/// Tombstones held for a repair survive a restart of the node that owes
/// it (cold review of c95b557; 16 and 17 of 20 deleted timers popped
/// before the fix): `repair_owed` is in memory, and at start the re-send queues the
/// held tombstones only as fast as the down peer's queue has room (half
/// of it, then a 10 s wait per peer before it stops waiting and a drop
/// marks the repair again). Meanwhile the pop loop runs, and every held
/// tombstone due in that window that is neither queued nor covered by a
/// repair mark expires. B, back, pops those deleted timers.
#[test]
fn review_tombstones_held_for_a_repair_outlive_a_restart_of_the_owing_node() {
    let port = cluster_port(2);
    let dir = |n: &str| storage_section(&format!("review37r-{n}"));
    let q = QUEUE_OF_4;
    let with = |i: usize, storage: &str| config(i, port, &[1, 2], q, storage);
    let config_a = with(1, &dir("a"));
    let config_b = with(2, &dir("b"));
    let mut a = start_member(1, port, &config_a);
    let mut b = start_member(2, port, &config_b);
    for node in [&a, &b] {
        node.wait_ready_200(Duration::from_secs(20));
    }
    let sink = Sink::start(Behaviour::Ok);
    let created = delete_twenty_while_b_is_down(&a, &mut b, &sink);
    // Past the tombstones' first life: held by the repair mark (the fix).
    sleep_until(created + Duration::from_secs(24));
    eprintln!(
        "A before its restart: tombstones {}",
        a.metric("chronos_tombstones")
    );
    a.kill9();
    let a = start_member(1, port, &config_a);
    a.wait_ready_200(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(14));
    eprintln!("A 14 s after its restart: {}", tombstone_counts(&a));
    back_with_no_pops(&a, port, &config_b, &sink, 5);
}

/// A restarted node re-sends the tombstones its log holds only as fast as
/// the peer's queue takes them (half of it at a time; to a peer that does
/// not answer, one batch per timeout and back-off). B, restarted while
/// A's re-send is still under way, asked for its hand-off; A answered
/// with what it had queued so far, and B popped the deleted timers the
/// re-send had not reached yet (CI: 7 of 20). Here, before the fix: 2 of
/// 4 runs popped 4 or 5; with the hand-off waiting for the re-send but
/// not for what it queued after the question, 1 of 12 popped 1; after
/// both, 10 of 10 popped none.
#[test]
fn review_a_handoff_waits_for_the_owing_nodes_resend_at_start() {
    let (port, mut a, mut b, config_b) = durable_pair("review37s", QUEUE_OF_4);
    let sink = Sink::start(Behaviour::Ok);
    let created = delete_twenty_while_b_is_stopped(&a, &mut b, &sink);
    sleep_until(created + Duration::from_secs(24));
    eprintln!("A before its restart: {}", tombstone_counts(&a));
    let config_a = std::fs::read_to_string(a.config_path()).unwrap();
    a.kill9();
    // B still stopped: A's re-send queues 2 tombstones per timeout (2 s)
    // and back-off (up to 2 s), so it is under way for about 40 s.
    let a = start_member(1, port, &config_a);
    a.wait_ready_200(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    eprintln!("A 2 s after it was ready: {}", tombstone_counts(&a));
    b.kill9();
    back_with_no_pops(&a, port, &config_b, &sink, 6);
}

/// The re-send at start went at the pace of the slowest peer: a third
/// replica C that does not answer (stopped: a timeout per batch) held up
/// the re-send to B, restarted meanwhile, whose hand-off waited its full
/// 15 s and then popped the deletes not yet re-sent (cold review of
/// aeefb37: 1 of 20). Each peer now has a re-send of its own.
#[test]
fn review_a_silent_third_replica_does_not_hold_up_the_resend_to_another() {
    let port = cluster_port(3);
    let store = |n: &str| storage_section(&format!("review37p-{n}"));
    let q = QUEUE_OF_4;
    let nodes = [1, 2, 3];
    let config_a = config(1, port, &nodes, q, &store("a"));
    let config_b = config(2, port, &nodes, q, &store("b"));
    let mut a = start_member(1, port, &config_a);
    let mut b = start_member(2, port, &config_b);
    let mut c = start_member(3, port, &config(3, port, &nodes, q, &store("c")));
    for node in [&a, &b, &c] {
        node.wait_ready_200(Duration::from_secs(20));
    }
    let sink = Sink::start(Behaviour::Ok);
    let first = Instant::now();
    let ids = create_twenty(&a, &sink, 8, 3);
    c.signal(libc::SIGSTOP);
    assert!(delete_while_b_is_stopped(&a, &mut b, &ids, first, 7) >= 10.0);
    a.kill9();
    // B and C still stopped: A's re-send to each goes a batch per timeout.
    let a = start_member(1, port, &config_a);
    a.wait_ready_200(Duration::from_secs(30));
    b.kill9();
    let b = back_with_no_pops(&a, port, &config_b, &sink, 6);
    let waited_out = b.log_text().contains("still owed replication");
    assert!(!waited_out, "B's hand-off waited out its 15 s bound");
    c.kill9();
}

/// Repairs that follow each other back off (5 s, doubling): after four
/// in a row A's next repair of B waits 40 s. B, killed while A drops its
/// deletes, restarts from its log and asks A for the hand-off, which waits
/// at most 15 s: the repair it waits for must not wait out its back-off,
/// or B pops the deleted timers when the hand-off gives up.
#[test]
fn review_a_repair_in_back_off_is_hastened_by_the_peers_handoff() {
    let (port, a, mut b, config_b) = durable_pair("review37k", QUEUE_OF_4);
    let far = Sink::start(Behaviour::Ok);
    let mut repaired_at = Vec::new();
    for round in 1..=4 {
        // B stopped: A's queue to B overflows (a repair owed); B back: A
        // repairs it once the back-off allows.
        b.signal(libc::SIGSTOP);
        for k in 0..8 {
            let uri = far.uri(&format!("/far/{round}/{k}"));
            a.create(&timer_body_factor(600, &uri, "f", Some(2)));
        }
        b.signal(libc::SIGCONT);
        wait_until_true("a repair of B", Duration::from_secs(40), || {
            a.log_text().matches("repair of").count() >= round
        });
        repaired_at.push(Instant::now());
    }
    // The premise: each repair waited out a doubled back-off (5, 10, 20 s),
    // none came quiet (twice the back-off after the last) to reset it.
    for (k, backoff_s) in [(1, 5), (2, 10), (3, 20)] {
        let gap = repaired_at[k] - repaired_at[k - 1];
        let backoff = Duration::from_secs(backoff_s);
        assert!(
            gap + Duration::from_millis(600) >= backoff && gap < 2 * backoff,
            "repair {} came {gap:?} after the one before: the back-off is not {backoff:?}",
            k + 1
        );
    }
    let sink = Sink::start(Behaviour::Ok);
    delete_twenty_while_b_is_down(&a, &mut b, &sink);
    let _b = back_with_no_pops(&a, port, &config_b, &sink, 6);
    echo_log("A", &a, &["repair"]);
}

/// B is down; deletes through A are dropped at A's full queue to B (a
/// repair owed, the tombstones held for it); then a rolling reload adds
/// C (never started) before B is back. The tombstones were stored under
/// the old view: they were neither held for the repair nor sent by it,
/// so they expired and B, back from its log, popped the deleted timers.
#[test]
fn review_deletes_owed_to_a_down_replica_survive_a_view_change() {
    let port = cluster_port(3);
    let (store_a, store_b) = (
        storage_section("review37v-a"),
        storage_section("review37v-b"),
    );
    let q = QUEUE_OF_4;
    let dir = |n: &str| match n {
        "a" => store_a.clone(),
        _ => store_b.clone(),
    };
    let (a, mut b, _) = start_pair(port, q, dir);
    let sink = Sink::start(Behaviour::Ok);
    // Timers whose replicas under the three-node view are still A and B;
    // the others are deleted while B is up.
    let first = Instant::now();
    let mut kept = Vec::new();
    // A third of the IDs keep A and B: until 10 do (CI once drew 7 in 45).
    for i in 0..150 {
        if kept.len() == 10 {
            break;
        }
        let uri = sink.uri(&format!("/v/{i}"));
        let id = a.create(&timer_body_factor(15, &uri, "v", Some(2)));
        a.wait_replication_settled(Duration::from_secs(10));
        let mut r = replicas(&id, port, 2);
        r.sort_unstable();
        if r == [0, 1] {
            kept.push(id);
        } else {
            let d = a.request("DELETE", &format!("/timers/{id}"), "");
            assert_eq!(d.status, 200, "DELETE {id}: {}", d.text());
            a.wait_replication_settled(Duration::from_secs(10));
        }
    }
    assert_eq!(kept.len(), 10, "timers that kept A and B");
    assert!(delete_while_b_is_down(&a, &mut b, &kept, first, 14) >= 1.0);
    let deleted = Instant::now();
    reload_config(&a, &config(1, port, &[1, 2, 3], q, &store_a));
    // Past the tombstones' first life: each timer's due time (15 s after
    // its create), then an interval and two skews (19 s).
    sleep_until(deleted + Duration::from_secs(36));
    eprintln!("A: {}", tombstone_counts(&a));
    let config_b = config(2, port, &[1, 2, 3], q, &store_b);
    let _b = back_with_no_pops(&a, port, &config_b, &sink, 6);
}

/// A `[storage]` section in a fresh directory named by `tag`.
fn storage_section(tag: &str) -> String {
    let d = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    format!("[storage]\npath = \"{}\"\n", d.display())
}

/// A queue to each peer small enough for a few deletes to overflow it.
const QUEUE_OF_4: &str = "replication-queue-max = 4\n";

/// [`start_pair`] on a port of its own, each node's `[storage]` in a fresh
/// directory named by `tag`: the port, A, B and B's config.
fn durable_pair(tag: &str, extra_cluster: &str) -> (u16, Node, Node, String) {
    let port = cluster_port(2);
    let dir = |n: &str| storage_section(&format!("{tag}-{n}"));
    let (a, b, config_b) = start_pair(port, extra_cluster, dir);
    (port, a, b, config_b)
}

/// A and B, members of a 2-node cluster with `extra_cluster`, each with
/// the storage section `dir` gives it, both ready; B's config returned
/// for its restart.
fn start_pair(
    port: u16,
    extra_cluster: &str,
    dir: impl Fn(&str) -> String,
) -> (Node, Node, String) {
    let a = start_member(1, port, &config(1, port, &[1, 2], extra_cluster, &dir("a")));
    let config_b = config(2, port, &[1, 2], extra_cluster, &dir("b"));
    let b = start_member(2, port, &config_b);
    for node in [&a, &b] {
        node.wait_ready_200(Duration::from_secs(20));
    }
    (a, b, config_b)
}

/// 20 timers (6 s, factor 2) created through A one at a time, so each
/// reaches B through A's queue of 4; B stopped, all deleted through A, B killed:
/// most of the deletes dropped at A's full queue to B (a repair owed).
/// Every delete lands before the first timer is due (checked: a pop
/// before its delete is no undone delete). Returns when the creates ended.
fn delete_twenty_while_b_is_down(a: &Node, b: &mut Node, sink: &Sink) -> Instant {
    let created = delete_twenty_while_b_is_stopped(a, b, sink);
    b.kill9();
    created
}

/// As [`delete_twenty_while_b_is_down`], B left stopped.
fn delete_twenty_while_b_is_stopped(a: &Node, b: &mut Node, sink: &Sink) -> Instant {
    let first = Instant::now();
    let ids = create_twenty(a, sink, 6, 2);
    let created = Instant::now();
    assert!(delete_while_b_is_stopped(a, b, &ids, first, 5) >= 10.0);
    created
}

/// 20 timers due in `due_s` with replication factor `factor`, calling
/// back `sink` at `/t/<i>`, created through A one at a time, each settled
/// before the next (so each reaches its replicas through a small queue).
fn create_twenty(a: &Node, sink: &Sink, due_s: u64, factor: u32) -> Vec<String> {
    (0..20)
        .map(|i| {
            let uri = sink.uri(&format!("/t/{i}"));
            let id = a.create(&timer_body_factor(due_s, &uri, "t", Some(factor)));
            a.wait_replication_settled(Duration::from_secs(10));
            id
        })
        .collect()
}

/// Delete `ids` through A while B is stopped, then kill B; returns how
/// many messages A dropped meanwhile. Stopped, then killed: a batch to a
/// stopped B waits out its timeout, so A's queue of 4 fills (to a dead
/// one, refused connections would cycle the queue into retries every
/// backoff). Every delete must land within `due_s` of `first` (the first
/// create), before any of the timers is due: a pop before its delete is
/// no undone delete.
fn delete_while_b_is_down(
    a: &Node,
    b: &mut Node,
    ids: &[String],
    first: Instant,
    due_s: u64,
) -> f64 {
    let dropped = delete_while_b_is_stopped(a, b, ids, first, due_s);
    b.kill9();
    dropped
}

/// As [`delete_while_b_is_down`], B left stopped.
fn delete_while_b_is_stopped(
    a: &Node,
    b: &mut Node,
    ids: &[String],
    first: Instant,
    due_s: u64,
) -> f64 {
    let dropped = a.metric("chronos_replication_dropped_total");
    b.signal(libc::SIGSTOP);
    for id in ids {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert_eq!(r.status, 200, "DELETE {id}: {}", r.text());
    }
    assert!(
        first.elapsed() < Duration::from_secs(due_s),
        "the creates and deletes took {:?}: a timer may have popped before its delete",
        first.elapsed()
    );
    a.metric("chronos_replication_dropped_total") - dropped
}

fn tombstone_counts(a: &Node) -> String {
    format!(
        "tombstones {} expired {} kept {} dropped {}",
        a.metric("chronos_tombstones"),
        a.metric("chronos_tombstones_expired_total"),
        a.metric("chronos_tombstones_kept_total"),
        a.metric("chronos_replication_dropped_total")
    )
}

/// B started again from its log, ready, then `quiet_s` without a pop of
/// the deleted timers.
/// On a failure, A's and B's replication lines are printed.
fn back_with_no_pops(a: &Node, port: u16, config_b: &str, sink: &Sink, quiet_s: u64) -> Node {
    let b = start_member(2, port, config_b);
    b.wait_ready_200(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(quiet_s));
    let pops: Vec<String> = sink.pops().into_iter().map(|p| p.path).collect();
    if !pops.is_empty() {
        for (name, node) in [("A", a), ("B", &b)] {
            echo_log(name, node, &["replication"]);
        }
    }
    assert!(
        pops.is_empty(),
        "{} deleted timers popped: {pops:?}",
        pops.len()
    );
    b
}

/// Print `node`'s log lines that contain any of `words`, each after
/// `name` (what a failure needs to be read).
fn echo_log(name: &str, node: &Node, words: &[&str]) {
    let log = node.log_text();
    for line in log.lines().filter(|l| words.iter().any(|w| l.contains(w))) {
        eprintln!("{name}| {line}");
    }
}

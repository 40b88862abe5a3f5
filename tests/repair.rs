//! Repairs and the hand-off: what a node owes a replica reaches it
//! (issue 37). A cold review's reproductions against the first
//! cut (commit c178264), each failed there and passes now: a PUT
//! acknowledged by a node that only keeps a tombstone; deletes through a
//! non-replica dropped at a full queue; one 503 from a recovering node
//! giving up everything it was owed; a full repair every window for a
//! peer that refuses for good; the hand-off settling while a repair still
//! sends; the hand-off's 15 s bound exceeded with every peer stopped.

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
    let q = "replication-queue-max = 4\n";
    let a = start_member(1, port, &config(1, port, &[1, 2, 3], q, ""));
    let b = start_member(2, port, &config(2, port, &[1, 2, 3], q, ""));
    let c = start_member(3, port, &config(3, port, &[1, 2, 3], q, ""));
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
    chosen.retain(|(_, id)| {
        let r = a.request("DELETE", &format!("/timers/{id}"), "");
        assert!([200, 503].contains(&r.status), "DELETE {id}: {}", r.text());
        refused += usize::from(r.status == 503);
        r.status == 200
    });
    assert!(refused > 0, "B's full queue refused no delete");
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
    let port = cluster_port(2);
    let dir = |n: &str| {
        let d = std::env::temp_dir().join(format!("review37-{n}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        format!("[storage]\npath = \"{}\"\n", d.display())
    };
    let a = start_member(1, port, &config(1, port, &[1, 2], "", &dir("a")));
    let config_b = config(2, port, &[1, 2], "", &dir("b"));
    let mut b = start_member(2, port, &config_b);
    for node in [&a, &b] {
        node.wait_ready_200(Duration::from_secs(20));
    }
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
    for line in a
        .log_text()
        .lines()
        .filter(|l| l.contains("given up") || l.contains("repair"))
    {
        eprintln!("A| {line}");
    }
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
/// sent it the deletes.
#[test]
fn review_the_handoff_settles_while_a_repair_is_still_sending() {
    let port = cluster_port(2);
    let dir = |n: &str| {
        let d = std::env::temp_dir().join(format!("review37h-{n}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        format!("[storage]\npath = \"{}\"\n", d.display())
    };
    let q = "replication-queue-max = 4\n";
    let a = start_member(1, port, &config(1, port, &[1, 2], q, &dir("a")));
    let config_b = config(2, port, &[1, 2], q, &dir("b"));
    let mut b = start_member(2, port, &config_b);
    for node in [&a, &b] {
        node.wait_ready_200(Duration::from_secs(20));
    }
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
    for line in a.log_text().lines().filter(|l| l.contains("repair")) {
        eprintln!("A| {line}");
    }
    for line in b
        .log_text()
        .lines()
        .filter(|l| l.contains("caught up") || l.contains("owed"))
    {
        eprintln!("B| {line}");
    }
    eprintln!(
        "A repaired {}",
        a.metric("chronos_replication_repaired_total")
    );
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
    for line in b
        .log_text()
        .lines()
        .filter(|l| l.contains("hand-off") || l.contains("caught up") || l.contains("owed"))
    {
        eprintln!("B| {line}");
    }
    assert!(waited < Duration::from_secs(17), "ready after {waited:?}");
}

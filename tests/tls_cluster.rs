//! A cluster over TLS (issue 23): mutual TLS between the nodes, a peer
//! with a certificate from another CA refused, and `[cluster] tls` without
//! a listener certificate refused at start. Certificates are made by the
//! test (rcgen, `common/tls.rs`).

mod common;

use common::tls::*;
use common::*;
use std::time::Duration;

#[test]
fn a_mutual_tls_cluster_replicates_and_a_replica_pops_after_the_first_node_is_killed() {
    let pki = Pki::new("cluster");
    let client = pki.client();
    let port = cluster_port(3);
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| {
            let config = tls_node_config(&pki, &pki, 3, i, port, true);
            start_tls_at(&client, &format!("127.0.0.{i}"), port, &config, &[])
        })
        .collect();
    // The last node's start-up restore (resync GETs to the two others,
    // an internal route) goes over mutual TLS without a refusal.
    wait_until("the restore over TLS", Duration::from_secs(20), || {
        let log = nodes[2].log_text();
        if log.contains("restore complete") {
            Ok(())
        } else {
            Err(log)
        }
    });
    for node in &nodes {
        // A refusal reads "refused with 403" or "answered 403": a status
        // after a space (timestamps, the port, IDs may hold the digits).
        let log = node.log_text().replace(&format!(":{port}"), ":PORT");
        assert!(
            !log.contains(" 403") && !log.contains("TLS handshake"),
            "{log}"
        );
    }
    let sink = Sink::start(Behaviour::Ok);
    let n = 20;
    for i in 0..n {
        let body = replicated_body("3", None, &sink.uri(&format!("/k/{i}")), "x", 2);
        let r = tls_request(nodes[0].addr, &client, "POST", "/timers", &body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let first = nodes[0].addr;
    wait_until(
        "replication settled over TLS",
        Duration::from_secs(10),
        || {
            let queued = tls_metric(first, &client, "chronos_replication_enqueued_total");
            let sent = tls_metric(first, &client, "chronos_replication_sent_total");
            let failed = tls_metric(first, &client, "chronos_replication_failed_total");
            assert_eq!(failed, 0.0, "{}", nodes[0].log_text());
            if queued >= n as f64 && sent >= queued {
                Ok(())
            } else {
                Err(format!("{sent} of {queued}"))
            }
        },
    );
    // A client without a certificate is refused the internal routes.
    let forged = tls_request(
        nodes[1].addr,
        &client,
        "GET",
        "/timers?node-for-replicas=127.0.0.9:1",
        "",
    );
    assert_eq!(forged.status, 403, "{}", forged.text());
    nodes[0].kill9();
    let pops = sink.wait_for(n, Duration::from_secs(3 + 2 + 6));
    let mut paths: Vec<String> = pops.iter().map(|p| p.path.clone()).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), n, "every timer pops from a replica: {paths:?}");
}

#[test]
fn a_peer_with_a_certificate_from_another_ca_gets_no_replication() {
    let good = Pki::new("peer-good");
    let bad = Pki::new("peer-bad");
    let port = cluster_port(2);
    // At the default level: the refusal shows at warn.
    let env = [];
    let first = tls_node_config(&good, &good, 2, 1, port, false);
    let second = tls_node_config(&bad, &good, 2, 2, port, false);
    let n1 = start_tls_at(&good.client(), "127.0.0.1", port, &first, &env);
    let n2 = start_tls_at(&bad.client(), "127.0.0.2", port, &second, &env);
    let sink = Sink::start(Behaviour::Ok);
    for i in 0..5 {
        let body = replicated_body("30", None, &sink.uri(&format!("/p/{i}")), "x", 2);
        let r = tls_request(n1.addr, &good.client(), "POST", "/timers", &body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_until("the refusal logged", Duration::from_secs(15), || {
        let log = n1.log_text();
        if log.contains("TLS handshake with 127.0.0.2") && log.contains("UnknownIssuer") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let (queued, sent) = (
        tls_metric(
            n1.addr,
            &good.client(),
            "chronos_replication_enqueued_total",
        ),
        tls_metric(n1.addr, &good.client(), "chronos_replication_sent_total"),
    );
    assert!(queued >= 5.0 && sent == 0.0, "queued {queued}, sent {sent}");
    assert!(tls_metric(n1.addr, &good.client(), "chronos_replication_retried_total") >= 1.0);
    assert_eq!(
        tls_metric(n2.addr, &bad.client(), "chronos_replication_received_total"),
        0.0
    );
}

#[test]
fn cluster_tls_without_a_listener_certificate_is_refused_at_start() {
    let pki = Pki::new("half");
    let ca = pki.ca_path();
    let mut node = Node::spawn_in(
        None,
        "127.0.0.1",
        free_port(),
        &format!("[cluster]\ntls = true\ntls-ca-file = {ca:?}\n"),
        &[],
    );
    let status = node
        .wait_exit(Duration::from_secs(20))
        .expect("the start fails");
    let log = node.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("[cluster] tls = true needs [http] tls-certificate"),
        "{log}"
    );
}

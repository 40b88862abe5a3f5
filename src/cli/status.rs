//! `chronos status`: a node's `GET /cluster` as a table an operator reads
//! at a glance: the node, its view and instance, each member and its
//! state, the sites, and the resync's progress.

use super::admin::Admin;
use super::StatusArgs;
use serde_json::Value;
use std::fmt::Write;

pub const AFTER: &str = "\
The node's [cluster] shared-secret, if it has one, is read from --config
(or $CHRONOS_CONFIG); $CHRONOS_CLUSTER_SHARED_SECRET wins over the file.
Without it, a node with a secret answers 403 (exit 1).

Exit status: 0 shown; 1 the node is unreachable or answered an error;
2 a bad argument or an unreadable config.";

/// Run it: `Ok` the text to print, `Err((status, reason))`.
pub fn command(args: &StatusArgs) -> Result<String, (u8, String)> {
    let admin = Admin::new(args.node, args.config.as_deref()).map_err(|e| (2, e))?;
    if args.json {
        return match admin.request("GET", "/cluster") {
            Ok((200, body)) => Ok(body.trim_end().to_string()),
            Ok((status, body)) => Err((1, format!("{} answered {status}: {body}", args.node))),
            Err(e) => Err((1, e)),
        };
    }
    let cluster = admin.cluster().map_err(|e| (1, e))?;
    Ok(table(&args.node.to_string(), &cluster))
}

/// A string field, or `?` when the node did not send one.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

/// An array of strings, each as `text` shows it.
fn list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default()
}

/// The report as a table (`asked`: the address the request went to).
pub fn table(asked: &str, c: &Value) -> String {
    let mut out = String::new();
    let me = text(&c["localhost"]);
    let row = |out: &mut String, name: &str, value: &str| {
        let _ = writeln!(out, "{name:<12}{value}");
    };
    row(&mut out, "node", &format!("{me} (asked at {asked})"));
    row(&mut out, "view", &text(&c["cluster-view-id"]));
    row(&mut out, "instance", &text(&c["instance-id"]));
    out.push('\n');
    members(&mut out, &me, c);
    out.push('\n');
    sites(&mut out, &c["sites"]);
    out.push('\n');
    resync(&mut out, &c["resync"]);
    out.trim_end().to_string()
}

/// One line per member: address and state (member, joining, leaving).
fn members(out: &mut String, me: &str, c: &Value) {
    let mut all: Vec<(String, &str)> = Vec::new();
    for (field, state) in [
        ("nodes", "member"),
        ("joining", "joining"),
        ("leaving", "leaving"),
    ] {
        all.extend(list(&c[field]).into_iter().map(|a| (a, state)));
    }
    let width = all.iter().map(|(a, _)| a.len()).max().unwrap_or(0).max(6);
    let _ = writeln!(out, "{:<width$}  STATE", "MEMBER");
    for (address, state) in &all {
        let this = if address == me { "  (this node)" } else { "" };
        let _ = writeln!(out, "{address:<width$}  {state}{this}");
    }
}

fn sites(out: &mut String, s: &Value) {
    let remote = list(&s["remote_site"]);
    let across = match s["replicate_timers_across_sites"].as_bool() {
        Some(true) => "yes",
        Some(false) => "no",
        None => "?",
    };
    let local = text(&s["local_site"]);
    let _ = writeln!(
        out,
        "{:<12}{local} (timers replicated across sites: {across})",
        "site"
    );
    let remote = if remote.is_empty() {
        "none".to_string()
    } else {
        remote.join(", ")
    };
    let _ = writeln!(out, "{:<12}{remote}", "remote");
}

fn resync(out: &mut String, r: &Value) {
    let n = |name: &str| r[name].as_u64().map_or("?".into(), |v| v.to_string());
    let _ = writeln!(
        out,
        "{:<12}{} (runs: {} started, {} finished, {} failed; {} peers left)",
        "resync",
        text(&r["state"]),
        n("started-runs"),
        n("finished-runs"),
        n("failed-runs"),
        n("peers-left")
    );
    let _ = writeln!(
        out,
        "{:<12}received {}, added {}, replicated {}, tombstoned {}, peer errors {}",
        "",
        n("received"),
        n("added"),
        n("replicated"),
        n("tombstoned"),
        n("peer-errors")
    );
    if let Some(e) = r["last-error"].as_str().filter(|e| !e.is_empty()) {
        let _ = writeln!(out, "{:<12}last error: {e}", "");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_readme_example_reads_as_a_table() {
        let c = serde_json::json!({
            "cluster-view-id": "504404360934006848", "instance-id": 110,
            "joining": ["127.0.0.3:7253"], "leaving": [],
            "localhost": "127.0.0.1:7253",
            "nodes": ["127.0.0.1:7253", "127.0.0.2:7253"],
            "resync": {"state": "running", "started-runs": 2, "finished-runs": 1,
                       "failed-runs": 0, "peers-left": 1, "received": 5, "added": 4,
                       "replicated": 3, "tombstoned": 2, "peer-errors": 1, "last-error": ""},
            "sites": {"local_site": "east", "remote_site": ["west=10.1.0.1:7253"],
                      "replicate_timers_across_sites": false}
        });
        let t = super::table("127.0.0.1:7253", &c);
        for line in [
            "view        504404360934006848",
            "127.0.0.1:7253  member  (this node)",
            "127.0.0.3:7253  joining",
            "remote      west=10.1.0.1:7253",
            "resync      running (runs: 2 started, 1 finished, 0 failed; 1 peers left)",
            "received 5, added 4, replicated 3, tombstoned 2, peer errors 1",
        ] {
            assert!(t.contains(line), "{line:?} missing in\n{t}");
        }
        // Whatever a node sends, no panic: a field missing shows as ?.
        assert!(super::table("x", &serde_json::json!([])).contains("view        ?"));
    }
}

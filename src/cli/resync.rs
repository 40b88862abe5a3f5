//! `chronos resync`: ask a running node for a resync (`POST /resync`), as
//! SIGUSR1 does; with `--wait`, wait for that run and print its own
//! figures.

use super::admin::{json_of, Admin};
use super::ResyncArgs;
use std::time::{Duration, Instant};

pub const AFTER: &str = "\
The node's [cluster] shared-secret, if it has one, is read from --config
(or $CHRONOS_CONFIG); $CHRONOS_CLUSTER_SHARED_SECRET wins over the file.

Exit status: 0 requested (with --wait: complete); 1 refused by the node,
unreachable, failed or not finished in time; 2 a bad argument or an
unreadable config.";

/// Run it: `Ok` the line to print, `Err((status, reason))`.
pub fn command(args: &ResyncArgs) -> Result<String, (u8, String)> {
    let admin = Admin::new(args.address, args.config.as_deref()).map_err(|e| (2, e))?;
    resync_at(&admin, args).map_err(|e| (1, e))
}

/// `POST /resync`; with `--wait`, `GET /cluster`'s `resync` object is read
/// first, so that the run's own figures can be told from the node's
/// totals.
fn resync_at(admin: &Admin, args: &ResyncArgs) -> Result<String, String> {
    let address = admin.address;
    let before = match args.wait {
        true => Some(resync_report(admin)?),
        false => None,
    };
    let query = if args.all_views {
        "?all-views=true"
    } else {
        ""
    };
    let (status, body) = admin.request("POST", &format!("/resync{query}"))?;
    if status != 202 {
        return Err(format!("{address} answered {status}: {body}"));
    }
    let run = json_of(&body)?["run"]
        .as_u64()
        .ok_or("no run number in the answer")?;
    let timeout = Duration::from_secs(args.timeout_s);
    match before {
        Some(before) => wait_for_run(admin, run, before, timeout),
        None => Ok(format!("resync run {run} requested")),
    }
}

/// `GET /cluster`'s `resync` object.
fn resync_report(admin: &Admin) -> Result<serde_json::Value, String> {
    Ok(admin
        .cluster()?
        .get("resync")
        .cloned()
        .unwrap_or(serde_json::Value::Null))
}

/// A count in a `resync` object.
fn count(report: &serde_json::Value, name: &str) -> u64 {
    report[name].as_u64().unwrap_or(0)
}

/// Poll `GET /cluster` until run `run` finished. `before` is the `resync`
/// object read before the request; it is replaced by later readings while
/// the run has not started, so that it ends as close to the run's start
/// as can be seen from outside.
fn wait_for_run(
    admin: &Admin,
    run: u64,
    mut before: serde_json::Value,
    timeout: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = resync_report(admin)?;
        if count(&r, "finished-runs") >= run {
            let figures = run_figures(run, &before, &r);
            // Runs finish in order, so the state is this run's or a later one's.
            return match r["state"].as_str() {
                Some("complete") => Ok(format!("resync run {run} complete: {figures}")),
                _ => Err(format!(
                    "resync run {run} failed: {}; {figures}",
                    r["last-error"].as_str().unwrap_or("")
                )),
            };
        }
        let started = count(&r, "started-runs");
        if Instant::now() > deadline {
            // Checked on every pass: a run that never starts (an earlier
            // one still going, or the node restarted) ends the wait too.
            if started < run {
                return Err(format!(
                    "resync run {run} did not start within the timeout (started-runs {started})"
                ));
            }
            let figures = run_figures(run, &before, &r);
            return Err(format!(
                "resync run {run} did not finish within the timeout; so far: {figures}"
            ));
        }
        if started < run {
            before = r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What run `run` did: the node's counters now less those of `before`,
/// with a note when they may include another run's work.
fn run_figures(run: u64, before: &serde_json::Value, now: &serde_json::Value) -> String {
    let names = [
        "received",
        "added",
        "replicated",
        "tombstoned",
        "peer-errors",
    ];
    let mut text = names
        .iter()
        .map(|n| format!("{n} {}", count(now, n).saturating_sub(count(before, n))))
        .collect::<Vec<_>>()
        .join(", ");
    let previous = run.saturating_sub(1);
    if count(before, "started-runs") != previous || count(before, "finished-runs") != previous {
        text.push_str(&format!(
            " (run {previous} was still running when asked: these include its end)"
        ));
    }
    let finished = count(now, "finished-runs");
    if finished > run {
        text.push_str(&format!(" (they include the later runs up to {finished})"));
    }
    text
}

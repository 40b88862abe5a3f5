//! `chronos check-config FILE`: what the node's start checks, without
//! starting it (as `nginx -t`), so a file can be checked before a reload
//! or a restart. It goes through the same path as `run`:
//! `config::Cli::parse` (the environment's overrides), `Config::load`
//! (every key and value, whatever checks are added there), the log
//! filter, and `node::check` (what `run` needs before it binds).

use super::CheckArgs;
use chronos::config::{Cli, Config, Resolved};

pub const AFTER: &str = "\
Checked, as the node's start checks them: the TOML and every key and value
(with the CHRONOS_* variables of this environment applied, as at start),
the cluster, sites and identity, the cores against this machine's, the log
filter (and $RUST_LOG), that [storage] path is a directory this user may
write or create, and the [queue.producer]/[queue.consumer] properties as
librdkafka judges them. Not checked: that the port is free (only a bind
tells), and that Postgres and the Kafka brokers answer (not contacted).
The flags of `chronos run` are not taken: pass their keys in the file or
as CHRONOS_* variables. Run it as the user the node runs as.

Prints one line on success. Exit status: 0 valid; 2 invalid, with the
reason (naming the key) on stderr.";

/// Run it: `Ok` the summary line, `Err` the reason (exit 2); warnings
/// (unknown `CHRONOS_*` variables) go to `warn`.
pub fn command(args: &CheckArgs, mut warn: impl FnMut(&str)) -> Result<String, String> {
    let words = [format!("--config={}", args.file)];
    let cli = Cli::parse(&words, |k| std::env::var(k).ok())?;
    let resolved = Config::load(&cli, super::available_cores())?;
    let _filter = super::log_filter(&resolved.config.log.level)?;
    let storage = chronos::node::check(&resolved)?;
    for warning in &resolved.warnings {
        warn(warning);
    }
    Ok(format!(
        "{}: ok: {}",
        args.file,
        summary(&resolved, &storage)
    ))
}

/// What the node would run: where it listens, its shards, cluster, sites
/// and what it keeps timers in.
fn summary(r: &Resolved, storage: &str) -> String {
    let c = &r.config;
    let members = r.cluster.nodes.len() + r.cluster.leaving.len();
    let queue = if c.queue.is_some() { "on" } else { "off" };
    format!(
        "listens on {}:{}, {} shard(s), node {} (instance {}) of {members} (view {}), site {}, storage {storage}, queue {queue}, shared secret {}",
        c.http.bind_address,
        c.http.bind_port,
        r.shards,
        r.cluster.local_address,
        r.instance_id,
        r.cluster.view_id,
        r.sites.local,
        if c.cluster.shared_secret.is_some() { "set" } else { "unset" },
    )
}

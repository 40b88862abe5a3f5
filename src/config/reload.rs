//! A SIGHUP's re-read of the file. Only the members are applied
//! (`[cluster] node`, `joining`, `leaving`, with `localhost`),
//! `[identity]`, `[timers] callback-allow` and `callback-signing-keys`;
//! every other setting takes a restart. So what is checked is
//! the running configuration with the file's members: a change the reload
//! would not apply (a `[timers]` value the skew rule refuses, a typo in
//! `[queue]`) cannot make it fail. Such changes are named instead, by
//! key, and a file the next start would refuse is reported.

use super::{overrides, ClusterConfig, Config, IdentityConfig, Resolved, SigningSecrets};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The `[cluster]` keys a reload applies (a changed `localhost` is then
/// refused by the node: it takes a restart).
pub const RELOADED_CLUSTER_KEYS: [&str; 4] = ["localhost", "node", "joining", "leaving"];

/// The `[timers]` keys a reload applies.
pub const RELOADED_TIMERS_KEYS: [&str; 2] = ["callback-allow", "callback-signing-keys"];

/// What a reload read.
#[derive(Debug)]
pub struct Reread {
    /// The running configuration with the file's members and identity.
    pub resolved: Resolved,
    /// Every restart-only setting the file changes, as `[section] key
    /// old -> new` (no value for the secret or `[queue]` keys).
    pub not_applied: Vec<String>,
    /// Why the next start would refuse the file as it stands.
    pub refused_at_start: Option<String>,
}

impl Config {
    /// Re-read `running`'s file, with the overrides it started with.
    /// `Err`: the file cannot be read or parsed, or its members or
    /// identity are invalid beside the running settings.
    pub fn reload(running: &Resolved) -> Result<Reread, String> {
        let source = &running.source;
        let name = source.name();
        let text = source.text()?;
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| format!("{name}: invalid config: {e}"))?;
        for a in &source.applied {
            overrides::set(&mut table, a.section, &a.key, a.value.clone());
        }
        let mut effective = running.config.clone();
        effective
            .take_members(&table)
            .map_err(|e| format!("{name}: {e}"))?;
        let mut resolved = effective
            .resolve_with(running.shards, Some(running.sites.clone()))
            .map_err(|e| overrides::annotate(e, &source.applied))?;
        resolved.source = source.clone();
        // The listener's TLS is the running one: a SIGHUP re-reads its
        // files in place (`ListenerTls::reload`), it is not rebuilt here.
        resolved.tls = running.tls.clone();
        resolved.callback_tls = running.callback_tls.clone();
        resolved.peer_tls = running.peer_tls.clone();
        let (not_applied, refused_at_start) =
            match Config::deserialize(toml::Value::Table(table.clone())) {
                Ok(file) => (
                    changes(running, &file, &table),
                    file.resolve(source.available_cores).err(),
                ),
                Err(e) => (Vec::new(), Some(format!("{name}: {}", one_line(&e)))),
            };
        Ok(Reread {
            resolved,
            not_applied,
            refused_at_start,
        })
    }

    /// The members and the identity from the file's `table`.
    fn take_members(&mut self, table: &toml::Table) -> Result<(), String> {
        let members: toml::Table = section(table, "cluster")?
            .into_iter()
            .filter(|(key, _)| RELOADED_CLUSTER_KEYS.contains(&key.as_str()))
            .collect();
        let c = ClusterConfig::deserialize(toml::Value::Table(members))
            .map_err(|e| format!("invalid [cluster]: {}", one_line(&e)))?;
        let identity = IdentityConfig::deserialize(toml::Value::Table(section(table, "identity")?))
            .map_err(|e| format!("invalid [identity]: {}", one_line(&e)))?;
        self.cluster.localhost = c.localhost;
        self.cluster.node = c.node;
        self.cluster.joining = c.joining;
        self.cluster.leaving = c.leaving;
        self.identity = identity;
        // The callback guard: an operator narrows it without a restart
        // (a bad rule refuses the reload, the running list stays).
        let mut timers = section(table, "timers")?;
        self.timers.callback_allow = match timers.remove("callback-allow") {
            None => None,
            Some(v) => Some(
                Vec::<String>::deserialize(v)
                    .map_err(|e| format!("invalid [timers] callback-allow: {}", one_line(&e)))?,
            ),
        };
        // The signing keys: a rotation needs no restart (a bad key refuses
        // the reload, named by its place; the running keys stay).
        self.timers.callback_signing_keys = match timers.remove("callback-signing-keys") {
            None => SigningSecrets::default(),
            // Never the error's text: it may quote the value (the reading
            // itself takes any value; the resolution refuses a bad one).
            Some(v) => SigningSecrets::deserialize(v).map_err(|_| {
                "invalid [timers] callback-signing-keys: must be a list of strings".to_string()
            })?,
        };
        Ok(())
    }
}

/// `[name]` of `table` (empty when absent).
fn section(table: &toml::Table, name: &str) -> Result<toml::Table, String> {
    match table.get(name) {
        None => Ok(toml::Table::new()),
        Some(toml::Value::Table(t)) => Ok(t.clone()),
        Some(_) => Err(format!("{name} must be a section ([{name}])")),
    }
}

fn one_line(e: &toml::de::Error) -> String {
    e.to_string().trim().replace('\n', " ")
}

/// The restart-only settings `file` changes from what `running` runs with.
fn changes(running: &Resolved, file: &Config, table: &toml::Table) -> Vec<String> {
    let (was, now) = (&running.config, file);
    let mut out = Vec::new();
    diff("http", &was.http, &now.http, &mut out);
    diff("runtime", &was.runtime, &now.runtime, &mut out);
    diff("cluster", &was.cluster, &now.cluster, &mut out);
    if was.cluster.shared_secret != now.cluster.shared_secret {
        out.push("[cluster] shared-secret (changed; never shown)".into());
    }
    diff("timers", &was.timers, &now.timers, &mut out);
    diff("log", &was.log, &now.log, &mut out);
    diff("sites", &was.sites, &now.sites, &mut out);
    diff("storage", &was.storage, &now.storage, &mut out);
    match (&was.throttling, &now.throttling) {
        (Some(a), Some(b)) => diff("throttling", a, b, &mut out),
        (None, Some(_)) => out.push("[throttling] added".into()),
        (Some(_), None) => out.push("[throttling] removed".into()),
        (None, None) => {}
    }
    if format!("{:?}", was.queue) != format!("{:?}", now.queue) {
        let (a, b) = (
            section(&running.source.table, "queue").unwrap_or_default(),
            section(table, "queue").unwrap_or_default(),
        );
        let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let changed: Vec<&str> = keys
            .into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(String::as_str)
            .collect();
        out.push(format!("[queue] {} (changed)", changed.join(", ")));
    }
    out
}

/// `[section] key old -> new` for each key whose value differs.
fn diff<T: Serialize>(section: &str, was: &T, now: &T, out: &mut Vec<String>) {
    let table = |v: &T| {
        toml::Value::try_from(v)
            .ok()
            .and_then(|v| v.as_table().cloned())
            .unwrap_or_default()
    };
    let (a, b) = (table(was), table(now));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let show = |v: Option<&toml::Value>| v.map_or("unset".to_string(), |v| v.to_string());
    for key in keys {
        let reloaded = (section == "cluster" && RELOADED_CLUSTER_KEYS.contains(&key.as_str()))
            || (section == "timers" && RELOADED_TIMERS_KEYS.contains(&key.as_str()));
        if !reloaded && a.get(key) != b.get(key) {
            out.push(format!(
                "[{section}] {key} {} -> {}",
                show(a.get(key)),
                show(b.get(key))
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Cli;
    use super::*;

    /// A node started from `text` (with `--bind-port 7300`), and its file.
    fn started(name: &str, text: &str) -> (Resolved, std::path::PathBuf) {
        let path =
            std::env::temp_dir().join(format!("chronos-reload-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let args = [
            "--config".to_string(),
            path.display().to_string(),
            "--bind-port".to_string(),
            "7300".to_string(),
        ];
        let cli = Cli::parse_from(&args, Vec::new()).unwrap();
        (Config::load(&cli, 2).unwrap(), path)
    }

    const ONE: &str = "[cluster]\nnode = [\"127.0.0.1:7300\"]\n";
    const TWO: &str = "[cluster]\nnode = [\"127.0.0.1:7300\", \"127.0.0.2:7300\"]\n";

    #[test]
    fn a_restart_only_change_is_named_and_not_applied() {
        let (running, path) = started("named", ONE);
        let text = format!("{TWO}shared-secret = \"0123456789abcdef-new\"\nreplication-timeout-ms = 100\n[timers]\ncallback-timeout-ms = 1000\n[log]\nlevel = \"warn\"\n[throttling]\n");
        std::fs::write(&path, text).unwrap();
        let r = Config::reload(&running).unwrap();
        assert_eq!(r.resolved.cluster.nodes.len(), 2, "the members are applied");
        assert_eq!(r.resolved.config.timers.callback_timeout_ms, 1500);
        assert_eq!(
            r.not_applied,
            [
                "[cluster] replication-timeout-ms 2000 -> 100",
                "[cluster] shared-secret (changed; never shown)",
                "[timers] callback-timeout-ms 1500 -> 1000",
                "[log] level \"info\" -> \"warn\"",
                "[throttling] added",
            ]
        );
        assert_eq!(r.refused_at_start, None);
        // The flag the node started with still holds: no bind-port change.
        std::fs::write(&path, ONE).unwrap();
        assert!(Config::reload(&running).unwrap().not_applied.is_empty());
    }

    #[test]
    fn a_timers_change_it_would_not_apply_does_not_fail_it() {
        let (running, path) = started("skew", ONE);
        // In a cluster, 2000 ms of callback breaks the skew rule.
        std::fs::write(
            &path,
            format!("{TWO}[timers]\ncallback-timeout-ms = 2000\n"),
        )
        .unwrap();
        let r = Config::reload(&running).unwrap();
        assert_eq!(r.resolved.cluster.nodes.len(), 2);
        let e = r.refused_at_start.unwrap();
        assert!(e.contains("replica-skew-ms"), "{e}");
        // A key that does not exist outside the members: the same.
        std::fs::write(&path, format!("{TWO}[timers]\nbogus = 1\n")).unwrap();
        let r = Config::reload(&running).unwrap();
        assert!(r.refused_at_start.unwrap().contains("bogus"));
    }

    #[test]
    fn the_signing_keys_are_applied_and_a_bad_one_fails_it() {
        const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let (running, path) = started("keys", ONE);
        assert!(running.signing_keys.is_none(), "none at start");
        let keyed = format!("{ONE}[timers]\ncallback-signing-keys = [{KEY:?}, {KEY:?}]\n");
        std::fs::write(&path, keyed).unwrap();
        let r = Config::reload(&running).unwrap();
        assert_eq!(r.resolved.signing_keys.map(|k| k.len()), Some(2), "applied");
        assert!(r.not_applied.is_empty(), "{:?}", r.not_applied);
        let bad = format!("{ONE}[timers]\ncallback-signing-keys = [\"whsec_c2hvcnQ=\"]\n");
        std::fs::write(&path, bad).unwrap();
        let e = Config::reload(&running).unwrap_err();
        assert!(e.contains("signing key 0") && !e.contains("c2hvcnQ"), "{e}");
    }

    #[test]
    fn bad_members_or_a_broken_file_fail_it() {
        let (running, path) = started("broken", ONE);
        for (text, wanted) in [
            ("[cluster\n", "invalid config"),
            ("[cluster]\nnode = 5\n", "invalid [cluster]"),
            (
                "[cluster]\nnode = [\"127.0.0.9:7300\"]\n",
                "not in the cluster",
            ),
            ("[identity]\ninstance_id = 500\n", "[identity]"),
            ("cluster = 1\n", "must be a section"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = Config::reload(&running).unwrap_err();
            assert!(e.contains(wanted), "{text:?}: {e}");
        }
        // The running timers with the new members: refused too.
        let (running, path) = started("running-skew", "[timers]\ncallback-timeout-ms = 5000\n");
        std::fs::write(&path, TWO).unwrap();
        let e = Config::reload(&running).unwrap_err();
        assert!(e.contains("replica-skew-ms"), "{e}");
    }
}

//! `[log]`: the `tracing` filter, and its check (a bare word that is not
//! a level would silence the whole log). No module of the library logs by
//! it; the binary sets its subscriber from it.

use serde::{Deserialize, Serialize};

/// `[log]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. `info` or `chronos=debug`. `RUST_LOG` wins.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

/// The level names a log filter directive may use.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Check `[log] level` (`--log-level`, `CHRONOS_LOG_LEVEL`): comma-separated
/// directives, each a level name or `target=level`. A bare word that is not
/// a level would be taken by the filter as a target enabled at every level,
/// so `verbose` or `warning` silenced the whole log; such a word is refused
/// unless it names a target path (`chronos::http`).
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    let levels = LOG_LEVELS.join(", ");
    for directive in filter.split(',').map(str::trim) {
        let (target, level) = match directive.split_once('=') {
            Some((t, l)) => (t, Some(l)),
            None if LOG_LEVELS.contains(&directive.to_ascii_lowercase().as_str()) => continue,
            None => (directive, None),
        };
        let level_ok = level.is_none_or(|l| LOG_LEVELS.contains(&l.to_ascii_lowercase().as_str()));
        let target_ok = !target.is_empty() && (level.is_some() || target.contains("::"));
        if !level_ok || !target_ok {
            return Err(format!(
                "[log] level {filter:?}: {directive:?} is not a level ({levels}) or a target=level directive"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_are_levels_or_target_directives() {
        for good in [
            "info",
            "WARN",
            "off",
            "chronos=debug",
            "warn,chronos::http=trace",
        ] {
            assert!(check_log_filter(good).is_ok(), "{good}");
        }
        for bad in ["verbose", "warning", "", "info,", "=debug", "chronos=loud"] {
            assert!(check_log_filter(bad).is_err(), "{bad:?}");
        }
    }
}

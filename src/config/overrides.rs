//! What overrides the file: `CHRONOS_*` environment variables, then flags.
//!
//! Every key has a variable by one rule: `CHRONOS_<SECTION>_<KEY>`, upper
//! case, the key's dashes as underscores (`[timers] callback-timeout-ms`
//! is `CHRONOS_TIMERS_CALLBACK_TIMEOUT_MS`, `[sites] local_site` is
//! `CHRONOS_SITES_LOCAL_SITE`). A value is read as a TOML value (`1000`,
//! `true`, `["a:1", "b:2"]`, `"quoted"`); one that is not a TOML value, or
//! not of the key's type, is taken as a string (`127.0.0.1`). A variable
//! that names no key is a warning; a bad value is refused by the
//! variable's name. The flags' short variable names are kept.

use super::Config;
use serde::Deserialize;

/// The sections, and how their keys are spelled: kebab-case, except the
/// sections that keep the reference's snake_case key names.
const SECTIONS: [(&str, char); 10] = [
    ("http", '-'),
    ("runtime", '-'),
    ("cluster", '-'),
    ("identity", '_'),
    ("timers", '-'),
    ("log", '-'),
    ("queue", '-'),
    ("storage", '-'),
    ("sites", '_'),
    ("throttling", '_'),
];

/// The flags that set a key, and the short variable kept for each.
const FLAGS: [(&str, &str, &str, &str); 5] = [
    (
        "--bind-address",
        "CHRONOS_BIND_ADDRESS",
        "http",
        "bind-address",
    ),
    ("--bind-port", "CHRONOS_BIND_PORT", "http", "bind-port"),
    ("--cores", "CHRONOS_CORES", "runtime", "cores"),
    ("--localhost", "CHRONOS_LOCALHOST", "cluster", "localhost"),
    ("--log-level", "CHRONOS_LOG_LEVEL", "log", "level"),
];

/// The variable that names the config file (not a key).
pub const CONFIG_VAR: &str = "CHRONOS_CONFIG";

/// One key set outside the file. Its `Debug` never shows the value.
#[derive(Clone, PartialEq)]
pub struct Override {
    /// Where it was set: `CHRONOS_HTTP_BIND_PORT`, `--bind-port`.
    pub origin: String,
    pub section: &'static str,
    pub key: String,
    pub value: String,
}

/// An override as it was applied: the TOML value the key took. Its
/// `Debug` never shows the value (it may be the shared secret).
#[derive(Clone, PartialEq)]
pub struct Applied {
    pub origin: String,
    pub section: &'static str,
    pub key: String,
    pub value: toml::Value,
}

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ([{}] {})", self.origin, self.section, self.key)
    }
}

impl std::fmt::Debug for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ([{}] {})", self.origin, self.section, self.key)
    }
}

/// `CHRONOS_*` variables that are not settings: the storage fault hook
/// of the tests (`storage::fault_point`), and the broker the test suite
/// runs.
const NOT_SETTINGS: [&str; 2] = ["CHRONOS_TEST_FAULT", "CHRONOS_TANSU"];

/// What the command line asked for.
#[derive(Debug, Default)]
pub struct Cli {
    pub config_path: Option<String>,
    /// The environment's first (sorted by name), then the flags in order.
    pub overrides: Vec<Override>,
    /// `CHRONOS_*` variables that name no section: logged at start.
    pub warnings: Vec<String>,
}

impl Cli {
    /// Parse the node's flags (without the program name; the binary's
    /// command line hands them over as `--flag=value`) and the process's
    /// `CHRONOS_*` variables, each read through `env`.
    pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Cli, String> {
        let vars = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| name.starts_with("CHRONOS_"))
            .filter_map(|name| env(&name).map(|value| (name, value)));
        Cli::parse_from(args, vars)
    }

    /// Parse arguments and the given environment variables.
    pub fn parse_from(
        args: &[String],
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Cli, String> {
        let mut cli = Cli::default();
        cli.take_vars(vars)?;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            match flag {
                "-c" | "--config" => {
                    cli.config_path = Some(take_value(flag, inline, &mut it)?);
                }
                _ => match FLAGS.iter().find(|f| f.0 == flag) {
                    Some(&(flag, _, section, key)) => cli.overrides.push(Override {
                        origin: flag.to_string(),
                        section,
                        key: key.to_string(),
                        value: take_value(flag, inline, &mut it)?,
                    }),
                    None => return Err(format!("unknown argument {arg:?}")),
                },
            }
        }
        Ok(cli)
    }

    /// The `CHRONOS_*` variables, by name: the file, the keys, warnings.
    fn take_vars(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), String> {
        let mut vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(name, _)| name.starts_with("CHRONOS_"))
            .collect();
        vars.sort();
        for (name, value) in vars {
            if name == CONFIG_VAR {
                self.config_path = Some(value);
                continue;
            }
            if NOT_SETTINGS.contains(&name.as_str()) {
                continue;
            }
            let Some((section, key)) = key_of(&name) else {
                self.warnings.push(format!("{name} is not a setting: no section {:?} (CHRONOS_<SECTION>_<KEY>; the sections: {}); ignored", section_word(&name), section_names()));
                continue;
            };
            let twice = self
                .overrides
                .iter()
                .find(|o| o.section == section && o.key == key);
            if let Some(first) = twice {
                return Err(format!(
                    "{} and {name} both set [{section}] {key}: set one",
                    first.origin
                ));
            }
            let origin = name;
            self.overrides.push(Override {
                origin,
                section,
                key,
                value,
            });
        }
        Ok(())
    }
}

fn take_value(
    flag: &str,
    inline: Option<String>,
    it: &mut std::slice::Iter<'_, String>,
) -> Result<String, String> {
    inline
        .or_else(|| it.next().cloned())
        .ok_or_else(|| format!("{flag} needs a value"))
}

/// The section and key a variable names by the rule (or a short name);
/// `None` when it names no section.
pub fn key_of(name: &str) -> Option<(&'static str, String)> {
    if let Some(&(_, _, section, key)) = FLAGS.iter().find(|f| f.1 == name) {
        return Some((section, key.to_string()));
    }
    let word = section_word(name);
    let &(section, separator) = SECTIONS.iter().find(|s| s.0 == word)?;
    let rest = name["CHRONOS_".len() + word.len()..].trim_start_matches('_');
    let key = rest
        .to_ascii_lowercase()
        .replace('_', &separator.to_string());
    Some((section, key))
}

/// The word after `CHRONOS_`, in lower case.
fn section_word(name: &str) -> String {
    let rest = name.strip_prefix("CHRONOS_").unwrap_or(name);
    rest.split('_').next().unwrap_or("").to_ascii_lowercase()
}

fn section_names() -> String {
    SECTIONS.map(|s| s.0).join(", ")
}

/// Why a config table does not deserialize.
enum Refusal {
    /// A key the section does not have.
    UnknownKey,
    /// A required key not (yet) given: a later override may give it.
    Missing,
    Other(String),
}

fn check(table: &toml::Table) -> Result<(), Refusal> {
    match Config::deserialize(toml::Value::Table(table.clone())) {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("").to_string();
            Err(if first.starts_with("unknown field `") {
                Refusal::UnknownKey
            } else if first.starts_with("missing field `") {
                Refusal::Missing
            } else {
                Refusal::Other(first)
            })
        }
    }
}

/// Set `[section] key = value` in `table`.
pub fn set(table: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    let entry = table
        .entry(section.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !entry.is_table() {
        *entry = toml::Value::Table(toml::Table::new());
    }
    if let toml::Value::Table(t) = entry {
        t.insert(key.to_string(), value);
    }
}

/// The values an override's text may stand for: the TOML value it spells
/// (if any), then the text as a string.
fn readings(text: &str) -> Vec<toml::Value> {
    let raw = toml::Value::String(text.to_string());
    match toml::Value::deserialize(toml::de::ValueDeserializer::new(text)) {
        Ok(quoted @ toml::Value::String(_)) => vec![quoted],
        Ok(value) => vec![value, raw],
        Err(_) => vec![raw],
    }
}

/// Apply `overrides` to the file's `table`, in order: each takes the first
/// reading its key accepts. `Err` names the override and its value;
/// variables that name no key of their section come back as warnings.
pub fn apply(
    table: &mut toml::Table,
    overrides: &[Override],
) -> Result<(Vec<Applied>, Vec<String>), String> {
    let (mut applied, mut warnings) = (Vec::new(), Vec::new());
    for o in overrides {
        let mut refusal = None;
        for value in readings(&o.value) {
            let mut next = table.clone();
            set(&mut next, o.section, &o.key, value.clone());
            match check(&next) {
                Ok(()) | Err(Refusal::Missing) => {}
                Err(Refusal::UnknownKey) => {
                    refusal = None;
                    warnings.push(format!(
                        "{} is not a setting: [{}] has no key {:?}; ignored",
                        o.origin, o.section, o.key
                    ));
                    break;
                }
                Err(Refusal::Other(e)) => {
                    refusal.get_or_insert(e);
                    continue;
                }
            }
            *table = next;
            applied.push(Applied {
                origin: o.origin.clone(),
                section: o.section,
                key: o.key.clone(),
                value,
            });
            refusal = None;
            break;
        }
        if let Some(e) = refusal {
            let value = shown(&o.key, &format!("{:?}", o.value));
            return Err(format!(
                "{} = {value}: [{}] {}: {e}",
                o.origin, o.section, o.key
            ));
        }
    }
    Ok((applied, warnings))
}

/// Keys whose values are credentials: never shown in a message (the
/// shared secret, Postgres's URL with its password, and the Kafka client
/// property maps, which may hold `sasl.password`, and the callback
/// signing keys).
const SENSITIVE_KEYS: [&str; 5] = [
    "shared-secret",
    "postgres-url",
    "consumer",
    "producer",
    "callback-signing-keys",
];

/// A value as messages show it: never a credential.
fn shown(key: &str, value: &str) -> String {
    if SENSITIVE_KEYS.contains(&key) {
        "<redacted>".into()
    } else {
        value.to_string()
    }
}

/// `message` with the overrides that set a key it names (`[section] key`).
pub fn annotate(message: String, applied: &[Applied]) -> String {
    let from: Vec<String> = applied
        .iter()
        .filter(|a| message.contains(&format!("[{}] {}", a.section, a.key)))
        .map(|a| format!("{} = {}", a.origin, shown(&a.key, &a.value.to_string())))
        .collect();
    if from.is_empty() {
        message
    } else {
        format!("{message} (set by {})", from.join(", "))
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::{shown, SENSITIVE_KEYS};

    #[test]
    fn credentials_are_never_shown() {
        for key in SENSITIVE_KEYS {
            assert_eq!(shown(key, "postgres://u:pw@h/db"), "<redacted>", "{key}");
        }
        assert_eq!(shown("bind-port", "7253"), "7253");
    }
}

//! `[timers]` and `[identity]`: what a node's timers may ask of it
//! (callback timeouts and admission, the replicas' skew, the timers per
//! shard, where callbacks may go) and the identity bits of the timer IDs it
//! hands out. The configuration loader embeds both sections and calls
//! [`TimersConfig::check`]; what needs the cluster too (the skew rule, the
//! instance IDs the members derive) it checks itself.

use serde::{Deserialize, Serialize};

/// `[identity]`, with the reference's key names: the 10 identity bits of
/// every timer ID this node hands out are `deployment_id` (3 bits) over
/// `instance_id` (7 bits).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// 0..=127. Default: derived from the member list, distinct for every
    /// member (`Cluster::member_instances`). Set it only to pin a value; one
    /// that another member derives is refused.
    pub instance_id: Option<u8>,
    /// 0..=7: tells deployments (sites) apart; default 0.
    pub deployment_id: u8,
}

/// `[timers]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct TimersConfig {
    /// Total time a callback may take (connect, send, response), counted
    /// from the send.
    pub callback_timeout_ms: u64,
    /// Longest a pop that has a later replica waits for a connection to its
    /// target; past it the pop is left to that replica. The last replica
    /// waits as long as it takes (late, not failed).
    pub callback_wait_ms: u64,
    /// Time to establish a callback connection (within the total).
    pub callback_connect_timeout_ms: u64,
    /// Callbacks in flight per shard; beyond it due pops wait in the wheel
    /// (late, not lost).
    pub callback_in_flight_max: usize,
    /// Callbacks in flight per shard to one target (`host:port`) once three
    /// quarters of `callback-in-flight-max` are taken: a slow or hanging
    /// target cannot take the last quarter, and its further pops wait (or,
    /// `callback-wait-ms` late, go to the next replica) while other
    /// targets' pops go out on time.
    pub callback_in_flight_per_target_max: usize,
    /// Open connections per callback target (`host:port`) per shard.
    pub callback_connections_per_host_max: usize,
    /// How much later each backup replica pops than the one before it.
    pub replica_skew_ms: u64,
    /// Replication factor when a request does not give one.
    pub default_replication_factor: u8,
    /// Pending timers per shard; beyond it creation gets `503`.
    pub timers_per_shard_max: usize,
    /// PEM CA certificates that `https://` callback targets are verified
    /// against (instead of the system's store).
    pub callback_ca_file: Option<String>,
    /// Which hosts callbacks may reach (`http::guard`): CIDRs and host
    /// suffixes, `!` to deny, the first match deciding. `None`: every
    /// host, and no resolution at create time. Reloaded by SIGHUP.
    pub callback_allow: Option<Vec<String>>,
    /// Standard Webhooks secrets (`whsec_<base64>`) every callback and
    /// dead letter is signed with, each key in turn (empty: unsigned).
    /// Parsed and checked by the configuration (`http::sign`). Reloaded
    /// by SIGHUP.
    pub callback_signing_keys: SigningSecrets,
}

/// `[timers] callback-signing-keys` as written: secrets, so neither
/// `Debug` (the resolved configuration) nor `Serialize` (the reload's
/// list of changes) ever shows one; both give the count only. Reading it
/// never fails, since a TOML error quotes the line it is on: a lone
/// string is a list of one, and anything else but a list of strings is
/// `malformed`, which the configuration refuses without quoting it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SigningSecrets {
    pub keys: Vec<String>,
    pub malformed: bool,
}

impl<'de> Deserialize<'de> for SigningSecrets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(String),
            Many(Vec<String>),
            Other(serde::de::IgnoredAny),
        }
        Ok(match Written::deserialize(d)? {
            Written::One(key) => SigningSecrets {
                keys: vec![key],
                malformed: false,
            },
            Written::Many(keys) => SigningSecrets {
                keys,
                malformed: false,
            },
            Written::Other(_) => SigningSecrets {
                keys: Vec::new(),
                malformed: true,
            },
        })
    }
}

impl std::fmt::Debug for SigningSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningSecrets {{ count: {} }}", self.keys.len())
    }
}

impl Serialize for SigningSecrets {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{} keys (never shown)", self.keys.len()))
    }
}

impl Default for TimersConfig {
    fn default() -> Self {
        TimersConfig {
            callback_timeout_ms: 1500,
            callback_wait_ms: 250,
            callback_connect_timeout_ms: 500,
            callback_in_flight_max: 4096,
            callback_in_flight_per_target_max: 512,
            callback_connections_per_host_max: 64,
            replica_skew_ms: 2000,
            default_replication_factor: 2,
            timers_per_shard_max: 8_000_000,
            callback_ca_file: None,
            callback_allow: None,
            callback_signing_keys: SigningSecrets::default(),
        }
    }
}

impl TimersConfig {
    /// Every bound and timeout in range.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("callback-timeout-ms", self.callback_timeout_ms),
            (
                "callback-connect-timeout-ms",
                self.callback_connect_timeout_ms,
            ),
            ("callback-in-flight-max", self.callback_in_flight_max as u64),
            (
                "callback-connections-per-host-max",
                self.callback_connections_per_host_max as u64,
            ),
            (
                "default-replication-factor",
                u64::from(self.default_replication_factor),
            ),
            ("timers-per-shard-max", self.timers_per_shard_max as u64),
        ] {
            positive("timers", key, value)?;
        }
        let share = self.callback_in_flight_per_target_max;
        if share == 0 || share > self.callback_in_flight_max {
            return Err(format!(
                "[timers] callback-in-flight-per-target-max = {share}: must be between 1 and callback-in-flight-max = {}",
                self.callback_in_flight_max
            ));
        }
        if self.timers_per_shard_max > crate::wheel::ENTRIES_MAX {
            return Err(format!(
                "[timers] timers-per-shard-max = {}: must be at most {}",
                self.timers_per_shard_max,
                crate::wheel::ENTRIES_MAX
            ));
        }
        Ok(())
    }
}

/// `[section] key = 0: must be positive`.
fn positive(section: &str, key: &str, value: u64) -> Result<(), String> {
    if value == 0 {
        return Err(format!("[{section}] {key} = 0: must be positive"));
    }
    Ok(())
}

//! `[runtime]` and `[throttling]`: the engine's settings (shards, the
//! mesh's channels) and the token bucket that admits client requests
//! (`runtime::throttle`). The configuration loader embeds both sections and
//! calls [`RuntimeConfig::shards`] and [`ThrottlingConfig::check`].

use serde::{Deserialize, Serialize};

/// `[runtime]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct RuntimeConfig {
    /// Number of shards (pinned cores). `None`: every available core.
    pub cores: Option<usize>,
    /// Capacity of each cross-core channel, in messages.
    pub mesh_channel_capacity: Option<usize>,
}

impl RuntimeConfig {
    /// The shard count on `available_cores`, every value in range, or why not.
    pub fn shards(&self, available_cores: usize) -> Result<usize, String> {
        let shards = self.cores.unwrap_or(available_cores);
        if shards == 0 || shards > available_cores {
            return Err(format!(
                "[runtime] cores = {shards}: must be between 1 and the {available_cores} available cores"
            ));
        }
        if let Some(cap) = self.mesh_channel_capacity {
            positive("runtime", "mesh-channel-capacity", cap as u64)?;
        }
        Ok(shards)
    }
}

/// `[throttling]`, with the reference's key names: the token bucket that
/// admits client requests (`runtime::throttle`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottlingConfig {
    /// The latency the bucket steers to, in µs (request latency and pop
    /// lateness, smoothed).
    pub target_latency: u64,
    pub max_tokens: u64,
    pub initial_token_rate: u64,
    pub min_token_rate: u64,
    /// 0: no maximum.
    pub max_token_rate: u64,
}

impl Default for ThrottlingConfig {
    fn default() -> Self {
        ThrottlingConfig {
            target_latency: 500_000,
            max_tokens: 1000,
            initial_token_rate: 500,
            min_token_rate: 10,
            max_token_rate: 0,
        }
    }
}

impl ThrottlingConfig {
    /// Each key named with its value: every one positive but
    /// `max_token_rate` (0: no maximum, else at least `min_token_rate`).
    /// An `initial_token_rate` outside `[min_token_rate, max_token_rate]`
    /// starts at the nearer bound.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("target_latency", self.target_latency),
            ("max_tokens", self.max_tokens),
            ("initial_token_rate", self.initial_token_rate),
            ("min_token_rate", self.min_token_rate),
        ] {
            positive("throttling", key, value)?;
        }
        if self.max_token_rate != 0 && self.max_token_rate < self.min_token_rate {
            return Err(format!(
                "[throttling] max_token_rate = {} is below min_token_rate = {}: set it to 0 (no maximum) or at least min_token_rate",
                self.max_token_rate, self.min_token_rate
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

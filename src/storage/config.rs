//! `[storage]`: the durable timer log. Its `path` turns it on; without it
//! a node keeps its timers in memory only (the embedded default).

use serde::{Deserialize, Serialize};

/// When a change is acknowledged.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// A request is answered once its change is on disk (`fdatasync`).
    #[default]
    Batch,
    /// A request is answered at once; the change is on disk within
    /// `group-commit-us` (a power cut loses that window; a crash of the
    /// process alone loses nothing written).
    None,
}

/// What a bad record before the log's tail does at start.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnCorruption {
    /// Refuse to start, naming the file and offset.
    #[default]
    Stop,
    /// Log and count it, recover the rest, and resync from the peers.
    Skip,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StorageConfig {
    /// The directory of the log (created if missing). Absent: in memory.
    pub path: Option<String>,
    pub sync: SyncMode,
    /// With `sync = "batch"`: how long a write batch may keep gathering
    /// changes while more keep arriving; with `"none"`: the sync period.
    pub group_commit_us: u64,
    /// A batch this large is written at once.
    pub group_commit_bytes: usize,
    /// Log segment size (preallocated).
    pub segment_bytes: u64,
    /// A shard snapshots once its log since the last snapshot exceeds
    /// both this and the last snapshot's size.
    pub compact_log_bytes: u64,
    /// Changes not yet written, per shard: beyond it client writes get
    /// `503` and pops wait (the disk is behind).
    pub pending_bytes_max: usize,
    pub on_corruption: OnCorruption,
    /// The reserve (issue 38, as etcd's space quota): while the file system
    /// of `path` has less free than this, client creates and updates get
    /// `503 storage full`; deletes, pops, replication and compaction go on,
    /// so space comes back. 0: no reserve.
    pub free_bytes_min: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            path: None,
            sync: SyncMode::Batch,
            group_commit_us: 1000,
            group_commit_bytes: 256 * 1024,
            segment_bytes: 64 << 20,
            compact_log_bytes: 64 << 20,
            pending_bytes_max: 64 << 20,
            on_corruption: OnCorruption::Stop,
            free_bytes_min: 128 << 20,
        }
    }
}

/// Each bound: `(key, value, least, most)`.
fn bounds(s: &StorageConfig) -> [(&'static str, u64, u64, u64); 6] {
    [
        ("group-commit-us", s.group_commit_us, 0, 1_000_000),
        (
            "group-commit-bytes",
            s.group_commit_bytes as u64,
            4096,
            64 << 20,
        ),
        ("segment-bytes", s.segment_bytes, 1 << 20, 1 << 34),
        ("compact-log-bytes", s.compact_log_bytes, 1 << 20, 1 << 40),
        (
            "pending-bytes-max",
            s.pending_bytes_max as u64,
            1 << 20,
            1 << 34,
        ),
        ("free-bytes-min", s.free_bytes_min, 0, 1 << 50),
    ]
}

impl StorageConfig {
    pub fn enabled(&self) -> bool {
        self.path.is_some()
    }

    /// Every value in range.
    pub fn check(&self) -> Result<(), String> {
        if self.path.as_deref() == Some("") {
            return Err("[storage] path = \"\": name a directory, or leave path out to keep timers in memory".into());
        }
        for (key, value, least, most) in bounds(self) {
            if value < least || value > most {
                return Err(format!(
                    "[storage] {key} = {value}: must be between {least} and {most}"
                ));
            }
        }
        if (self.pending_bytes_max as u64) < 2 * self.group_commit_bytes as u64 {
            return Err(format!(
                "[storage] pending-bytes-max = {} must be at least twice group-commit-bytes = {}",
                self.pending_bytes_max, self.group_commit_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_name_the_key() {
        StorageConfig::default().check().unwrap();
        let c = StorageConfig {
            segment_bytes: 10,
            ..Default::default()
        };
        assert!(c.check().unwrap_err().contains("segment-bytes = 10"));
        let c = StorageConfig {
            path: Some(String::new()),
            ..Default::default()
        };
        assert!(c.check().unwrap_err().contains("path"));
    }
}

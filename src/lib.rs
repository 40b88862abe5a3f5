//! Chronos: a distributed, redundant timer service on a thread-per-core
//! io_uring engine (glommio).
//!
//! # Codemap
//!
//! - [`runtime`]: executors (one pinned shard per core), the cross-core
//!   [`runtime::mesh`], clocks, shutdown.
//! - [`http`]: HTTP/1.1 framing on `httparse`; [`http::server`] (accept and
//!   connection loops) and [`http::client`] (callback pools).
//! - [`api`]: routes of the public API.
//! - [`shard`]: what one core owns (store, pop loop) and the timer operations.
//! - [`wheel`]: the hierarchical timing wheel (no I/O, no clock).
//! - [`timer`]: IDs, the JSON codec, the stored record.
//! - [`cluster`]: membership, reference-compatible hashing, replica choice,
//!   and [`cluster::replicate`] (pipelined per-peer replication queues).
//! - [`queue`]: the Kafka delay queue on Postgres (seed 004).
//! - [`stats`]: per-shard counters and the Prometheus rendering.
//! - [`config`]: the TOML file, flags and environment.

#![deny(clippy::await_holding_refcell_ref)]

pub mod api;
pub mod cluster;
pub mod config;
pub mod http;
pub mod murmur;
pub mod node;
pub mod queue;
pub mod runtime;
pub mod shard;
pub mod stats;
pub mod storage;
pub mod timer;
pub mod wheel;

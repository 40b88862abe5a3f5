#![doc = include_str!("README.md")]
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

pub mod cluster;
pub mod config;
pub mod timer;
pub mod wheel;

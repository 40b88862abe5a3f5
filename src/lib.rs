pub mod cluster;
pub mod wheel;

//! The `chronos` binary run as a command, as an operator runs it: with no
//! configuration inherited from the test's own environment. For a node
//! kept running and talked to over HTTP, see [`super::Node`].

use std::process::{Command, Output};

/// `chronos` with `args` and none of the environment that configures it
/// (`CHRONOS_*`, `RUST_LOG`, `NOTIFY_SOCKET`) inherited from the test.
pub fn chronos(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_chronos"));
    c.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("CHRONOS_") || key == "RUST_LOG" || key == "NOTIFY_SOCKET" {
            c.env_remove(key);
        }
    }
    c
}

/// Run [`chronos`] with `args` to its end: its status and output.
pub fn run(args: &[&str]) -> Output {
    chronos(args).output().expect("run chronos")
}

/// Output bytes as text, for assertions and their messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

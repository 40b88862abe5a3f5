//! systemd's readiness protocol (`sd_notify`, `Type=notify`): a state
//! line (`READY=1`, `STOPPING=1`, `RELOADING=1`) in one datagram to the
//! unix socket `$NOTIFY_SOCKET` names (a leading `@`: the abstract
//! namespace). Without the variable nothing is sent, so a node started by
//! hand or by a test behaves as before. A few lines of std rather than a
//! crate: the protocol is one `sendto`.

use std::os::unix::net::UnixDatagram;

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Send `state` (newline-separated `KEY=VALUE` assignments) to systemd.
/// `Ok(false)`: not under systemd (`$NOTIFY_SOCKET` unset or empty).
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET).filter(|t| !t.is_empty()) else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = target.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &address)?;
    } else {
        socket.send_to(state.as_bytes(), &target)?;
    }
    Ok(true)
}

/// `notify`, logging a failure (at warn: systemd then times the start
/// out or keeps a stale state, which the operator should hear about).
pub fn tell(state: &str) {
    match notify(state) {
        Ok(true) => {
            let first = state.lines().next().unwrap_or("");
            tracing::debug!(target: "chronos::runtime", "told systemd {first}");
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(target: "chronos::runtime", "cannot tell systemd {state:?} on ${NOTIFY_SOCKET}: {e}");
        }
    }
}

/// `RELOADING=1` with `MONOTONIC_USEC` (CLOCK_MONOTONIC now, in µs), as
/// systemd wants it to tell this reload from an earlier one.
pub fn reloading() -> String {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct passed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let usec = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000;
    format!("RELOADING=1\nMONOTONIC_USEC={usec}")
}

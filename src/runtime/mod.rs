//! The thread-per-core engine: one glommio executor per shard, each pinned to
//! its own core, each with its own `SO_REUSEPORT` listener on the shared port,
//! joined by a full mesh of bounded channels.
//!
//! Shutdown: SIGTERM/SIGINT set [`SHUTDOWN`]; each shard's watcher sees it,
//! stops accepting, lets the requests in hand finish (up to
//! [`DRAIN_TIMEOUT`]), and returns, so the process exits 0.

pub mod clock;
pub mod mesh;
pub mod notify;

use crate::config::Resolved;
use crate::http::ring::NetRing;
use crate::http::server::{accept_loop, ShardAcceptor};
use crate::shard::{pop_loop, Shard, SHUTDOWN};
use crate::stats::ShardStats;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use mesh::{Mesh, MeshMsg};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registered I/O memory per executor (glommio `io_memory`). The engine
/// does no DMA file I/O, so this stays small; see tuning.md.
pub const IO_MEMORY_BYTES: usize = 2 << 20;
/// How long shutdown waits for requests in hand.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often each shard checks the shutdown flag.
const SHUTDOWN_POLL: Duration = Duration::from_millis(20);

/// Connection slots the network ring keeps beyond `connections-max`, so
/// that connections over the limit still get their `503`.
const REFUSE_SLACK: usize = 64;

/// Slack left in `RLIMIT_MEMLOCK` for anything else that locks memory.
const MEMLOCK_SLACK_BYTES: usize = 1 << 20;

/// The `io_memory` each executor gets: [`IO_MEMORY_BYTES`] if the memlock
/// limit allows it (raising the limit when permitted), else an equal share
/// of what the limit allows.
fn io_memory_per_shard(shards: usize) -> usize {
    let want = shards * IO_MEMORY_BYTES + MEMLOCK_SLACK_BYTES;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    let current = unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) != 0 {
            return IO_MEMORY_BYTES;
        }
        if lim.rlim_cur as usize >= want {
            return IO_MEMORY_BYTES;
        }
        let new = libc::rlimit {
            rlim_cur: want as libc::rlim_t,
            rlim_max: lim.rlim_max.max(want as libc::rlim_t),
        };
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &new) == 0 {
            tracing::info!(target: "chronos::runtime", "raised RLIMIT_MEMLOCK to {want} bytes");
            return IO_MEMORY_BYTES;
        }
        lim.rlim_cur as usize
    };
    let share = (current.saturating_sub(MEMLOCK_SLACK_BYTES) / shards).max(64 << 10);
    tracing::info!(
        target: "chronos::runtime",
        "RLIMIT_MEMLOCK is {current} bytes and cannot be raised: io_memory {share} bytes per shard"
    );
    share
}

/// Pending connections the kernel queues per shard listener.
const LISTEN_BACKLOG: i32 = 1024;

/// A TCP listener on `addr` with `SO_REUSEPORT` (one per shard on the same
/// port; the kernel spreads connections across them), non-blocking. Ours,
/// not glommio's `TcpListener::bind`, because the network ring needs the fd,
/// which glommio's listener does not expose.
fn bind_reuseport(addr: &str) -> std::io::Result<OwnedFd> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    use std::net::ToSocketAddrs;
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("address resolves to nothing"))?;
    let socket = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&SockAddr::from(sa))?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Start the SIGTERM/SIGINT watcher thread.
fn install_signals() -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("chronos-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if SHUTDOWN.swap(true, Ordering::SeqCst) {
                    tracing::warn!(target: "chronos::runtime", "second signal {signal}: exiting now");
                    std::process::exit(1);
                }
                tracing::info!(target: "chronos::runtime", "signal {signal}: shutting down");
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Run the engine until shutdown.
pub fn run(resolved: Resolved) -> Result<(), String> {
    clock::base();
    let resolved = Arc::new(resolved);
    let shards = resolved.shards;
    let io_memory = io_memory_per_shard(shards);
    install_signals()?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let stats: Arc<[ShardStats]> = (0..shards).map(|_| ShardStats::default()).collect();
    let capacity = resolved
        .config
        .runtime
        .mesh_channel_capacity
        .unwrap_or(mesh::CHANNEL_CAPACITY);
    let mesh: Option<MeshBuilder<MeshMsg, _>> =
        (shards > 1).then(|| MeshBuilder::full(shards, capacity));
    let bound = Arc::new(AtomicUsize::new(0));
    let queue = match &resolved.config.queue {
        Some(q) => Some(crate::queue::QueueShared::start(q, shards)?),
        None => None,
    };
    let mut handles = Vec::with_capacity(shards);
    for index in 0..shards {
        let placement = match cores.get(index) {
            Some(core) => Placement::Fixed(core.id),
            None => Placement::Unbound,
        };
        let (resolved, stats, mesh, bound, queue) = (
            resolved.clone(),
            stats.clone(),
            mesh.clone(),
            bound.clone(),
            queue.clone(),
        );
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("chronos-{index}"))
            .io_memory(io_memory)
            .spawn(
                move || async move { run_shard(index, resolved, stats, mesh, bound, queue).await },
            )
            .map_err(|e| format!("cannot start executor {index}: {e}"))?;
        handles.push(handle);
    }
    let mut first_error = None;
    for handle in handles {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(format!("executor failed: {e}"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            tracing::info!(target: "chronos::runtime", "stopped");
            Ok(())
        }
    }
}

async fn run_shard(
    index: usize,
    resolved: Arc<Resolved>,
    stats: Arc<[ShardStats]>,
    mesh: Option<MeshBuilder<MeshMsg, glommio::channels::channel_mesh::Full>>,
    bound: Arc<AtomicUsize>,
    queue: Option<Arc<crate::queue::QueueShared>>,
) -> Result<(), String> {
    let (senders, receivers) = match mesh {
        Some(m) => {
            let (s, r) = m
                .join()
                .await
                .map_err(|_| format!("shard {index}: cannot join the mesh"))?;
            (Some(s), Some(r))
        }
        None => (None, None),
    };
    let shard = Shard::new(index, resolved.clone(), stats.clone(), Mesh::new(senders));
    let http = &resolved.config.http;
    let addr = format!("{}:{}", http.bind_address, http.bind_port);
    let listener = match bind_reuseport(addr.as_str()) {
        Ok(l) => l,
        Err(e) => {
            SHUTDOWN.store(true, Ordering::SeqCst);
            return Err(format!("cannot listen on {addr}: {e}"));
        }
    };
    if let Some(r) = receivers {
        mesh::serve(&shard, r);
    }
    glommio::spawn_local(pop_loop(shard.clone())).detach();
    if let Some(q) = queue {
        crate::queue::QueueShard::start(q.clone(), index, stats);
        *shard.queue_shared.borrow_mut() = Some(q);
    }
    {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while !SHUTDOWN.load(Ordering::Relaxed) {
                glommio::timer::sleep(SHUTDOWN_POLL).await;
            }
            shard.shutting_down.set(true);
            shard.accept_wake.notify();
            shard.pop_wake.notify();
        })
        .detach();
    }
    shard.my_stats().up.store(true, Ordering::Relaxed);
    if bound.fetch_add(1, Ordering::SeqCst) + 1 == resolved.shards {
        tracing::info!(
            target: "chronos::runtime",
            address = %addr,
            shards = resolved.shards,
            "listening"
        );
    }
    let ring = if http.net_ring {
        // Room for the 503 answers beyond `connections-max`.
        let slots = http.connections_max + REFUSE_SLACK;
        let in_bytes_high = http.header_bytes_max + http.body_bytes_max;
        match NetRing::new(listener.as_raw_fd(), slots, in_bytes_high) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(
                    target: "chronos::runtime",
                    "shard {index}: network ring unavailable ({e}); using glommio sockets"
                );
                None
            }
        }
    } else {
        None
    };
    match ring {
        Some(ring) => {
            // Returns once shutdown has drained (or DRAIN_TIMEOUT passed).
            ring.run(Rc::new(ShardAcceptor(shard.clone())), DRAIN_TIMEOUT)
                .await;
        }
        None => {
            // SAFETY: the fd is a bound, listening TCP socket we own.
            let listener = unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) };
            accept_loop(shard.clone(), listener).await;
            let started = Instant::now();
            while shard.busy.get() > 0 && started.elapsed() < DRAIN_TIMEOUT {
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    shard.mesh.close();
    Ok(())
}

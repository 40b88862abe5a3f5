//! The thread-per-core engine: one glommio executor per shard, each pinned to
//! its own core, each with its own `SO_REUSEPORT` listener on the shared port,
//! joined by a full mesh of bounded channels. The listeners are bound here,
//! in shard order, before any executor starts; with `[http] accept-steering
//! = "cpu"` a connection goes to the shard pinned to the CPU that took its
//! SYN.
//!
//! Shutdown: SIGTERM/SIGINT set [`SHUTDOWN`]; each shard's watcher sees it,
//! stops accepting, lets the requests in hand finish (up to
//! [`DRAIN_TIMEOUT`]), and returns, so the process exits 0.

pub mod clock;
pub mod mesh;
pub mod notify;

use crate::cluster::Cluster;
use crate::config::{AcceptSteering, Resolved};
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

/// Reloaded clusters waiting per shard (SIGHUP); beyond it a reload is
/// dropped for that shard and logged.
const RELOADS_QUEUED_MAX: usize = 4;

/// Re-reads and validates the configuration (SIGHUP).
pub type Reload = Box<dyn Fn() -> Result<Resolved, String> + Send>;

/// Pending connections the kernel queues per shard listener.
const LISTEN_BACKLOG: i32 = 1024;

/// Resolve the listen address once (every listener and the probe use it).
fn listen_addr(addr: &str) -> std::io::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("address resolves to nothing"))
}

/// A TCP socket for `sa` with `SO_REUSEADDR` (a port in `TIME_WAIT` is fine).
fn tcp_socket(sa: std::net::SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    Ok(socket)
}

/// A TCP listener on `sa` with `SO_REUSEPORT` (one per shard on the same
/// port; the kernel picks one per connection, see [`attach_cpu_steering`]),
/// non-blocking. Ours, not glommio's `TcpListener::bind`, because the
/// network ring needs the fd, which glommio's listener does not expose.
fn bind_reuseport(sa: std::net::SocketAddr) -> std::io::Result<OwnedFd> {
    let socket = tcp_socket(sa)?;
    socket.set_reuse_port(true)?;
    socket.bind(&sa.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Fail if another socket is listening on `sa`. `SO_REUSEPORT` alone
/// would let a second process of the same user join the shards' group and
/// silently take a share of the connections; a plain bind (no
/// `SO_REUSEPORT`) conflicts with any listener there.
fn probe_exclusive(sa: std::net::SocketAddr) -> std::io::Result<()> {
    tcp_socket(sa)?.bind(&sa.into()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            std::io::Error::new(
                e.kind(),
                format!("{e} (another process is listening there)"),
            )
        } else {
            e
        }
    })
}

/// Steer each new connection on the reuseport group of `listener` to the
/// shard pinned to the CPU that took its SYN: a classic BPF program that
/// loads the CPU number and returns the index (bind order) of that CPU's
/// shard; for a CPU with no shard it returns an index past the group, and
/// the kernel falls back to its hash. `pinned[i]` is shard `i`'s CPU.
/// Program length: 2 + 2 × shards instructions (within the 4096 cBPF limit
/// for up to 2047 shards).
fn attach_cpu_steering(listener: &OwnedFd, pinned: &[usize]) -> std::io::Result<()> {
    const NO_SHARD: u32 = u32::MAX;
    let insn = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    if pinned.len() > 2047 {
        return Err(std::io::Error::other("too many shards for a cBPF program"));
    }
    let mut prog = Vec::with_capacity(2 + 2 * pinned.len());
    // A = the current CPU.
    prog.push(insn(
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        0,
        0,
        (libc::SKF_AD_OFF + libc::SKF_AD_CPU) as u32,
    ));
    for (index, &cpu) in pinned.iter().enumerate() {
        // if A == cpu: return index; else skip the return.
        prog.push(insn(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            cpu as u32,
        ));
        prog.push(insn(libc::BPF_RET | libc::BPF_K, 0, 0, index as u32));
    }
    prog.push(insn(libc::BPF_RET | libc::BPF_K, 0, 0, NO_SHARD));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel
    // copies the program.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Start the SIGTERM/SIGINT watcher thread.
///
/// SIGHUP (`service chronos reload`) re-reads the configuration through
/// `reload`; a valid one's cluster (`node`, `joining`, `leaving`) is handed
/// to every shard over its bounded reload channel ([`Shard::set_cluster`]).
/// Other settings need a restart.
///
/// [`Shard::set_cluster`]: crate::shard::Shard::set_cluster SIGUSR1 (`service chronos resync`) is caught so that it never
/// terminates the node (its default action): active resynchronisation
/// (seed 003) is not built yet, which the log says.
fn install_signals(
    reload: Reload,
    mut current: Cluster,
    shards: Vec<async_channel::Sender<Arc<Cluster>>>,
) -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("chronos-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    match reload() {
                        Err(e) => tracing::error!(
                            target: "chronos::runtime",
                            "SIGHUP: the configuration is invalid, keeping the current one: {e}"
                        ),
                        Ok(next) if next.cluster.local_address != current.local_address => {
                            tracing::error!(
                                target: "chronos::runtime",
                                "SIGHUP: this node's address would change ({} to {}), which needs a restart; keeping the current cluster",
                                current.local_address,
                                next.cluster.local_address
                            )
                        }
                        Ok(next) => {
                            let next = next.cluster;
                            tracing::info!(
                                target: "chronos::runtime",
                                nodes = ?next.nodes.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
                                leaving = ?next.leaving.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
                                cluster_view_id = %next.view_id,
                                "SIGHUP: cluster reloaded (settings outside [cluster] take a restart)"
                            );
                            let shared = Arc::new(next.clone());
                            for (i, tx) in shards.iter().enumerate() {
                                if tx.try_send(shared.clone()).is_err() {
                                    tracing::error!(target: "chronos::runtime", "SIGHUP: shard {i} has {RELOADS_QUEUED_MAX} reloads pending; this one is dropped there");
                                }
                            }
                            current = next;
                        }
                    }
                    continue;
                }
                if signal == SIGUSR1 {
                    tracing::warn!(
                        target: "chronos::runtime",
                        "SIGUSR1: active resynchronisation is not supported by this build; ignored"
                    );
                    continue;
                }
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
pub fn run(resolved: Resolved, reload: Reload) -> Result<(), String> {
    clock::base();
    let resolved = Arc::new(resolved);
    let shards = resolved.shards;
    let io_memory = io_memory_per_shard(shards);
    let (reload_tx, reload_rx): (Vec<_>, Vec<_>) = (0..shards)
        .map(|_| async_channel::bounded::<Arc<Cluster>>(RELOADS_QUEUED_MAX))
        .unzip();
    let mut reload_rx = reload_rx.into_iter();
    install_signals(reload, resolved.cluster.clone(), reload_tx)?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // Every shard's listener is bound here, in shard order, before any
    // executor starts: a busy port fails the start cleanly, and the
    // reuseport group's socket order (which the steering program indexes)
    // is the shard order.
    let http = &resolved.config.http;
    let addr = format!("{}:{}", http.bind_address, http.bind_port);
    let cannot = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    let sa = listen_addr(&addr).map_err(cannot)?;
    probe_exclusive(sa).map_err(cannot)?;
    let mut listeners = Vec::with_capacity(shards);
    for _ in 0..shards {
        listeners.push(bind_reuseport(sa).map_err(cannot)?);
    }
    if http.accept_steering == AcceptSteering::Cpu {
        let pinned: Vec<usize> = cores.iter().take(shards).map(|c| c.id).collect();
        if pinned.len() < shards {
            tracing::warn!(
                target: "chronos::runtime",
                "accept-steering = \"cpu\" needs every shard pinned ({shards} shards, {} cores): using the hash",
                pinned.len()
            );
        } else if let Err(e) = attach_cpu_steering(&listeners[0], &pinned) {
            tracing::warn!(target: "chronos::runtime", "accept-steering = \"cpu\" unavailable ({e}): using the hash");
        }
    }
    let mut listeners = listeners.into_iter();
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
        let listener = listeners.next().expect("one listener per shard");
        let reloads = reload_rx.next().expect("one reload channel per shard");
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("chronos-{index}"))
            .io_memory(io_memory)
            .spawn(move || async move {
                let inputs = Inputs { listener, reloads };
                run_shard(index, resolved, stats, mesh, bound, queue, inputs).await
            })
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

/// What `run` prepared for one shard before its executor started.
struct Inputs {
    /// Its listener, bound (socket `index` of the reuseport group).
    listener: OwnedFd,
    /// Reloaded clusters (SIGHUP), from the signal thread.
    reloads: async_channel::Receiver<Arc<Cluster>>,
}

async fn run_shard(
    index: usize,
    resolved: Arc<Resolved>,
    stats: Arc<[ShardStats]>,
    mesh: Option<MeshBuilder<MeshMsg, glommio::channels::channel_mesh::Full>>,
    bound: Arc<AtomicUsize>,
    queue: Option<Arc<crate::queue::QueueShared>>,
    inputs: Inputs,
) -> Result<(), String> {
    let Inputs { listener, reloads } = inputs;
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
    if let Some(r) = receivers {
        mesh::serve(&shard, r);
    }
    glommio::spawn_local(pop_loop(shard.clone())).detach();
    {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Ok(cluster) = reloads.recv().await {
                shard.set_cluster(&cluster);
            }
        })
        .detach();
    }
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

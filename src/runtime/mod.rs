//! The thread-per-core engine, generic: one glommio executor per shard,
//! each pinned to its own core, each with its own `SO_REUSEPORT` listener on
//! the shared port, joined by a full mesh of bounded channels carrying the
//! caller's message type. The listeners are bound here, in shard order,
//! before any executor starts; with CPU steering a connection goes to the
//! shard pinned to the CPU that took its SYN.
//!
//! What a shard runs is the caller's: [`run`] hands each executor a
//! [`ShardCtx`] (its index, listener, mesh ends and shutdown [`Gate`]) and
//! awaits the caller's shard body on it. This module names nothing else in
//! the crate.
//!
//! Shutdown: SIGTERM/SIGINT close every shard's gate (over a channel, so no
//! task polls a flag); the shard body sees the gate close, drains (waiting
//! for the gate's passes, at most [`DRAIN_TIMEOUT`], with
//! [`Gate::close_and_wait`]) and returns; when every body has returned the
//! process exits 0. Other signals go to the caller's hook, on the signal
//! thread.

pub mod bulk;
pub mod clock;
pub mod config;
pub mod gate;
pub mod loglimit;
pub mod mesh;
pub mod notify;
pub mod sleep;
pub mod spawn;
pub mod systemd;
pub mod throttle;

use gate::Gate;
use glommio::channels::channel_mesh::{Full, MeshBuilder, Receivers};
use glommio::{LocalExecutorBuilder, Placement};
use mesh::Mesh;
use std::future::Future;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Registered I/O memory per executor (glommio `io_memory`). The engine
/// does no DMA file I/O, so this stays small; see tuning.md.
pub const IO_MEMORY_BYTES: usize = 2 << 20;
/// How long shutdown waits for requests in hand.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
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

/// What the engine needs to start.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub shards: usize,
    /// `host:port` every shard listens on.
    pub listen: String,
    /// Steer connections to the shard pinned to the CPU that took the SYN.
    pub steer_by_cpu: bool,
    /// Messages per shard-to-shard channel.
    pub mesh_capacity: usize,
}

/// What one shard's body gets from the engine.
pub struct ShardCtx<M: Send> {
    pub index: usize,
    pub shards: usize,
    /// Its listener, bound and listening (socket `index` of the group).
    pub listener: OwnedFd,
    /// Its sending end of the mesh.
    pub mesh: Mesh<M>,
    /// Its receiving ends (`None` with a single shard); serve them with
    /// [`mesh::serve`].
    pub inbox: Option<Receivers<M>>,
    /// Closed at shutdown; the engine waits for its passes.
    pub gate: Rc<Gate>,
}

/// Signals other than SIGTERM/SIGINT, handled on the signal thread.
pub type SignalHook = Box<dyn FnMut(i32) + Send>;

/// The signals a node reacts to besides SIGTERM/SIGINT.
pub use signal_hook::consts::{SIGHUP, SIGUSR1};

/// Start the signal thread: SIGTERM/SIGINT close every shard's gate (a
/// second one exits at once); SIGHUP and SIGUSR1 go to `hook`.
fn install_signals(
    mut hook: SignalHook,
    stops: Vec<async_channel::Sender<()>>,
) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("chronos-signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if signal == SIGHUP || signal == SIGUSR1 {
                    hook(signal);
                    continue;
                }
                if stopping {
                    tracing::warn!(target: "chronos::runtime", "second signal {signal}: exiting now");
                    std::process::exit(1);
                }
                stopping = true;
                tracing::info!(target: "chronos::runtime", "signal {signal}: shutting down");
                systemd::tell("STOPPING=1");
                for stop in &stops {
                    // Capacity 1 and sent once: never full.
                    let _ = stop.try_send(());
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Bind every shard's listener, in shard order, before any executor starts:
/// a busy port fails the start cleanly, and the reuseport group's socket
/// order (which the steering program indexes) is the shard order.
fn bind_listeners(engine: &EngineConfig, pinned: &[usize]) -> Result<Vec<OwnedFd>, String> {
    let addr = &engine.listen;
    let cannot = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    let sa = listen_addr(addr).map_err(cannot)?;
    probe_exclusive(sa).map_err(cannot)?;
    let mut listeners = Vec::with_capacity(engine.shards);
    for _ in 0..engine.shards {
        listeners.push(bind_reuseport(sa).map_err(cannot)?);
    }
    if engine.steer_by_cpu {
        if pinned.len() < engine.shards {
            tracing::warn!(
                target: "chronos::runtime",
                "accept-steering = \"cpu\" needs every shard pinned ({} shards, {} cores): using the hash",
                engine.shards,
                pinned.len()
            );
        } else if let Err(e) = attach_cpu_steering(&listeners[0], &pinned[..engine.shards]) {
            tracing::warn!(target: "chronos::runtime", "accept-steering = \"cpu\" unavailable ({e}): using the hash");
        }
    }
    assert_eq!(
        listeners.len(),
        engine.shards,
        "one listener per shard, in shard order"
    );
    Ok(listeners)
}

/// Run the engine until shutdown: `shard_main` is each shard's body.
pub fn run<M, F, Fut>(engine: &EngineConfig, hook: SignalHook, shard_main: F) -> Result<(), String>
where
    M: Send + Sync + 'static,
    F: Fn(ShardCtx<M>) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = Result<(), String>> + 'static,
{
    assert!(engine.shards > 0, "at least one shard");
    clock::base();
    let shards = engine.shards;
    let io_memory = io_memory_per_shard(shards);
    let (stop_tx, stop_rx): (Vec<_>, Vec<_>) =
        (0..shards).map(|_| async_channel::bounded::<()>(1)).unzip();
    install_signals(hook, stop_tx)?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let pinned: Vec<usize> = cores.iter().take(shards).map(|c| c.id).collect();
    let listeners = bind_listeners(engine, &pinned)?;
    let mesh: Option<MeshBuilder<M, Full>> =
        (shards > 1).then(|| MeshBuilder::full(shards, engine.mesh_capacity));
    let started = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(shards);
    for (index, (listener, stop)) in listeners.into_iter().zip(stop_rx).enumerate() {
        let placement = match cores.get(index) {
            Some(core) => Placement::Fixed(core.id),
            None => Placement::Unbound,
        };
        let (mesh, main, started, listen) = (
            mesh.clone(),
            shard_main.clone(),
            started.clone(),
            engine.listen.clone(),
        );
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("chronos-{index}"))
            .io_memory(io_memory)
            .spawn(move || async move {
                let ctx = join_mesh(index, shards, listener, mesh).await?;
                let gate = ctx.gate.clone();
                spawn::spawn_local(async move {
                    let _ = stop.recv().await;
                    gate.close();
                })
                .detach();
                if started.fetch_add(1, Ordering::SeqCst) + 1 == shards {
                    tracing::info!(target: "chronos::runtime", address = %listen, shards, "listening");
                }
                main(ctx).await
            })
            .map_err(|e| format!("cannot start executor {index}: {e}"))?;
        handles.push(handle);
    }
    join_all(handles)
}

/// Join the mesh (when there is one) and build the shard's context.
async fn join_mesh<M: Send + 'static>(
    index: usize,
    shards: usize,
    listener: OwnedFd,
    mesh: Option<MeshBuilder<M, Full>>,
) -> Result<ShardCtx<M>, String> {
    let (senders, inbox) = match mesh {
        Some(m) => {
            let (s, r) = m
                .join()
                .await
                .map_err(|_| format!("shard {index}: cannot join the mesh"))?;
            assert_eq!(s.peer_id(), index, "mesh joined in shard order");
            (Some(s), Some(r))
        }
        None => (None, None),
    };
    Ok(ShardCtx {
        index,
        shards,
        listener,
        mesh: Mesh::new(senders),
        inbox,
        gate: Gate::new(),
    })
}

fn join_all(handles: Vec<glommio::ExecutorJoinHandle<Result<(), String>>>) -> Result<(), String> {
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

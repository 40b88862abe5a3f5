//! The composition root: what a chronos node is made of, wired together.
//! Every other module knows only the layers beneath it (README,
//! "Layers"); this one knows them all and decides:
//!
//! - what the engine runs on each shard ([`shard_main`]): the shard's
//!   timers, its pop loop, its reload listener, its part of the delay
//!   queue, and the HTTP server with the API as its handler;
//! - what a mesh message does on the shard that receives it ([`on_mesh`]);
//! - what the signals other than SIGTERM/SIGINT do ([`signal_hook`]):
//!   SIGHUP reloads the cluster, SIGUSR1 starts a resync (shard 0 runs it);
//! - what readiness means (`/ready`): every shard listening and, with
//!   `[queue]`, Postgres and the broker.
//!
//! Shutdown order on a shard: the engine closes the gate → the server stops
//! accepting and answers what it holds → the queue's consumer stops → the
//! gate's tasks (pop loop, replication senders, queue tasks) end → the
//! mesh senders close.

use crate::api::{admission, Api, ReadyCheck};
use crate::cluster::Cluster;
use crate::config::{Config, Resolved};
use crate::http::guard::Guard;
use crate::http::server::{Limits, Server};
use crate::http::sign::SigningKeys;
use crate::queue::{QueueShard, QueueShared};
use crate::runtime::mesh::{self, CHANNEL_CAPACITY};
use crate::runtime::systemd;
use crate::runtime::{EngineConfig, ShardCtx, SignalHook, DRAIN_TIMEOUT, SIGHUP, SIGUSR1};
use crate::shard::resync::trigger::resync_loop;
use crate::shard::{
    durable, handoff, pop_loop, repair_loop, resend_deletes, retry_loop, MeshMsg, Reply, Shard,
};
use crate::stats::ShardStats;
use crate::storage::{self, Recovered};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reloaded clusters waiting per shard (SIGHUP); beyond it a reload is
/// dropped for that shard and logged.
const RELOADS_QUEUED_MAX: usize = 4;

/// What every shard of the node shares.
struct NodeShared {
    resolved: Arc<Resolved>,
    stats: Arc<[ShardStats]>,
    queue: Option<Arc<QueueShared>>,
    /// Shard `i`'s end of the reload channel.
    reloads: Vec<async_channel::Receiver<Arc<Reloaded>>>,
    /// Shard 0's end of the resync channel (SIGUSR1).
    resyncs: async_channel::Receiver<()>,
    /// `[storage]`: each shard's directory and what was read from it
    /// (taken once by the shard).
    recovered: Vec<std::sync::Mutex<Option<(PathBuf, Recovered)>>>,
    /// Keeps the storage directory locked for the process's life.
    _layout: Option<storage::Layout>,
    /// Whether systemd was told `READY=1` (once; the SIGHUP hook reads it).
    announced: Arc<AtomicBool>,
}

/// What a reload hands every shard: the new cluster and this node's
/// instance field under it (derived from the member list, so it may move).
struct Reloaded {
    cluster: Cluster,
    instance_id: u16,
    /// `[timers] callback-allow` as the file now says.
    guard: Option<Arc<Guard>>,
    /// `[timers] callback-signing-keys` as the file now says.
    signing_keys: Option<Arc<SigningKeys>>,
}

/// Run a node until shutdown.
pub fn run(resolved: Resolved) -> Result<(), String> {
    let shards = resolved.shards;
    assert!(shards > 0, "a node has shards");
    for warning in &resolved.warnings {
        tracing::warn!(target: "chronos::config", "{warning}");
    }
    let stats: Arc<[ShardStats]> = (0..shards).map(|_| ShardStats::default()).collect();
    let http = &resolved.config.http;
    let engine = EngineConfig {
        shards,
        listen: format!("{}:{}", http.bind_address, http.bind_port),
        steer_by_cpu: http.accept_steering == crate::config::AcceptSteering::Cpu,
        mesh_capacity: resolved
            .config
            .runtime
            .mesh_channel_capacity
            .unwrap_or(CHANNEL_CAPACITY),
    };
    let (reload_tx, reloads): (Vec<_>, Vec<_>) = (0..shards)
        .map(|_| async_channel::bounded::<Arc<Reloaded>>(RELOADS_QUEUED_MAX))
        .unzip();
    let current = Reloaded {
        cluster: resolved.cluster.clone(),
        instance_id: resolved.instance_id,
        guard: resolved.guard.clone(),
        signing_keys: resolved.signing_keys.clone(),
    };
    let (resync_tx, resyncs) = async_channel::bounded::<()>(RELOADS_QUEUED_MAX);
    let start = Arc::new(resolved.clone());
    let announced = Arc::new(AtomicBool::new(false));
    let hook = signal_hook(start, current, reload_tx, resync_tx, announced.clone());
    let queue = match &resolved.config.queue {
        Some(q) => Some(QueueShared::start(q, stats.clone())?),
        None => None,
    };
    let (layout, recovered) = read_storage(&resolved)?;
    if layout.is_some() {
        // Before any shard serves: no shard takes a change while another
        // is still replaying.
        for s in stats.iter() {
            s.recovering.store(true, Ordering::Relaxed);
        }
        // A member with other nodes takes what they owe it before it pops
        // (`shard/handoff.rs`).
        let cluster = &resolved.cluster;
        let peers = cluster.nodes.len() + cluster.leaving.len() > 1;
        if peers && cluster.local.is_some() {
            stats[0].catching_up.store(true, Ordering::Release);
        }
    }
    let node = Arc::new(NodeShared {
        resolved: Arc::new(resolved),
        stats,
        queue,
        reloads,
        resyncs,
        recovered,
        _layout: layout,
        announced,
    });
    let stats = node.stats.clone();
    crate::runtime::run(&engine, hook, move |ctx| shard_main(ctx, node.clone()))?;
    match failed_storage(&stats) {
        Some(why) => Err(format!(
            "{why}: the node stopped (fail-stop); mend the disk, then start it again"
        )),
        None => Ok(()),
    }
}

/// Why a shard's timer log failed, if one did.
fn failed_storage(stats: &[ShardStats]) -> Option<String> {
    let (index, why) = ShardStats::storage_failure(stats)?;
    Some(format!("the timer log of shard {index} failed ({why})"))
}

/// How often shard 0 looks for a failed timer log.
const STORAGE_WATCH: Duration = Duration::from_millis(20);

/// Fail-stop (issue 38): once any shard's timer log has failed, the node
/// pops and acknowledges nothing more (the shards check the flag), and
/// shard 0 stops the node as SIGTERM does; `run` then exits non-zero, so
/// that the other replicas pop its timers at their skew and systemd or
/// the operator sees it.
async fn watch_storage(shard: Rc<Shard>) {
    assert_eq!(shard.base.id, 0, "shard 0 watches the logs");
    while !shard.base.gate.is_closing() {
        if shard.storage_failed() {
            let why = failed_storage(&shard.base.stats).unwrap_or_default();
            tracing::error!(target: "chronos::storage", "{why}: stopping the node (fail-stop); /ready answers 503 meanwhile");
            // SAFETY: kill(2) on this process with a valid signal number;
            // the signal thread turns it into the ordinary shutdown.
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            return;
        }
        let tick = glommio::timer::sleep(STORAGE_WATCH);
        futures_lite::future::or(tick, shard.base.gate.closing()).await;
    }
}

/// What every shard's log directory holds, read in parallel (one thread
/// per shard) before the engine starts: a corrupt log stops the start here,
/// naming the file and offset.
type Storage = (
    Option<storage::Layout>,
    Vec<std::sync::Mutex<Option<(PathBuf, Recovered)>>>,
);

fn read_storage(resolved: &Resolved) -> Result<Storage, String> {
    let cfg = &resolved.config.storage;
    if !cfg.enabled() {
        let none = (0..resolved.shards).map(|_| std::sync::Mutex::new(None));
        return Ok((None, none.collect()));
    }
    let layout = storage::prepare(cfg, resolved.shards)?;
    let read: Vec<Result<Recovered, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = layout
            .shard_dirs
            .iter()
            .map(|dir| scope.spawn(move || storage::read::recover(dir, cfg.on_corruption)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a recovery thread panicked".into()))
            })
            .collect()
    });
    let mut recovered = Vec::with_capacity(read.len());
    for (i, (dir, r)) in layout.shard_dirs.iter().zip(read).enumerate() {
        let mut r = r?;
        if i == 0 {
            // Skipped while re-sharding: shard 0 asks for the resync.
            r.corrupt += layout.resharded_corrupt;
        }
        recovered.push(std::sync::Mutex::new(Some((dir.clone(), r))));
    }
    Ok((Some(layout), recovered))
}

/// One shard's body: build it, start its tasks, serve HTTP until shutdown.
async fn shard_main(ctx: ShardCtx<MeshMsg>, node: Arc<NodeShared>) -> Result<(), String> {
    let ShardCtx {
        index,
        listener,
        mesh,
        inbox,
        gate,
        ..
    } = ctx;
    let resolved = node.resolved.clone();
    // `[throttling]`'s bucket, this shard's share: `api` admits client
    // requests by it, and the shard's pops steer it too.
    let throttle = admission::throttle(&resolved);
    let shard = Shard::new(
        index,
        resolved.clone(),
        node.stats.clone(),
        mesh,
        gate.clone(),
        throttle.clone(),
    );
    if let Some(receivers) = inbox {
        let shard = shard.clone();
        mesh::serve(receivers, move |msg| on_mesh(&shard, msg));
    }
    start_timers(&shard, &node, index);
    gate.spawn(take_reloads(shard.clone(), node.reloads[index].clone()));
    gate.spawn(repair_loop(shard.clone()));
    if index == 0 {
        start_resync(&shard, node.resyncs.clone());
        if node.resolved.config.storage.enabled() {
            gate.spawn(watch_storage(shard.clone()));
        }
    }
    if let Some(q) = &node.queue {
        QueueShard::start(q.clone(), index, node.stats.clone(), gate.clone());
    }
    shard.base.my_stats().up.store(true, Ordering::Relaxed);
    announce_if_ready(&shard, &node.announced);
    let http = &resolved.config.http;
    let limits = Limits {
        connections_max: http.connections_max,
        connections_per_source_max: http.connections_per_source_max,
        header_bytes_max: http.header_bytes_max,
        body_bytes_max: http.body_bytes_max,
        idle_timeout_ms: http.idle_timeout_ms,
        header_timeout: Duration::from_millis(http.header_timeout_ms),
        body_timeout: Duration::from_millis(http.body_timeout_ms),
        write_timeout: Duration::from_millis(http.write_timeout_ms),
        drain: DRAIN_TIMEOUT,
        tls: resolved.tls.as_ref().map(|t| t.config.clone()),
    };
    let api = Api::new(shard.clone(), ready_check(&node), throttle);
    let server = Server::new(api, limits, gate.clone(), node.stats.clone(), index);
    server.run(listener, http.net_ring).await;
    assert!(gate.is_closing(), "the server returns only at shutdown");
    if let Some(q) = &node.queue {
        q.stop();
    }
    if !gate.close_and_wait(DRAIN_TIMEOUT).await {
        tracing::warn!(target: "chronos::node", "shard {index}: {} task(s) still running at exit", gate.passes());
    }
    durable::close(&shard, DRAIN_TIMEOUT).await;
    shard.base.mesh.close();
    Ok(())
}

/// Start the pop loop: at once in memory; with `[storage]`, once the
/// store is rebuilt from the log (the server answers meanwhile, `/ready`
/// saying "recovering").
fn start_timers(shard: &Rc<Shard>, node: &NodeShared, index: usize) {
    // Signed callbacks: the shard's client takes the keys before any pop.
    let keys = node.resolved.signing_keys.clone();
    shard.outbound.client.set_signing_keys(keys);
    let taken = node.recovered[index].lock().map(|mut r| r.take());
    match taken.ok().flatten() {
        Some((dir, recovered)) => {
            // The server answers (`/ready`: recovering) while the store is
            // rebuilt; the pop loop starts once it is.
            let (shard, announced) = (shard.clone(), node.announced.clone());
            crate::runtime::spawn::spawn_local(async move {
                durable::recover(&shard, dir, recovered).await;
                shard
                    .base
                    .my_stats()
                    .recovering
                    .store(false, Ordering::Relaxed);
                announce_if_ready(&shard, &announced);
                if shard.base.id == 0 && shard.base.stats[0].catching_up.load(Ordering::Acquire) {
                    handoff::catch_up(&shard).await;
                    announce_if_ready(&shard, &announced);
                }
                handoff::wait_caught_up(&shard).await;
                shard.base.gate.spawn(pop_loop(shard.clone()));
                shard.base.gate.spawn(retry_loop(shard.clone()));
            })
            .detach();
        }
        None => {
            shard.base.gate.spawn(pop_loop(shard.clone()));
            shard.base.gate.spawn(retry_loop(shard.clone()));
        }
    }
}

/// systemd's `READY=1` (`Type=notify`), once: when every shard listens
/// and none is replaying its log, i.e. when `/ready` answers 200 as far
/// as the shards go. Each shard checks after its own step (listening,
/// recovered), so the last one to get there sends it. The delay queue's
/// Postgres and broker are left out: they may be down for long, and the
/// timer service serves meanwhile (`/ready` names them).
fn announce_if_ready(shard: &Shard, announced: &AtomicBool) {
    // Orders this shard's store before the loads of the others', so that
    // of two shards finishing together at least one sees both done.
    std::sync::atomic::fence(Ordering::SeqCst);
    if shard.readiness().is_ok() && !announced.swap(true, Ordering::SeqCst) {
        tracing::info!(target: "chronos::node", "ready: every shard serves");
        systemd::tell("READY=1");
    }
}

/// What `chronos check-config` checks beyond `Config::load`, without
/// changing anything: what `run` needs before the engine starts, i.e. the
/// `[storage]` directory (`storage::check_path`) and, with `[queue]`, the
/// `[queue.producer]`/`[queue.consumer]` properties as librdkafka judges
/// them. Not checked: the listeners (only a bind tells), Postgres and the
/// brokers (not contacted). `Ok` describes the storage.
pub fn check(resolved: &Resolved) -> Result<String, String> {
    if let Some(q) = &resolved.config.queue {
        check_kafka_properties(q)?;
    }
    storage::check_path(&resolved.config.storage)
}

/// Make (and drop) a producer and a consumer with the configured
/// properties, as `QueueShared::start` does, without subscribing or
/// sending: librdkafka refuses an unknown property or a bad value when a
/// client is made, which would otherwise first show at start.
fn check_kafka_properties(q: &crate::queue::QueueConfig) -> Result<(), String> {
    use rdkafka::config::ClientConfig;
    let client = |properties: &std::collections::BTreeMap<String, toml::Value>| {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &q.kafka_brokers);
        for (k, v) in properties {
            c.set(k, crate::queue::QueueConfig::property(v));
        }
        c
    };
    client(&q.producer)
        .create::<rdkafka::producer::BaseProducer>()
        .map(drop)
        .map_err(|e| format!("[queue.producer]: {e}"))?;
    client(&q.consumer)
        .set("group.id", &q.consumer_group)
        .create::<rdkafka::consumer::BaseConsumer>()
        .map(drop)
        .map_err(|e| format!("[queue.consumer]: {e}"))
}

/// `/ready` beyond the shards: the delay queue's Postgres and broker.
fn ready_check(node: &Arc<NodeShared>) -> ReadyCheck {
    match &node.queue {
        Some(q) => {
            let (q, stats) = (q.clone(), node.stats.clone());
            Box::new(move || q.readiness(&stats))
        }
        None => Box::new(|| Ok(())),
    }
}

/// Apply reloaded clusters (SIGHUP) until shutdown.
async fn take_reloads(shard: Rc<Shard>, reloads: async_channel::Receiver<Arc<Reloaded>>) {
    while let Some(Ok(next)) = shard.base.gate.unless_closing(reloads.recv()).await {
        let before = shard.timers.cluster().view_id;
        shard.set_cluster(&next.cluster);
        if next.cluster.view_id != before && shard.has_peers() {
            shard.base.gate.spawn(resend_deletes(shard.clone()));
        }
        shard
            .timers
            .store
            .borrow_mut()
            .ids
            .set_instance(next.instance_id);
        shard.outbound.set_guard(next.guard.clone());
        let client = &shard.outbound.client;
        client.set_signing_keys(next.signing_keys.clone());
    }
}

/// Shard 0 runs the resyncs: asked for by SIGUSR1, `POST /resync`, and
/// (with `resync-at-start`, when there are other nodes) at start-up, to
/// take back the replicas this node holds.
fn start_resync(shard: &Rc<Shard>, signals: async_channel::Receiver<()>) {
    assert_eq!(shard.base.id, 0, "shard 0 runs the resyncs");
    shard.base.gate.spawn(resync_loop(shard.clone()));
    let at_start = shard.base.resolved.config.cluster.resync_at_start;
    if at_start && shard.has_peers() && shard.timers.cluster().local.is_some() {
        shard.resync.trigger.request(true);
    }
    let shard = shard.clone();
    shard.base.gate.clone().spawn(async move {
        while let Some(Ok(())) = shard.base.gate.unless_closing(signals.recv()).await {
            shard.resync.trigger.request(false);
        }
    });
}

/// What a message from another shard does here.
fn on_mesh(shard: &Rc<Shard>, msg: MeshMsg) {
    match msg {
        MeshMsg::Apply {
            head,
            spec,
            source,
            reply,
        } => {
            // The owner checks its node's storage itself: the shard that
            // took the request checked only its own moment (issue 38).
            let applied = shard
                .storage_admits()
                .and_then(|()| shard.apply(head, spec.as_deref(), source));
            match shard.durable.log() {
                // With a log, the answer waits until the change is durable.
                Some(_) if applied.is_ok() => {
                    let shard = shard.clone();
                    crate::runtime::spawn::spawn_local(async move {
                        let settled = shard.settle().await.and(applied);
                        let _ = reply.send(Reply::Applied(settled));
                    })
                    .detach();
                }
                _ => {
                    let _ = reply.send(Reply::Applied(applied));
                }
            }
        }
        MeshMsg::Resync { query, reply } => {
            // Building a session scans in slices and yields: its own task.
            let shard = shard.clone();
            crate::runtime::spawn::spawn_local(async move {
                let _ = reply.send(Reply::Resync(shard.resync_local(query).await));
            })
            .detach();
        }
        MeshMsg::MarkReferences { list, reply } => {
            let _ = reply.send(Reply::Marked(shard.mark_references(&list)));
        }
        MeshMsg::StartResync { all_views, reply } => {
            let _ = reply.send(Reply::ResyncRun(shard.resync.trigger.request(all_views)));
        }
        MeshMsg::LookUp { unique, reply } => {
            let _ = reply.send(Reply::Found(shard.look_up_here(unique)));
        }
        MeshMsg::Create { spec, reply } => {
            // A create waits for its log write and a replica: its own task.
            let shard = shard.clone();
            crate::runtime::spawn::spawn_local(async move {
                let _ = reply.send(Reply::Created(shard.create_settled(&spec).await));
            })
            .detach();
        }
        MeshMsg::Tags { reply } => {
            let _ = reply.send(Reply::Tags(shard.timers.store.borrow().tag_values()));
        }
        MeshMsg::Owed { node, reply } => {
            let (queued, settled, repair) = shard.owed_here(&node);
            let _ = reply.send(Reply::Owed(queued, settled, repair));
        }
    }
}

/// SIGHUP (`service chronos reload`) re-reads the file the node started
/// from (`Config::reload`): a valid one's cluster (`node`, `joining`,
/// `leaving`) and identity are handed to every shard over its bounded
/// reload channel. Other settings take a restart: the ones the file
/// changes are logged by key, and a file the next start would refuse is
/// reported. SIGUSR1 (`service chronos resync`) asks shard 0 for an active
/// resynchronisation (seed 003).
fn signal_hook(
    start: Arc<Resolved>,
    mut current: Reloaded,
    shards: Vec<async_channel::Sender<Arc<Reloaded>>>,
    resync: async_channel::Sender<()>,
    announced: Arc<AtomicBool>,
) -> SignalHook {
    Box::new(move |signal| {
        if signal == SIGUSR1 {
            match resync.try_send(()) {
                Ok(()) => tracing::info!(target: "chronos::node", "SIGUSR1: resync requested"),
                Err(_) => {
                    tracing::warn!(target: "chronos::node", "SIGUSR1: resync requests are already pending; this one joins them")
                }
            }
            return;
        }
        assert_eq!(signal, SIGHUP, "the engine hands over SIGHUP and SIGUSR1");
        // systemd hears of the reload only once it was told the node is
        // ready: a READY=1 after a reload during the start would announce
        // a node still recovering.
        let ready = announced.load(Ordering::SeqCst);
        if ready {
            systemd::tell(&systemd::reloading());
        }
        reload(&start, &mut current, &shards);
        if ready {
            systemd::tell("READY=1");
        }
    })
}

/// SIGHUP: re-read the listener's certificate and key (same files). A
/// chain or key that does not load is refused, logged, and the current
/// one stays; new handshakes take a new one, open connections keep theirs.
fn reload_tls(start: &Resolved) {
    let Some(tls) = &start.tls else { return };
    match tls.reload() {
        Ok(()) => {
            tracing::info!(target: "chronos::node", "SIGHUP: TLS certificate and key re-read; new connections get them")
        }
        Err(e) => {
            tracing::error!(target: "chronos::node", "SIGHUP: TLS certificate refused, keeping the current one: {e}")
        }
    }
}

/// A SIGHUP: re-read the file and hand a valid cluster to every shard.
fn reload(
    start: &Resolved,
    current: &mut Reloaded,
    shards: &[async_channel::Sender<Arc<Reloaded>>],
) {
    reload_tls(start);
    let Some(next) = reread(start) else {
        return;
    };
    let (was, now) = (&current.cluster, &next.cluster);
    if now.local_address != was.local_address {
        tracing::error!(target: "chronos::node", "SIGHUP: this node's address would change ({} to {}), which needs a restart; keeping the current cluster", was.local_address, now.local_address);
        return;
    }
    if next.instance_id != current.instance_id {
        tracing::warn!(target: "chronos::node", "SIGHUP: this node's instance ID moves from {} to {} under the new member list", current.instance_id, next.instance_id);
    }
    tracing::info!(
        target: "chronos::node",
        nodes = ?now.nodes.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
        leaving = ?now.leaving.iter().map(|n| n.address.as_str()).collect::<Vec<_>>(),
        cluster_view_id = %now.view_id,
        instance_id = next.instance_id,
        callback_allow = ?guard_summary(&next.guard),
        callback_signing_keys = next.signing_keys.as_ref().map_or(0, |k| k.len()),
        "SIGHUP: cluster reloaded (only [cluster] node, joining, leaving, [identity] and [timers] callback-allow and callback-signing-keys are applied; other settings take a restart)"
    );
    let shared = Arc::new(Reloaded {
        cluster: next.cluster.clone(),
        instance_id: next.instance_id,
        guard: next.guard.clone(),
        signing_keys: next.signing_keys.clone(),
    });
    for (i, tx) in shards.iter().enumerate() {
        if tx.try_send(shared.clone()).is_err() {
            tracing::error!(target: "chronos::node", "SIGHUP: shard {i} has {RELOADS_QUEUED_MAX} reloads pending; this one is dropped there");
        }
    }
    *current = next;
}

/// Re-read the configuration for a SIGHUP, logging what it does not
/// apply; `None` (logged) when it cannot be taken.
fn reread(start: &Resolved) -> Option<Reloaded> {
    let next = match Config::reload(start) {
        Ok(next) => next,
        Err(e) => {
            tracing::error!(target: "chronos::node", "SIGHUP: the configuration is invalid, keeping the current one: {e}");
            return None;
        }
    };
    if !next.not_applied.is_empty() {
        tracing::warn!(target: "chronos::node", "SIGHUP: not applied, these take a restart: {}", next.not_applied.join("; "));
    }
    if let Some(e) = &next.refused_at_start {
        tracing::warn!(target: "chronos::node", "SIGHUP: the file as it stands would be refused at the next start (the running settings stay until then): {e}");
    }
    Some(Reloaded {
        cluster: next.resolved.cluster,
        instance_id: next.resolved.instance_id,
        guard: next.resolved.guard,
        signing_keys: next.resolved.signing_keys,
    })
}

/// How the reload line shows the callback guard.
fn guard_summary(guard: &Option<Arc<Guard>>) -> String {
    match guard {
        None => "unset (every host)".into(),
        Some(g) => format!("{} rules", g.len()),
    }
}

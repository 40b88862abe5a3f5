//! Resynchronisation (seed 001 step 2, seed 003), both sides of one
//! protocol: a node asks every other for the timers it will replicate
//! under the current cluster view, and each serves them.
//!
//! **Serving.** `GET /timers?node-for-replicas=..&cluster-view-id=..[&time-from=..]`
//! with `Range: N` lists, in pop-time order, the timers this node holds
//! under an older cluster view whose replicas under the current view
//! include the requesting node and that no DELETE has marked as known to
//! it, with their new replica list and view. Timers already under the
//! current view are passed over, so in a stable cluster the answer is
//! empty. Two extensions: `all-views=true` lists current-view timers too (a
//! node that restarted empty takes its replicas back), and `cursor=`
//! continues a listing exactly where the previous page ended (the answer's
//! `cursor`). `DELETE /timers/references` marks which new replicas know a
//! timer.
//!
//! Cost: the first page of a listing scans the shard's store once, in
//! slices of `SCAN_SLICE` entries, letting the reactor run at least every
//! `bulk::STRETCH` (pops go on), into a *session*: the matching
//! `(due, ID)` keys, sorted, each with the slab index it was seen at. Later
//! pages binary-search the session and find each timer again at its slab
//! index (by ID when it is no longer there), so a listing of `n` timers
//! costs one scan plus `O(n log n)`, not a scan per page. Sessions are
//! bounded: one per requesting node and shard, dropped after
//! `SESSION_IDLE_MS` unused. A page is bounded in timers (`Range`, at most
//! `RANGE_MAX`) and in bytes (`PAGE_BYTES_MAX`, at least one timer).
//!
//! **Requesting.** This node pages
//! `GET /timers?node-for-replicas=<me>&cluster-view-id=..` from every other
//! node, applies seed 003's rules to each timer listed, and sends
//! `DELETE /timers/references` to the leaving nodes. For a timer listed
//! with new replica list `new`, old list `old`, and this node at `p` in
//! `new` (a node not in `old` counts as infinitely high):
//!
//! 1. **Add** it here only if this node moved down or stayed
//!    (`p <= old position`).
//! 2. **Replicate** it to each new replica above `p` whose old position is
//!    at or above `p`.
//! 3. **Tombstone** it on each old replica at or above `p` that is no
//!    longer a replica and is not leaving.
//! 4. Tell the leaving nodes `(ID, p)`: they mark that replica `p` and
//!    those above it know the timer.
//!
//! A timer whose lists are equal (a restore: `all-views`, listed to a node
//! that restarted empty) is only added: the others already have it.
//!
//! A run happens on shard 0, one at a time; requests during a run are
//! coalesced into one more run. An unreachable node is retried with
//! backoff for `resync-peer-retry-ms`, then reported, and the run goes on
//! with the next; the run then ends `failed`. Bounds: one page in hand
//! (`resync-page-timers`, and the serving node's byte bound), one request
//! at a time, each within `resync-timeout-ms`.
//!
//! | file | concern |
//! |---|---|
//! | `query.rs` | the shared terms: a checked GET (`Query`), a listing position (`Cursor`), one shard's answer (`ShardPage`) |
//! | `session.rs` | serving: a listing's matching keys, one sliced scan per session |
//! | `serve.rs` | serving: each shard's part of a page, the entries' JSON, the merged page |
//! | `references.rs` | serving: `DELETE /timers/references`, parsed and marked on each ID's owner |
//! | `trigger.rs` | requesting: requests coalesced into shard 0's loop, each run recorded |
//! | `request.rs` | requesting: a run, every node paged, seed 003's rules, the leaving nodes told |
//! | `page.rs` | requesting: a page read entry by entry (one-pass reader, serde behind it) |
//!
//! `GET /cluster`'s report of the resync's state is `api`'s.

pub mod page;
pub mod query;
pub mod references;
pub mod request;
pub mod serve;
pub mod session;
pub mod trigger;

/// A shard's resync state: the serving side's sessions and the
/// requesting side's trigger (used on shard 0).
#[derive(Default)]
pub struct Resync {
    pub(super) sessions: session::Sessions,
    pub trigger: trigger::Trigger,
}

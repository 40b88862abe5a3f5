//! Delivery with a policy (issue 41): a pop whose callback failed is kept
//! here, with its attempts, until it is delivered or given up; and a pop
//! another replica is retrying is watched here, so that this replica
//! carries the schedule on if that one goes quiet.
//!
//! The rules:
//! - The replica whose pop ran the first attempt owns the pop's attempts
//!   (an *owned* entry). After each failed attempt it logs the state
//!   (`[storage]`) and reports it to the timer's other replicas and sites
//!   (`delivery-state` in a replication body: sequence, attempts, the
//!   first attempt's and the next attempt's wall-clock times).
//! - A replica that gets such a report keeps a *watched* entry, due at the
//!   owner's next attempt plus its own skew (`replica index × skew`, at
//!   least one skew): the owner normally reports the next outcome before
//!   then, which moves or ends the watch. If nothing came, the watcher
//!   sends the next attempt itself and owns the pop from then on. So no
//!   attempt is sent twice without a failure in between while the owner
//!   is alive, and none is lost when it dies.
//! - Each pop (timer ID and sequence) has its own entry: a repeating
//!   timer's later pops go on on their schedule meanwhile.
//! - A delete or update of the timer ends its entries (the incarnation
//!   they belong to is gone).
//! - At most `ENTRIES_MAX` entries per shard: past it, a failed pop is
//!   given up at once (logged and counted), never queued without bound;
//!   at most `SENDING_MAX` attempts in flight per shard.

mod attempt;
mod book;
mod watch;

pub use attempt::retry_loop;
pub use book::{Entry, Retries};

/// Entries (pops being retried or watched) a shard keeps at most; each
/// is about 200 bytes.
pub const ENTRIES_MAX: usize = 65_536;
/// Attempts a shard's retry task has in flight at most.
pub const SENDING_MAX: usize = 256;

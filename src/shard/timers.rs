//! A shard's timers as a part: the store (wheel, ID index, tags,
//! informational copies), the cluster view they are placed under, and the
//! version counter that stamps each new incarnation. Single-threaded:
//! the store is a `RefCell`, never borrowed across an `.await`.

use super::store::Store;
use super::view::View;
use crate::cluster::Cluster;
use std::cell::{Cell, RefCell};

/// The store, the view and the version counter.
pub struct Timers {
    pub store: RefCell<Store>,
    pub(super) view: View,
    /// The last version handed out (strictly increasing per shard).
    pub(super) last_version_us: Cell<u64>,
}

impl Timers {
    pub(super) fn new(store: Store, cluster: &Cluster) -> Timers {
        Timers {
            store: RefCell::new(store),
            view: View::new(cluster),
            last_version_us: Cell::new(0),
        }
    }
}

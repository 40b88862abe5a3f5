//! A shard's timers as a part: the store (wheel, ID index, tags,
//! informational copies), the cluster view they are placed under, and the
//! version counter that stamps each new incarnation. Single-threaded:
//! the store is a `RefCell`, never borrowed across an `.await`.

use super::store::Store;
use super::view::View;
use crate::cluster::Cluster;
use crate::runtime::clock;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The store, the view and the version counter.
pub struct Timers {
    pub store: RefCell<Store>,
    pub(super) view: View,
    /// The last version handed out (strictly increasing per shard).
    last_version_us: Cell<u64>,
}

impl Timers {
    pub(super) fn new(store: Store, cluster: &Cluster) -> Timers {
        Timers {
            store: RefCell::new(store),
            view: View::new(cluster),
            last_version_us: Cell::new(0),
        }
    }

    /// The current view's fingerprint (stored with every incarnation).
    pub(crate) fn view(&self) -> u32 {
        self.view.fingerprint()
    }

    pub fn cluster(&self) -> Rc<Cluster> {
        self.view.cluster()
    }

    pub(super) fn next_version(&self) -> u64 {
        self.next_version_at(clock::unix_us())
    }

    /// [`Timers::next_version`] with the wall clock (µs) already read.
    pub(super) fn next_version_at(&self, now_us: u64) -> u64 {
        let v = now_us.max(self.last_version_us.get() + 1);
        assert!(v > self.last_version_us.get(), "versions strictly increase");
        self.last_version_us.set(v);
        v
    }
}

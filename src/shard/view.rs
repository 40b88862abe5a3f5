//! The cluster view a shard works under, and where a timer's replicas are
//! in it. A reload (SIGHUP) replaces the view between tasks; code that
//! computes a placement and sends replication holds one snapshot
//! (`Rc<Cluster>`) and does not await in between.

use crate::cluster::{Cluster, NODES_MAX};
use crate::timer::view_fingerprint;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Earlier cluster views a shard remembers (reloads).
pub const PAST_VIEWS_MAX: usize = 4;

/// The cluster as this shard knows it, this node's peer index in it, its
/// fingerprint, and the fingerprints of the views held before.
pub struct View {
    cluster: RefCell<Rc<Cluster>>,
    /// The view before the last reload that changed it: a client's update
    /// or delete also goes to a timer's replicas under it (issue 37), as a
    /// resync may not have moved the timer yet (at worst, once it has, an
    /// old replica keeps a needless tombstone for one tombstone life).
    previous: RefCell<Option<Rc<Cluster>>>,
    local_peer: Cell<Option<usize>>,
    fingerprint: Cell<u32>,
    /// Newest first (`0`: none): a message of one of these is from an older
    /// view. A view in neither list may be a newer one a peer reloaded to
    /// first.
    past: Cell<[u32; PAST_VIEWS_MAX]>,
}

impl View {
    pub fn new(cluster: &Cluster) -> View {
        View {
            local_peer: Cell::new(cluster.local_peer()),
            fingerprint: Cell::new(view_fingerprint(cluster.view_id)),
            past: Cell::new([0; PAST_VIEWS_MAX]),
            cluster: RefCell::new(Rc::new(cluster.clone())),
            previous: RefCell::new(None),
        }
    }

    /// Take a new view; the current one becomes the newest past one.
    pub fn set(&self, cluster: &Cluster) {
        self.local_peer.set(cluster.local_peer());
        let (old, new) = (self.fingerprint.get(), view_fingerprint(cluster.view_id));
        if old != new {
            let mut past = self.past.get();
            past.rotate_right(1);
            past[0] = old;
            // A view returned to is current again, not past.
            for v in past.iter_mut().filter(|v| **v == new) {
                *v = 0;
            }
            self.past.set(past);
            let before = self.cluster.borrow().clone();
            *self.previous.borrow_mut() = Some(before);
        }
        self.fingerprint.set(new);
        *self.cluster.borrow_mut() = Rc::new(cluster.clone());
        assert!(
            !self.past.get().contains(&new),
            "the current view is not past"
        );
    }

    pub fn cluster(&self) -> Rc<Cluster> {
        self.cluster.borrow().clone()
    }

    /// The view before the last reload that changed it.
    pub fn previous(&self) -> Option<Rc<Cluster>> {
        self.previous.borrow().clone()
    }

    pub fn fingerprint(&self) -> u32 {
        self.fingerprint.get()
    }

    pub fn past(&self) -> [u32; PAST_VIEWS_MAX] {
        self.past.get()
    }

    /// `mask` without this node's bit.
    pub fn without_me(&self, mask: u64) -> u64 {
        match self.local_peer.get() {
            Some(me) => mask & !(1u64 << me),
            None => mask,
        }
    }
}

/// Where a timer's replicas are under one cluster view.
pub struct Placement {
    /// Member indices, primary first.
    pub replicas: [usize; NODES_MAX],
    pub count: usize,
    pub bloom: u64,
    /// This node's place in `replicas`.
    pub my_index: Option<u8>,
}

impl Placement {
    pub fn of(cluster: &Cluster, unique: u64, factor: usize) -> Placement {
        let mut pl = Placement::empty();
        pl.fill(cluster, unique, factor);
        pl
    }

    /// No replica yet: what [`Placement::fill`] fills.
    pub fn empty() -> Placement {
        Placement {
            replicas: [0; NODES_MAX],
            count: 0,
            bloom: 0,
            my_index: None,
        }
    }

    /// [`Placement::of`] into `self`, where the caller keeps it: the
    /// 512-byte placement returned by value was copied on every create.
    pub fn fill(&mut self, cluster: &Cluster, unique: u64, factor: usize) {
        self.count = cluster.replicas_into(unique, factor, &mut self.replicas);
        assert!(
            self.count >= 1 && self.count <= factor.max(1),
            "1..=factor replicas"
        );
        self.bloom = cluster.bloom_of(self.members());
        self.my_index = cluster
            .local
            .and_then(|me| self.members().iter().position(|r| *r == me))
            .map(|i| i as u8);
    }

    pub fn members(&self) -> &[usize] {
        &self.replicas[..self.count]
    }

    /// The replicas as a peer mask.
    pub fn mask(&self) -> u64 {
        self.members().iter().fold(0, |m, &r| m | (1u64 << r))
    }

    /// The replicas' addresses, primary first.
    pub fn names<'c>(&self, cluster: &'c Cluster) -> ([&'c str; NODES_MAX], usize) {
        let mut names = [""; NODES_MAX];
        for (slot, &r) in names.iter_mut().zip(self.members()) {
            *slot = &cluster.nodes[r].address;
        }
        (names, self.count)
    }
}

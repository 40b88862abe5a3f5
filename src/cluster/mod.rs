//! Cluster membership and replica choice, compatible with the reference.
//!
//! - A node's hash is MurmurHash3_x86_32 of its `"ip:port"` (seed 0); on a
//!   collision with an earlier node the hash is decremented until unique.
//! - A timer's replicas rank every node by MurmurHash3_x86_32 of the timer's
//!   8-byte little-endian unique ID, seeded with the node's hash: the lowest
//!   is the primary, then the backups from the highest down.
//! - A node's bloom filter sets bit `h % 64` for each of the six 64-bit halves
//!   of MurmurHash3_x86_128 of its address under seeds 0, 1 and 2. A timer's
//!   filter is the OR of its replicas' filters; the cluster view ID is the OR
//!   over every node of the (new) cluster, written in decimal.

pub mod acks;
pub mod config;
pub mod owed;
pub mod replicate;
pub mod sites;

use crate::murmur::{murmur3_x86_128, murmur3_x86_32};
use std::net::SocketAddr;

pub use crate::timer::NODES_MAX;

/// Instance IDs a cluster's members derive (7 bits: the reference's
/// `[identity] instance_id` range).
pub const MEMBER_INSTANCES: usize = 128;
const _: () = assert!(
    NODES_MAX <= MEMBER_INSTANCES,
    "a member's instance fits the ID's bits"
);

/// Where a member's instance ID search starts: a hash of its address.
fn home_instance(address: &str) -> usize {
    murmur3_x86_32(address.as_bytes(), 0x1d) as usize % MEMBER_INSTANCES
}

/// One member of the cluster.
#[derive(Clone, Debug)]
pub struct Node {
    /// `"ip:port"`, exactly as configured: hashes are taken over this string.
    pub address: String,
    pub socket: SocketAddr,
    pub hash: u32,
    pub bloom: u64,
}

/// The bloom filter of one address.
pub fn address_bloom(address: &str) -> u64 {
    let mut bloom = 0u64;
    for seed in 0..3 {
        for half in murmur3_x86_128(address.as_bytes(), seed) {
            bloom |= 1 << (half % 64);
        }
    }
    bloom
}

/// The membership this node works with: the new cluster (`node` plus
/// `joining`), and the nodes that are leaving.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Members of the new cluster, in configuration order.
    pub nodes: Vec<Node>,
    /// Nodes being removed (still reachable, not chosen as replicas).
    pub leaving: Vec<Node>,
    /// How many of `nodes`, at its end, were listed as `joining`.
    pub joining: usize,
    /// Index of this node in `nodes`, if it is a member of the new cluster.
    pub local: Option<usize>,
    /// This node's own address.
    pub local_address: String,
    /// OR of the new cluster's bloom filters.
    pub view_id: u64,
}

impl Cluster {
    /// Build the membership. Addresses must be `ip:port` and unique.
    pub fn new(local: &str, nodes: &[String], leaving: &[String]) -> Result<Cluster, String> {
        if nodes.is_empty() {
            return Err("cluster has no nodes".into());
        }
        if nodes.len() + leaving.len() > NODES_MAX {
            // (peer masks are u64: one bit per node)
            return Err(format!("cluster has more than {NODES_MAX} nodes"));
        }
        let mut seen_hashes: Vec<u32> = Vec::new();
        let mut build = |addr: &String| -> Result<Node, String> {
            let socket: SocketAddr = addr
                .parse()
                .map_err(|_| format!("cluster address {addr:?} is not ip:port"))?;
            let mut hash = murmur3_x86_32(addr.as_bytes(), 0);
            while seen_hashes.contains(&hash) {
                hash = hash.wrapping_sub(1);
            }
            seen_hashes.push(hash);
            Ok(Node {
                address: addr.clone(),
                socket,
                hash,
                bloom: address_bloom(addr),
            })
        };
        let mut all: Vec<&String> = Vec::new();
        for addr in nodes.iter().chain(leaving) {
            if all.contains(&addr) {
                return Err(format!("cluster address {addr:?} is listed twice"));
            }
            all.push(addr);
        }
        let nodes: Vec<Node> = nodes.iter().map(&mut build).collect::<Result<_, _>>()?;
        let leaving: Vec<Node> = leaving.iter().map(&mut build).collect::<Result<_, _>>()?;
        let view_id = nodes.iter().fold(0, |acc, n| acc | n.bloom);
        let local_index = nodes.iter().position(|n| n.address == local);
        if local_index.is_none() && !leaving.iter().any(|n| n.address == local) {
            return Err(format!(
                "this node's address {local:?} is not in the cluster's node, joining or leaving lists"
            ));
        }
        Ok(Cluster {
            nodes,
            leaving,
            joining: 0,
            local: local_index,
            local_address: local.to_string(),
            view_id,
        })
    }

    /// The same cluster, with the last `count` of `nodes` reported as
    /// joining (they are members all the same).
    pub fn with_joining(mut self, count: usize) -> Cluster {
        assert!(
            count < self.nodes.len(),
            "a cluster has a member that is not joining"
        );
        self.joining = count;
        self
    }

    /// The single-node cluster of `address`.
    pub fn single(address: &str) -> Result<Cluster, String> {
        Cluster::new(address, &[address.to_string()], &[])
    }

    /// The cluster view ID as the reference writes it (decimal).
    pub fn view_id_string(&self) -> String {
        self.view_id.to_string()
    }

    /// Replica indices (into `nodes`) for a unique ID: primary first.
    /// `factor` is capped at the cluster size; writes into `out`, returns the count.
    pub fn replicas_into(
        &self,
        unique_id: u64,
        factor: usize,
        out: &mut [usize; NODES_MAX],
    ) -> usize {
        let n = self.nodes.len();
        let factor = factor.clamp(1, n);
        if n == 1 {
            // One node: the only ranking there is (no 1 KiB table to
            // clear, no hash).
            out[0] = 0;
            return 1;
        }
        let key = unique_id.to_le_bytes();
        let mut ranked = [(0u32, 0usize); NODES_MAX];
        for (i, node) in self.nodes.iter().enumerate() {
            ranked[i] = (murmur3_x86_32(&key, node.hash), i);
        }
        let ranked = &mut ranked[..n];
        ranked.sort_unstable();
        out[0] = ranked[0].1;
        for k in 1..factor {
            out[k] = ranked[n - k].1;
        }
        factor
    }

    /// The peers in `mask` (over `all_nodes`) in replica order for a
    /// unique ID: the lowest rank first, then from the highest down. For
    /// the nodes a timer's bloom filter names this is the order of the
    /// replica list it was placed with: the replica rule picks the lowest
    /// and then the highest ranks of the whole cluster, which are also the
    /// lowest and highest among the chosen (resync's `OldReplicas`).
    pub fn rank_among(&self, unique_id: u64, mask: u64) -> Vec<usize> {
        let key = unique_id.to_le_bytes();
        let mut ranked: Vec<(u32, usize)> = self
            .all_nodes()
            .enumerate()
            .filter(|(i, _)| mask & (1u64 << i) != 0)
            .map(|(i, node)| (murmur3_x86_32(&key, node.hash), i))
            .collect();
        ranked.sort_unstable();
        let mut out = Vec::with_capacity(ranked.len());
        if let Some(&(_, first)) = ranked.first() {
            out.push(first);
            out.extend(ranked[1..].iter().rev().map(|&(_, i)| i));
        }
        out
    }

    /// Replica indices as a vector (convenience for tests and cold paths).
    pub fn replicas(&self, unique_id: u64, factor: usize) -> Vec<usize> {
        let mut out = [0usize; NODES_MAX];
        let count = self.replicas_into(unique_id, factor, &mut out);
        out[..count].to_vec()
    }

    /// Every known node, members then leaving ones: the peer numbering used
    /// for replication (`0..nodes.len()` are the member indices).
    pub fn all_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().chain(self.leaving.iter())
    }

    /// The node at a peer index (see `all_nodes`).
    pub fn node_at(&self, peer: usize) -> &Node {
        if peer < self.nodes.len() {
            &self.nodes[peer]
        } else {
            &self.leaving[peer - self.nodes.len()]
        }
    }

    /// This node's peer index.
    pub fn local_peer(&self) -> Option<usize> {
        self.all_nodes()
            .position(|n| n.address == self.local_address)
    }

    /// The peer index of an address.
    pub fn peer_of(&self, address: &str) -> Option<usize> {
        self.all_nodes().position(|n| n.address == address)
    }

    /// Peers (as a bit mask over `all_nodes`) whose bloom filter is contained
    /// in `bloom`: the replicas a timer ID names (seed 001), plus rare false
    /// positives, which merely receive a message they store as a tombstone.
    pub fn bloom_matches(&self, bloom: u64) -> u64 {
        let mut mask = 0u64;
        for (i, node) in self.all_nodes().enumerate() {
            if node.bloom & !bloom == 0 {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// The instance ID (`0..MEMBER_INSTANCES`) each member derives from the
    /// member list (`nodes` then `leaving`, any order): members sorted by
    /// (home slot, address), each taking the first free slot from its home
    /// (a hash of its address) on. Distinct by construction, the same on
    /// every node that holds the same list, and stable when members come
    /// and go unless a newcomer's probe takes an existing member's slot.
    pub fn member_instances(&self) -> Vec<(&str, u8)> {
        let mut members: Vec<(usize, &str)> = self
            .all_nodes()
            .map(|n| (home_instance(&n.address), n.address.as_str()))
            .collect();
        members.sort_unstable();
        let mut taken = [false; MEMBER_INSTANCES];
        let mut out = Vec::with_capacity(members.len());
        for (home, address) in members {
            assert!(
                out.len() < MEMBER_INSTANCES,
                "more members than instance IDs"
            );
            let slot = (0..MEMBER_INSTANCES)
                .map(|k| (home + k) % MEMBER_INSTANCES)
                .find(|&s| !taken[s])
                .expect("a free slot: fewer members than slots");
            taken[slot] = true;
            out.push((address, slot as u8));
        }
        out
    }

    /// This node's derived instance ID (see `member_instances`).
    pub fn local_instance(&self) -> u8 {
        self.member_instances()
            .into_iter()
            .find(|(a, _)| *a == self.local_address)
            .map(|(_, i)| i)
            .expect("the local node is a member or leaving")
    }

    /// The bloom filter of a replica set.
    pub fn bloom_of(&self, replicas: &[usize]) -> u64 {
        replicas.iter().fold(0, |acc, &i| acc | self.nodes[i].bloom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Cluster {
        let nodes: Vec<String> = ["10.0.0.1:7253", "10.0.0.2:7253", "10.0.0.3:7253"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Cluster::new("10.0.0.1:7253", &nodes, &[]).unwrap()
    }

    #[test]
    fn member_instances_are_distinct_and_independent_of_list_order() {
        // 64 members on one port: many share a home slot.
        let all: Vec<String> = (1..=64).map(|i| format!("10.0.0.{i}:7253")).collect();
        let (nodes, leaving) = all.split_at(50);
        let a = Cluster::new(&all[0], nodes, leaving).unwrap();
        let ids = a.member_instances();
        assert_eq!(ids.len(), 64);
        let mut seen = [false; MEMBER_INSTANCES];
        for &(_, id) in &ids {
            assert!(
                !std::mem::replace(&mut seen[id as usize], true),
                "{id} twice"
            );
        }
        let mut reversed: Vec<String> = nodes.to_vec();
        reversed.reverse();
        let b = Cluster::new(&all[63], &reversed, leaving).unwrap();
        let mut x = ids.clone();
        let mut y = b.member_instances();
        x.sort();
        y.sort();
        assert_eq!(x, y, "every node derives the same assignment");
        assert_eq!(
            a.local_instance(),
            ids.iter().find(|m| m.0 == all[0]).unwrap().1
        );
    }

    #[test]
    fn a_newcomer_leaves_existing_instances_alone_unless_it_takes_their_slot() {
        let old: Vec<String> = (1..=3).map(|i| format!("10.0.0.{i}:7253")).collect();
        let small = Cluster::new(&old[0], &old, &[]).unwrap();
        let before = small.member_instances();
        let mut grown = old.clone();
        grown.push("10.0.0.200:7253".into());
        let big = Cluster::new(&old[0], &grown, &[]).unwrap();
        let after = big.member_instances();
        let newcomer_home = home_instance("10.0.0.200:7253");
        for (address, id) in before {
            let moved = after.iter().find(|m| m.0 == address).unwrap().1 != id;
            assert!(!moved || id as usize == newcomer_home, "{address} moved");
        }
    }

    fn addrs(c: &Cluster, replicas: Vec<usize>) -> Vec<&str> {
        replicas
            .into_iter()
            .map(|i| c.nodes[i].address.as_str())
            .collect()
    }

    #[test]
    fn design_vectors() {
        let c = three();
        assert_eq!(c.view_id_string(), "90691053180028962");
        let table: &[(u64, usize, &[&str])] = &[
            (0, 2, &["10.0.0.1:7253", "10.0.0.3:7253"]),
            (1, 2, &["10.0.0.3:7253", "10.0.0.2:7253"]),
            (0x1_0000_0009, 2, &["10.0.0.2:7253", "10.0.0.3:7253"]),
            (
                0x1234_1234_1234_1234,
                2,
                &["10.0.0.3:7253", "10.0.0.2:7253"],
            ),
            (0, 3, &["10.0.0.1:7253", "10.0.0.3:7253", "10.0.0.2:7253"]),
            (0, 9, &["10.0.0.1:7253", "10.0.0.3:7253", "10.0.0.2:7253"]),
        ];
        for &(id, factor, want) in table {
            assert_eq!(
                addrs(&c, c.replicas(id, factor)),
                want,
                "id {id:#x} factor {factor}"
            );
        }
    }

    #[test]
    fn rank_among_the_chosen_reproduces_the_replica_order() {
        let all: Vec<String> = (1..=7).map(|i| format!("10.0.0.{i}:7253")).collect();
        let c = Cluster::new(&all[0], &all, &[]).unwrap();
        for unique in 0..500u64 {
            for factor in 1..=4 {
                let list = c.replicas(unique, factor);
                let mask = list.iter().fold(0u64, |m, &r| m | 1 << r);
                assert_eq!(c.rank_among(unique, mask), list, "{unique} x{factor}");
            }
        }
    }

    #[test]
    fn single_node_view_id() {
        let c = Cluster::single("127.0.0.1:7253").unwrap();
        assert_eq!(c.view_id_string(), "288231544393302080");
        assert_eq!(c.replicas(42, 2), vec![0]);
        assert_eq!(c.bloom_of(&[0]), c.view_id);
    }

    #[test]
    fn rejects_bad_membership() {
        assert!(Cluster::new("1.2.3.4:1", &["nonsense".into()], &[]).is_err());
        assert!(Cluster::new("1.2.3.4:1", &["1.2.3.5:1".into()], &[]).is_err());
        assert!(Cluster::new("1.2.3.4:1", &["1.2.3.4:1".into(), "1.2.3.4:1".into()], &[]).is_err());
    }
}

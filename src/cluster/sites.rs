//! Geographic redundancy (seed 002's GR replicator): the sites a node
//! knows, and a timer's site list.
//!
//! A timer's `sites` list is the site that took the client request first,
//! then the remote sites it knew. Site `s` (its place in the list) pops
//! `s × replication factor × replica-skew` later than the first, so in a
//! healthy system only the first site pops. A timer keeps its list as
//! indices into this node's site table (`0`: the local site, `1..`: the
//! remote sites in configuration order), four bits each: names this node
//! does not know are dropped, which is what the reference does to removed
//! sites at the next pop.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// Sites a node knows, the local one included (four bits per site in a
/// timer's packed list, and `SITES_END` marks its end).
pub const SITES_MAX: usize = 7;
// Every remote site has a slot in the per-site counters.
const _: () = assert!(
    SITES_MAX - 1 <= crate::stats::SITE_SLOTS,
    "a stats slot per remote site"
);

/// The end of a packed site list.
const SITES_END: u32 = 0xF;
/// A packed list naming no site (a timer of a node without `[sites]`).
pub const SITES_NONE: u32 = u32::MAX;

/// One remote site: where its nodes take cross-site requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSite {
    pub name: String,
    /// `host:port` as the requests' `Host` header names it.
    pub address: String,
    pub socket: SocketAddr,
}

/// The names of a packed site list ([`Sites::names`]): at most
/// [`SITES_MAX`], held inline.
#[derive(Clone, Copy, Debug)]
pub struct SiteNames<'a> {
    names: [&'a str; SITES_MAX],
    len: usize,
}

impl<'a> std::ops::Deref for SiteNames<'a> {
    type Target = [&'a str];

    fn deref(&self) -> &[&'a str] {
        &self.names[..self.len]
    }
}

/// The site table: `[sites]` resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sites {
    pub local: String,
    pub remote: Vec<RemoteSite>,
    /// `replicate_timers_across_sites`: off, timers stay in their site.
    pub across: bool,
}

impl Sites {
    /// Resolve `[sites]`: `remote` entries are `name=host:port` or
    /// `name=host` (then `default_port`), the host an IP address or a DNS
    /// name (resolved here, once). `Err` names the key and the bad entry.
    pub fn new(
        local: &str,
        remote: &[String],
        across: bool,
        default_port: u16,
    ) -> Result<Sites, String> {
        if local.is_empty() || local.contains(['=', ',']) {
            return Err(format!(
                "[sites] local_site {local:?} must be a non-empty name without '=' or ','"
            ));
        }
        if remote.len() + 1 > SITES_MAX {
            return Err(format!(
                "[sites] remote_site lists {} sites: at most {}",
                remote.len(),
                SITES_MAX - 1
            ));
        }
        let mut sites = Sites {
            local: local.to_string(),
            remote: Vec::with_capacity(remote.len()),
            across,
        };
        for entry in remote {
            let site = parse_remote(entry, default_port)?;
            if site.name == sites.local || sites.remote.iter().any(|r| r.name == site.name) {
                return Err(format!(
                    "[sites] remote_site {entry:?}: site {:?} is listed twice (or is local_site)",
                    site.name
                ));
            }
            sites.remote.push(site);
        }
        Ok(sites)
    }

    /// Whether timers cross to other sites.
    pub fn replicating(&self) -> bool {
        self.across && !self.remote.is_empty()
    }

    /// The name of table entry `i` (`0`: the local site).
    pub fn name(&self, i: usize) -> &str {
        if i == 0 {
            &self.local
        } else {
            &self.remote[i - 1].name
        }
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        (0..=self.remote.len()).find(|&i| self.name(i) == name)
    }

    /// The list of a timer this node's client created: the local site,
    /// then every remote site.
    pub fn own_list(&self) -> u32 {
        pack((0..=self.remote.len()).map(Some))
    }

    /// A list received from another node: the names this node knows, in
    /// order (`SITES_NONE` when it names none).
    pub fn pack_names<'a>(&self, names: impl Iterator<Item = &'a str>) -> u32 {
        let mut any = false;
        let list = pack(
            names
                .map(|n| self.index_of(n))
                .inspect(|i| any |= i.is_some()),
        );
        if any {
            list
        } else {
            SITES_NONE
        }
    }

    /// The names of a packed list, in a fixed array (no allocation: this
    /// runs on every replication send).
    pub fn names(&self, list: u32) -> SiteNames<'_> {
        let mut names = SiteNames {
            names: [""; SITES_MAX],
            len: 0,
        };
        for i in unpack(list).take(SITES_MAX) {
            names.names[names.len] = self.name(i);
            names.len += 1;
        }
        names
    }

    /// How many sites a packed list names.
    pub fn count(list: u32) -> usize {
        unpack(list).count()
    }

    /// The list after a successful pop (reference behaviour): sites no
    /// longer known dropped (already, when packed), new ones appended.
    pub fn refreshed(&self, list: u32) -> u32 {
        if list == SITES_NONE {
            return self.own_list();
        }
        let kept = |i: usize| unpack(list).any(|k| k == i);
        let added = (0..=self.remote.len()).filter(|&i| !kept(i));
        pack(unpack(list).chain(added).map(Some))
    }

    /// This site's place in a packed list (`None`: not in it).
    pub fn local_position(list: u32) -> Option<u8> {
        unpack(list).position(|i| i == 0).map(|p| p as u8)
    }

    /// The remote sites of a packed list (table indices `1..`), in order.
    pub fn remote_in(list: u32) -> impl Iterator<Item = usize> {
        unpack(list).filter(|&i| i != 0)
    }
}

fn pack(indices: impl Iterator<Item = Option<usize>>) -> u32 {
    let mut list = 0u32;
    let mut n = 0;
    for i in indices.flatten().take(SITES_MAX) {
        assert!(i < SITES_MAX, "a site table index");
        list |= (i as u32) << (4 * n);
        n += 1;
    }
    for k in n..8 {
        list |= SITES_END << (4 * k);
    }
    list
}

fn unpack(list: u32) -> impl Iterator<Item = usize> {
    (0..8)
        .map(move |k| (list >> (4 * k)) & 0xF)
        .take_while(move |v| *v != SITES_END && list != SITES_NONE)
        .map(|v| v as usize)
}

/// The longest DNS name a remote site may be given by.
pub const HOST_NAME_BYTES_MAX: usize = 253;

fn parse_remote(entry: &str, default_port: u16) -> Result<RemoteSite, String> {
    let bad = |why: &str| {
        format!("[sites] remote_site {entry:?}: {why} (expected \"name=host:port\" or \"name=host\", the host an IP address or a DNS name)")
    };
    let (name, addr) = entry.split_once('=').ok_or_else(|| bad("no '='"))?;
    let (name, addr) = (name.trim(), addr.trim());
    if name.is_empty() || name.contains(',') {
        return Err(bad("an empty or bad name"));
    }
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return Ok(RemoteSite {
            name: name.to_string(),
            address: socket.to_string(),
            socket,
        });
    }
    if let Ok(ip) = addr.parse::<IpAddr>() {
        let socket = SocketAddr::new(ip, default_port);
        return Ok(RemoteSite {
            name: name.to_string(),
            address: socket.to_string(),
            socket,
        });
    }
    // A host name, with or without a port: resolved once, at start.
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad("a bad port"))?),
        None => (addr, default_port),
    };
    if host.is_empty() || host.contains(['/', ' ', '[', ']']) {
        return Err(bad("not an address"));
    }
    // DNS bounds (RFC 1035), checked before the name goes into request
    // heads and the resolver.
    if host.len() > HOST_NAME_BYTES_MAX || host.split('.').any(|l| l.len() > 63) {
        return Err(bad(&format!(
            "a host name longer than {HOST_NAME_BYTES_MAX} bytes, or with a label over 63"
        )));
    }
    let socket = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| bad("a host name that does not resolve"))?;
    Ok(RemoteSite {
        name: name.to_string(),
        address: format!("{host}:{port}"),
        socket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Sites {
        let remote = vec!["b=10.0.0.2:7253".to_string(), "c = 10.0.0.3".to_string()];
        Sites::new("a", &remote, true, 9000).unwrap()
    }

    #[test]
    fn parses_entries_and_takes_the_local_port() {
        let s = three();
        assert_eq!(s.remote[0].address, "10.0.0.2:7253");
        assert_eq!(s.remote[1].address, "10.0.0.3:9000");
        let named = Sites::new("a", &["b=localhost:7000".to_string()], true, 1).unwrap();
        assert_eq!(named.remote[0].address, "localhost:7000");
        assert_eq!(named.remote[0].socket.port(), 7000);
        for bad in [
            "nameless",
            "=1.2.3.4",
            "x=no-such-host.invalid",
            "x=1.2.3.4:99999",
        ] {
            let e = Sites::new("a", &[bad.to_string()], true, 1).unwrap_err();
            // The form it names is the one accepted: a host, not only an IP.
            assert!(
                e.contains(&format!("[sites] remote_site {bad:?}"))
                    && e.contains("\"name=host:port\" or \"name=host\"")
                    && e.contains("DNS name"),
                "{e}"
            );
        }
        assert!(
            Sites::new("a", &["a=1.2.3.4".to_string()], true, 1).is_err(),
            "local twice"
        );
    }

    #[test]
    fn an_overlong_host_name_is_refused_before_resolution() {
        let label = "a".repeat(60);
        let long = [label.as_str(); 5].join(".");
        let e = Sites::new("a", &[format!("b={long}:7253")], true, 1).unwrap_err();
        assert!(e.contains("longer than 253"), "{e}");
        let e = Sites::new("a", &[format!("b={}.x", "a".repeat(64))], true, 1).unwrap_err();
        assert!(e.contains("over 63"), "{e}");
    }

    #[test]
    fn lists_pack_refresh_and_place() {
        let s = three();
        let own = s.own_list();
        assert_eq!(*s.names(own), ["a", "b", "c"]);
        assert_eq!(Sites::local_position(own), Some(0));
        // Created at site c, which knew a and an unknown site d.
        let theirs = s.pack_names(["c", "d", "a"].into_iter());
        assert_eq!(*s.names(theirs), ["c", "a"]);
        assert_eq!(Sites::local_position(theirs), Some(1));
        // After a pop: known order kept, the missing site b appended.
        assert_eq!(*s.names(s.refreshed(theirs)), ["c", "a", "b"]);
        assert_eq!(Sites::remote_in(theirs).collect::<Vec<_>>(), vec![2]);
        assert_eq!(s.pack_names(["x"].into_iter()), SITES_NONE);
        assert!(s.names(SITES_NONE).is_empty());
    }
}

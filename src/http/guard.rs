//! The callback guard (`[timers] callback-allow`): which hosts a callback
//! may reach, so that a client cannot make the node call into its own
//! network (SSRF: loopback, link-local metadata services, private ranges).
//!
//! A list of rules, read in order; each is a CIDR (`10.0.0.0/8`,
//! `2001:db8::/32`; a bare address is one host), or a host suffix
//! (`example.com`: that name and its subdomains; `.example.com`: only its
//! subdomains), optionally prefixed `!` to deny. For each address a
//! callback's host stands for (the literal itself, or each address its
//! name resolves to), the first rule that matches the address (a CIDR) or
//! the host name (a suffix) decides; no matching rule refuses. The check
//! looks at the host and the address only, never the scheme, so it holds
//! for every callback transport.
//!
//! The check runs twice: when a timer is created or updated (every address
//! the name resolves to, [`Guard::check_host`]), and on the address a
//! callback actually connects to ([`Guard::decide`]), since a name may
//! resolve elsewhere later (DNS rebinding). The second allocates nothing
//! for an allowed address.

use futures_lite::future;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// An address range: the network (its host bits zero) and the prefix
    /// length. IPv4 ranges match IPv4-mapped IPv6 addresses too.
    Net(IpAddr, u8),
    /// A host name suffix, in lower case without a leading or trailing
    /// dot; `subdomains_only`: the name itself does not match.
    Suffix { name: String, subdomains_only: bool },
}

/// One rule of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    allow: bool,
    pattern: Pattern,
    /// As configured, for the reasons given.
    text: String,
}

/// The parsed list. `Guard::parse` refuses a rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    rules: Vec<Rule>,
}

/// Rules a list may hold: the check walks them per callback.
pub const RULES_MAX: usize = 1024;

/// Addresses a name may resolve to that are checked at create time (the
/// rest are ignored: the connect-time check covers the one used).
const ADDRESSES_MAX: usize = 64;

impl Guard {
    /// Parse `[timers] callback-allow`; the error names the key, the rule
    /// and what is wrong with it.
    pub fn parse(rules: &[String]) -> Result<Guard, String> {
        if rules.len() > RULES_MAX {
            return Err(format!(
                "[timers] callback-allow has {} rules: at most {RULES_MAX}",
                rules.len()
            ));
        }
        let rules = rules
            .iter()
            .map(|text| {
                parse_rule(text)
                    .map_err(|why| format!("[timers] callback-allow rule {text:?}: {why}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Guard { rules })
    }

    /// How many rules the list holds.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the list is empty (it then refuses every callback).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a callback to `host` (as written in its URI: a name, an
    /// address, or a bracketed IPv6 address) may go to `ip`. `Err` says
    /// which rule refused it, or that none matched.
    pub fn decide(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        let host = bare_host(host);
        // A literal address is not a name: suffix rules never match it.
        let name = host.parse::<IpAddr>().is_err().then_some(host);
        let ip = canonical(ip);
        let decided = self.rules.iter().find(|rule| match &rule.pattern {
            Pattern::Net(net, prefix) => in_net(ip, *net, *prefix),
            Pattern::Suffix {
                name: suffix,
                subdomains_only,
            } => name.is_some_and(|n| name_matches(n, suffix, *subdomains_only)),
        });
        match decided {
            Some(rule) if rule.allow => Ok(()),
            Some(rule) => Err(format!(
                "callback host {host} ({ip}) is refused by [timers] callback-allow rule {:?}",
                rule.text
            )),
            None => Err(format!(
                "callback host {host} ({ip}) is refused by [timers] callback-allow: no rule matched"
            )),
        }
    }

    /// The create-time check: every address `host` stands for must pass
    /// [`Guard::decide`]. A name is resolved off the shard's thread, within
    /// `limit`; one that does not resolve in time, or at all, is refused
    /// (`400`). A name resolved in the last [`NAME_TTL`] is not looked up
    /// again. At most [`LOOKUPS_IN_FLIGHT_MAX`] look-ups run per shard
    /// (each on a thread of its own; one given up at `limit` runs on until
    /// the resolver returns); past it the request gets `503`. On the
    /// executor's one blocking thread, with no bound, names that resolve
    /// slowly queued minutes of look-ups ahead of every other client's
    /// (the review's reproduction).
    pub async fn check_host(
        &self,
        host: &str,
        port: u16,
        limit: Duration,
    ) -> Result<(), (u16, String)> {
        let bare = bare_host(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.decide(host, ip).map_err(|e| (400, e));
        }
        if let Some(verdict) = self.judge_remembered(host, bare) {
            return verdict;
        }
        let found = resolve_all(bare, port, limit).await;
        match &found {
            Ok(addresses) => remember(bare, Ok(addresses.clone())),
            // A name that does not resolve (or not in time) is refused
            // again at once for a while, so a client repeating it does
            // not take a look-up slot each time; a busy shard's 503 is not
            // the name's fault and is not remembered.
            Err((400, reason)) => remember(bare, Err(reason.clone())),
            Err(_) => {}
        }
        for ip in found? {
            self.decide(host, ip).map_err(|e| (400, e))?;
        }
        Ok(())
    }

    /// The verdict for `name` from a look-up made within [`NAME_TTL`]
    /// ([`FAILED_NAME_TTL`] for one that failed), judged in place (no
    /// copy of the addresses); `None` when there is none.
    fn judge_remembered(&self, host: &str, name: &str) -> Option<Result<(), (u16, String)>> {
        NAMES.with(|n| {
            let names = n.borrow();
            let (found, at) = names.get(name)?;
            let ttl = if found.is_ok() {
                NAME_TTL
            } else {
                FAILED_NAME_TTL
            };
            if at.elapsed() >= ttl {
                return None;
            }
            Some(match found {
                Ok(addresses) => addresses
                    .iter()
                    .try_for_each(|ip| self.decide(host, *ip))
                    .map_err(|e| (400, e)),
                Err(reason) => Err((400, reason.clone())),
            })
        })
    }
}

/// How long a name's addresses are reused by the create-time check (the
/// connect-time check looks at the address actually used, so a stale entry
/// cannot let a callback through).
pub const NAME_TTL: Duration = Duration::from_secs(30);
/// How long a name that did not resolve (or not in time) is refused
/// without a new look-up.
pub const FAILED_NAME_TTL: Duration = Duration::from_secs(5);
/// Names remembered per shard (the table is emptied when full).
const NAMES_MAX: usize = 4096;
/// Name look-ups running per shard for the create-time check.
pub const LOOKUPS_IN_FLIGHT_MAX: usize = 8;

/// A name's addresses (or why it did not resolve) and when it was
/// looked up.
type Resolved = (Result<Vec<IpAddr>, String>, std::time::Instant);

thread_local! {
    /// This shard's remembered names (the guard runs on shard threads).
    static NAMES: std::cell::RefCell<std::collections::HashMap<String, Resolved>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    /// This shard's look-ups still running; decremented by the look-up's
    /// thread when the resolver returns, however long after the caller
    /// gave up.
    static LOOKUPS: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

fn remember(name: &str, found: Result<Vec<IpAddr>, String>) {
    NAMES.with(|n| {
        let mut n = n.borrow_mut();
        if n.len() >= NAMES_MAX {
            n.clear();
        }
        n.insert(name.to_string(), (found, std::time::Instant::now()));
    });
}

/// Every address of `host` (at most [`ADDRESSES_MAX`]), resolved on a
/// thread of its own within `limit`; `503` when this shard already has
/// [`LOOKUPS_IN_FLIGHT_MAX`] look-ups running.
async fn resolve_all(host: &str, port: u16, limit: Duration) -> Result<Vec<IpAddr>, (u16, String)> {
    let running = LOOKUPS.with(Arc::clone);
    if running.fetch_add(1, Ordering::Relaxed) >= LOOKUPS_IN_FLIGHT_MAX {
        running.fetch_sub(1, Ordering::Relaxed);
        return Err((
            503,
            format!(
                "callback host {host}: {LOOKUPS_IN_FLIGHT_MAX} callback host names are being resolved on this shard already; retry later, or name the callback by address"
            ),
        ));
    }
    // A thread of its own per look-up (at most LOOKUPS_IN_FLIGHT_MAX per
    // shard), not the executor's one blocking thread: look-ups that hang
    // run side by side instead of queueing, and never hold up the storage
    // or Postgres work that thread does.
    let (tx, rx) = async_channel::bounded(1);
    let lookup = format!("{host}:{port}");
    let done = running.clone();
    let spawned = std::thread::Builder::new()
        .name("chronos-guard-dns".into())
        .spawn(move || {
            let found = lookup
                .to_socket_addrs()
                .map(|it| it.take(ADDRESSES_MAX).map(|a| a.ip()).collect::<Vec<_>>());
            done.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.try_send(found);
        });
    if let Err(e) = spawned {
        running.fetch_sub(1, Ordering::Relaxed);
        return Err((
            503,
            format!("callback host {host}: no thread to resolve it: {e}"),
        ));
    }
    let resolve = async {
        match rx.recv().await {
            Ok(found) => {
                found.map_err(|e| (400, format!("callback host {host} does not resolve: {e}")))
            }
            Err(_) => Err((400, format!("callback host {host} does not resolve"))),
        }
    };
    let timeout = async {
        crate::runtime::sleep::sleep(limit).await;
        Err((
            400,
            format!(
                "callback host {host} does not resolve within {} ms",
                limit.as_millis()
            ),
        ))
    };
    let addresses = future::or(resolve, timeout).await?;
    if addresses.is_empty() {
        return Err((400, format!("callback host {host} has no address")));
    }
    Ok(addresses)
}

/// A host without IPv6 brackets and a trailing dot.
fn bare_host(host: &str) -> &str {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries (the
/// kernel connects to that), so that IPv4 ranges cover it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` (canonical: an IPv4-mapped address is IPv4) is in
/// `net/prefix`. An IPv4 address is compared with an IPv6 network as its
/// mapped form (`::ffff:a.b.c.d`), so `::/0` covers it too.
fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let within = |a: u128, n: u128, bits: u32| {
        assert!(u32::from(prefix) <= bits, "prefix checked at parse");
        prefix == 0 || (a ^ n) >> (bits - u32::from(prefix)) == 0
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => within(u32::from(a).into(), u32::from(n).into(), 32),
        (IpAddr::V4(a), IpAddr::V6(n)) => within(a.to_ipv6_mapped().into(), n.into(), 128),
        (IpAddr::V6(a), IpAddr::V6(n)) => within(a.into(), n.into(), 128),
        (IpAddr::V6(_), IpAddr::V4(_)) => false,
    }
}

/// Whether `name` is `suffix` or one of its subdomains (case-insensitive;
/// allocates nothing).
fn name_matches(name: &str, suffix: &str, subdomains_only: bool) -> bool {
    let (n, s) = (name.as_bytes(), suffix.as_bytes());
    if n.len() == s.len() {
        return !subdomains_only && n.eq_ignore_ascii_case(s);
    }
    n.len() > s.len()
        && n[n.len() - s.len()..].eq_ignore_ascii_case(s)
        && n[n.len() - s.len() - 1] == b'.'
}

fn parse_rule(text: &str) -> Result<Rule, String> {
    let (allow, body) = match text.trim().strip_prefix('!') {
        Some(rest) => (false, rest.trim()),
        None => (true, text.trim()),
    };
    if body.is_empty() {
        return Err("empty".into());
    }
    let pattern = match body.split_once('/') {
        Some((address, prefix)) => parse_net(address, Some(prefix))?,
        None if bare_host(body).parse::<IpAddr>().is_ok() => parse_net(bare_host(body), None)?,
        None => parse_suffix(body)?,
    };
    Ok(Rule {
        allow,
        pattern,
        text: text.to_string(),
    })
}

/// `address/prefix`, or a bare address (one host). The address must be
/// the network itself (no host bits set), so a typo is not silently a
/// wider or narrower range.
fn parse_net(address: &str, prefix: Option<&str>) -> Result<Pattern, String> {
    let ip: IpAddr = address
        .parse()
        .map_err(|_| format!("{address:?} is not an IP address"))?;
    let bits: u8 = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => bits,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= bits)
            .ok_or_else(|| format!("prefix length {p:?} must be 0 to {bits}"))?,
    };
    let host_bits_set = match ip {
        IpAddr::V4(a) => prefix < 32 && u32::from(a) << prefix != 0,
        IpAddr::V6(a) => prefix < 128 && u128::from(a) << prefix != 0,
    };
    if host_bits_set {
        return Err(format!(
            "{address} has bits set beyond the /{prefix} prefix (write the network address)"
        ));
    }
    // An IPv4-mapped network of at least /96 is the IPv4 network it
    // carries (addresses are judged in their IPv4 form); a wider one stays
    // IPv6 (`in_net` compares IPv4 addresses with it as mapped).
    let net = match ip {
        IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => return Ok(Pattern::Net(IpAddr::V4(v4), prefix - 96)),
            None => ip,
        },
        _ => ip,
    };
    Ok(Pattern::Net(net, prefix))
}

/// `example.com` or `.example.com`: labels of letters, digits, `-` and `_`.
fn parse_suffix(body: &str) -> Result<Pattern, String> {
    let (subdomains_only, name) = match body.strip_prefix('.') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let labels_ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    let last_numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    if !labels_ok || last_numeric {
        return Err("neither a CIDR, an IP address nor a host name suffix".into());
    }
    Ok(Pattern::Suffix {
        name,
        subdomains_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(rules: &[&str]) -> Guard {
        let rules: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
        Guard::parse(&rules).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The review: an IPv4-mapped rule kept its IPv6 prefix (96-128) on an
    /// IPv4 network, and judging an IPv4 address against it underflowed
    /// `32 - prefix` (a panic in a debug build; in release `/96` denied
    /// 0.0.0.0 alone).
    #[test]
    fn ipv4_mapped_rules_cover_the_ipv4_addresses_they_carry() {
        let g = guard(&["!::ffff:0:0/96", "0.0.0.0/0", "::/0"]);
        assert!(g.decide("127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(g.decide("10.1.2.3", ip("10.1.2.3")).is_err());
        assert!(g
            .decide("[::ffff:127.0.0.1]", ip("::ffff:127.0.0.1"))
            .is_err());
        assert!(g.decide("[2001:db8::1]", ip("2001:db8::1")).is_ok());
        let g = guard(&["!::ffff:127.0.0.0/104", "0.0.0.0/0"]);
        assert!(g.decide("127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(g.decide("10.0.0.1", ip("10.0.0.1")).is_ok());
        // A wider IPv6 network covers IPv4 addresses as their mapped form.
        let g = guard(&["!::/64", "0.0.0.0/0"]);
        assert!(g.decide("10.0.0.1", ip("10.0.0.1")).is_err());
        let g = guard(&["!2001:db8::/32", "0.0.0.0/0"]);
        assert!(g.decide("10.0.0.1", ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let g = guard(&["!10.1.0.0/16", "10.0.0.0/8", "!::1", "2001:db8::/32"]);
        assert!(g.decide("10.2.3.4", ip("10.2.3.4")).is_ok());
        let e = g.decide("10.1.3.4", ip("10.1.3.4")).unwrap_err();
        assert!(e.contains("\"!10.1.0.0/16\""), "{e}");
        assert!(g.decide("[::1]", ip("::1")).unwrap_err().contains("!::1"));
        assert!(g.decide("x", ip("2001:db8::5")).is_ok());
        let e = g.decide("192.168.1.1", ip("192.168.1.1")).unwrap_err();
        assert!(e.contains("no rule matched"), "{e}");
        // An IPv4-mapped IPv6 address is its IPv4 address.
        assert!(g
            .decide("[::ffff:10.1.0.1]", ip("::ffff:10.1.0.1"))
            .is_err());
        assert!(g.decide("[::ffff:10.2.0.1]", ip("::ffff:10.2.0.1")).is_ok());
        // /0 matches every address of its family.
        let all = guard(&["!0.0.0.0/0", "::/0"]);
        assert!(all.decide("1.2.3.4", ip("1.2.3.4")).is_err());
        assert!(all.decide("x", ip("2001::1")).is_ok());
    }

    #[test]
    fn suffixes_match_names_not_literals() {
        let g = guard(&[".internal.example", "example.com", "!0.0.0.0/0"]);
        let public = ip("8.8.8.8");
        assert!(g.decide("example.com", public).is_ok());
        assert!(g.decide("API.Example.COM.", public).is_ok());
        assert!(g.decide("badexample.com", public).is_err());
        assert!(g.decide("internal.example", public).is_err());
        assert!(g.decide("a.internal.example", public).is_ok());
        // The order decides between a name and an address.
        let g = guard(&["!127.0.0.0/8", "localhost"]);
        assert!(g.decide("localhost", ip("127.0.0.1")).is_err());
        let g = guard(&["localhost", "!127.0.0.0/8"]);
        assert!(g.decide("localhost", ip("127.0.0.1")).is_ok());
        assert!(g.decide("127.0.0.1", ip("127.0.0.1")).is_err());
    }

    /// The production setting the README, chronos.sample.toml and the
    /// packaged config recommend.
    #[test]
    fn the_recommended_list_keeps_callbacks_out_of_local_networks() {
        let g = guard(&[
            "!127.0.0.0/8",
            "!::1",
            "!169.254.0.0/16",
            "!fe80::/10",
            "!10.0.0.0/8",
            "!172.16.0.0/12",
            "!192.168.0.0/16",
            "!fc00::/7",
            "!0.0.0.0/8",
            "!::/128",
            "!100.64.0.0/10",
            "!64:ff9b::/96",
            "!64:ff9b:1::/48",
            "!2002::/16",
            "0.0.0.0/0",
            "::/0",
        ]);
        for refused in [
            "127.0.0.1",
            "169.254.169.254",
            "10.1.2.3",
            "172.31.255.255",
            "192.168.1.1",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            // NAT64 and 6to4 forms carry an IPv4 address a gateway may
            // reach (10.0.0.1 here).
            "64:ff9b::a00:1",
            "64:ff9b:1::a00:1",
            "2002:a00:1::1",
        ] {
            assert!(g.decide("h", ip(refused)).is_err(), "{refused}");
        }
        for allowed in ["8.8.8.8", "172.32.0.1", "2001:4860::8888"] {
            assert!(g.decide("h", ip(allowed)).is_ok(), "{allowed}");
        }
    }

    #[test]
    fn bad_rules_are_named() {
        for (rule, why) in [
            ("10.0.0.0/33", "prefix length"),
            ("10.0.0.1/8", "bits set beyond"),
            ("10.0.0/8", "not an IP address"),
            ("", "empty"),
            ("!", "empty"),
            ("exa mple.com", "neither"),
            ("10.0.0", "neither"),
            ("a..b", "neither"),
            ("http://x", "not an IP address"),
        ] {
            let e = Guard::parse(&[rule.to_string()]).unwrap_err();
            assert!(
                e.contains("[timers] callback-allow") && e.contains(why),
                "{rule:?}: {e}"
            );
        }
    }
}

//! `http://` and `https://` URIs: what a callback (or a peer) is reached at.

/// The parts of an `http://` or `https://` callback URI.
#[derive(Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// Host as written (an IP literal, a bracketed IPv6 literal, or a name).
    pub host: &'a str,
    pub port: u16,
    /// Path and query (no fragment): `/` when the URI has neither, and
    /// starting with `?` when it has a query and no path (the client
    /// writes `/` before it).
    pub path: &'a str,
    /// `host[:port]` for the `Host` header.
    pub authority: &'a str,
    /// `https://`: reached over TLS, the certificate verified for `host`.
    pub tls: bool,
}

/// The scheme of `uri` (case-insensitive), whether it is TLS, and the rest.
fn scheme(uri: &str) -> Option<(bool, &str)> {
    // Bytes: a match ends on an ASCII byte, so the rest is still a `str`.
    let starts = |prefix: &str| {
        uri.as_bytes()
            .get(..prefix.len())
            .is_some_and(|s| super::name_is(s, prefix.as_bytes()))
    };
    if starts("http://") {
        Some((false, &uri[7..]))
    } else if starts("https://") {
        Some((true, &uri[8..]))
    } else {
        None
    }
}

/// Split an `http[s]://host[:port][/path]` URI (port 80, or 443 for
/// `https://`, by default). The error names the URI and what is wrong
/// with it.
pub fn parse(uri: &str) -> Result<Target<'_>, String> {
    let (tls, rest) =
        scheme(uri).ok_or_else(|| format!("{uri:?} must be an http:// or https:// URI"))?;
    let Some(Split {
        authority_end,
        path_end,
        colon,
        at,
    }) = split(rest.as_bytes())
    else {
        return Err(format!(
            "{uri:?} contains spaces, control characters or non-ASCII (percent-encode them)"
        ));
    };
    // Byte offsets of ASCII bytes: both halves stay valid UTF-8.
    let (authority, path) = (&rest[..authority_end], &rest[authority_end..path_end]);
    let path = if path.is_empty() { "/" } else { path };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6
            .bytes()
            .position(|b| b == b']')
            .ok_or_else(|| format!("{uri:?} has a bad IPv6 host"))?;
        // After `]` only `:port` (`[::1]junk` used to mean port 80).
        let port = match &v6[end + 1..] {
            "" => None,
            rest => Some(
                rest.strip_prefix(':')
                    .ok_or_else(|| format!("{uri:?} has a bad IPv6 host"))?,
            ),
        };
        (&authority[..end + 2], port)
    } else {
        match colon {
            Some(colon) => (&authority[..colon], Some(&authority[colon + 1..])),
            None => (authority, None),
        }
    };
    if host.is_empty() || at {
        return Err(format!("{uri:?} has no usable host"));
    }
    let port = match port {
        None if tls => 443,
        None => 80,
        Some(p) => port_number(p)
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{uri:?} has a bad port"))?,
    };
    Ok(Target {
        host,
        port,
        path,
        authority,
        tls,
    })
}

/// Where the parts of a URI after its scheme end.
struct Split {
    /// The authority ends at the first `/`, `?` or `#`.
    authority_end: usize,
    /// The path (and query) ends at the first `#`, or the end.
    path_end: usize,
    /// The authority's last `:`.
    colon: Option<usize>,
    /// Whether the authority holds an `@` (userinfo: refused).
    at: bool,
}

/// One pass over what follows the scheme (it runs on every `POST`: four
/// searches cost ~300 instructions more). `None` when any byte, the
/// fragment's too, is a space, a control character or not ASCII: the
/// authority is sent as the callback's `Host` header and the path in its
/// request line, so CR LF would let a client add headers of its own, and
/// a URI is ASCII (RFC 3986; a raw UTF-8 byte makes a request line no
/// target takes). A fragment is the client's own and never sent (RFC
/// 3986 section 3.5; curl drops it too): it ends the authority or the
/// path. `#` is not allowed inside an IPv6 literal, so `[a#b]` is a bad
/// host here, as the OpenAPI pattern says.
fn split(rest: &[u8]) -> Option<Split> {
    let bad = |b: u8| b <= b' ' || b >= 0x7f;
    let (mut i, mut colon, mut at) = (0, None, false);
    while let Some(&b) = rest.get(i) {
        match b {
            b'/' | b'?' | b'#' => break,
            b':' => colon = Some(i),
            b'@' => at = true,
            b if bad(b) => return None,
            _ => {}
        }
        i += 1;
    }
    let authority_end = i;
    while let Some(&b) = rest.get(i) {
        match b {
            b'#' => break,
            b if bad(b) => return None,
            _ => i += 1,
        }
    }
    let path_end = i;
    rest[i..].iter().all(|&b| !bad(b)).then_some(Split {
        authority_end,
        path_end,
        colon,
        at,
    })
}

/// A port: 1 to 5 digits read directly, anything else as `str::parse`
/// reads it (a `+` sign, say), so what is accepted is unchanged.
fn port_number(p: &str) -> Option<u16> {
    let b = p.as_bytes();
    if (1..=5).contains(&b.len()) && b.iter().all(u8::is_ascii_digit) {
        let n = b.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
        return u16::try_from(n).ok();
    }
    p.parse::<u16>().ok()
}

/// Whether `uri` is a usable `http://` or `https://` URI (the JSON
/// codec's check).
pub fn check(uri: &str) -> Result<(), String> {
    parse(uri).map(|_| ())
}

/// Decode a query-string value (`%XX` escapes, `+` for a space); `None`
/// for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                // Two hex digits, nothing else (`from_str_radix` alone
                // would take `%+f` as 0x0f).
                let hex = b.get(i + 1..i + 3)?;
                let digit = |c: u8| (c as char).to_digit(16);
                out.push((digit(hex[0])? * 16 + digit(hex[1])?) as u8);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fragment never reaches the request target or the host.
    #[test]
    fn a_fragment_is_dropped() {
        let t = parse("http://h/p?q=1#frag").unwrap();
        assert_eq!((t.host, t.path, t.authority), ("h", "/p?q=1", "h"));
        let t = parse("http://h:81#frag#more").unwrap();
        assert_eq!(
            (t.host, t.port, t.path, t.authority),
            ("h", 81, "/", "h:81")
        );
        let t = parse("http://[::1]#f").unwrap();
        assert_eq!((t.host, t.port, t.path), ("[::1]", 80, "/"));
        for bad in ["http://#frag", "http://[a#b]:80/", "http://h:#f"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uri_parts() {
        let t = parse("http://127.0.0.1:8080/cb?x=1").unwrap();
        assert_eq!(
            (t.host, t.port, t.path, t.authority),
            ("127.0.0.1", 8080, "/cb?x=1", "127.0.0.1:8080")
        );
        let t = parse("HTTP://example.com").unwrap();
        assert_eq!((t.host, t.port, t.path), ("example.com", 80, "/"));
        let t = parse("http://[::1]:9/a").unwrap();
        assert_eq!((t.host, t.port, t.tls), ("[::1]", 9, false));
        let t = parse("HTTPS://example.com/cb").unwrap();
        assert_eq!(
            (t.host, t.port, t.path, t.tls),
            ("example.com", 443, "/cb", true)
        );
        let t = parse("https://10.0.0.1:8443").unwrap();
        assert_eq!(
            (t.host, t.port, t.authority, t.tls),
            ("10.0.0.1", 8443, "10.0.0.1:8443", true)
        );
        for bad in [
            "http://",
            "https://",
            "http://h:0/",
            "http://h:x/",
            "ftp://h/",
            "httpss://h/",
            "http://h/a b",
            "http://[::1]x/",
            "http://[::1]\r\nX-A: b/",
            "http://a\r\nX-A: b:80/",
            "http://a b/",
            "http://h/caf\u{e9}",
            "http://h\u{e9}/",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// The parser before its one-pass split (four byte searches), kept
    /// as the reference the one-pass version must agree with.
    /// The scheme match as it was (a `str` compare), so the byte compare
    /// in `scheme` is checked against it, not against itself.
    fn reference_scheme(uri: &str) -> Option<(bool, &str)> {
        let starts = |prefix: &str| {
            uri.get(..prefix.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(prefix))
        };
        if starts("http://") {
            Some((false, &uri[7..]))
        } else if starts("https://") {
            Some((true, &uri[8..]))
        } else {
            None
        }
    }

    fn reference(uri: &str) -> Result<(&str, u16, &str, &str, bool), String> {
        let (tls, rest) = reference_scheme(uri)
            .ok_or_else(|| format!("{uri:?} must be an http:// or https:// URI"))?;
        if rest.bytes().any(|b| b <= b' ' || b >= 0x7f) {
            return Err(format!(
                "{uri:?} contains spaces, control characters or non-ASCII (percent-encode them)"
            ));
        }
        let rest = rest
            .bytes()
            .position(|b| b == b'#')
            .map_or(rest, |hash| &rest[..hash]);
        let split = rest
            .bytes()
            .position(|b| b == b'/' || b == b'?')
            .unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let path = if path.is_empty() { "/" } else { path };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let v6_bad = || format!("{uri:?} has a bad IPv6 host");
            let end = v6.bytes().position(|b| b == b']').ok_or_else(v6_bad)?;
            let port = match &v6[end + 1..] {
                "" => None,
                rest => Some(rest.strip_prefix(':').ok_or_else(v6_bad)?),
            };
            (&authority[..end + 2], port)
        } else {
            match authority.bytes().rposition(|b| b == b':') {
                Some(colon) => (&authority[..colon], Some(&authority[colon + 1..])),
                None => (authority, None),
            }
        };
        if host.is_empty() || authority.bytes().any(|b| b == b'@') {
            return Err(format!("{uri:?} has no usable host"));
        }
        let port = match port {
            None if tls => 443,
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{uri:?} has a bad port"))?,
        };
        Ok((host, port, path, authority, tls))
    }

    /// Every combination of a few hosts, ports, paths and fragments reads
    /// as the reference reads it (the same parts, or the same reason).
    #[test]
    fn the_one_pass_split_agrees_with_the_searches() {
        let hosts = [
            "",
            "h",
            "127.0.0.1",
            "[::1]",
            "[::1",
            "[::1]x",
            "u@h",
            "a b",
            "h\u{e9}",
        ];
        let ports = [
            "", ":", ":0", ":9", ":80", ":65535", ":65536", ":+80", ":099999", ":x", ":1:2",
        ];
        let paths = ["", "/", "/cb", "?q=1", "/a?b=@:#", "/a b", "/\x7f", "/?#"];
        let frags = ["", "#", "#f", "#a b", "#\r\n", "#x#y"];
        let schemes = [
            "http://",
            "HTTPS://",
            "hTtP://",
            "ftp://",
            "http:/",
            "https:",
            "htt\u{212a}://",
            "\u{e9}http://",
            "http\u{a0}//",
            "",
        ];
        for scheme in schemes {
            for host in hosts {
                for port in ports {
                    for path in paths {
                        for frag in frags {
                            let uri = format!("{scheme}{host}{port}{path}{frag}");
                            let new =
                                parse(&uri).map(|t| (t.host, t.port, t.path, t.authority, t.tls));
                            let old = reference(&uri);
                            assert_eq!(new, old, "{uri}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn query_values_decode() {
        assert_eq!(percent_decode("10.0.0.1%3A7253").unwrap(), "10.0.0.1:7253");
        assert_eq!(percent_decode("a+b").unwrap(), "a b");
        assert!(percent_decode("%zz").is_none());
        assert!(percent_decode("%4").is_none());
        // A sign is not a hex digit.
        assert!(percent_decode("%+f").is_none());
        assert!(percent_decode("%-1").is_none());
        assert_eq!(percent_decode("%4a%4A%ff").map(|s| s.len()), None);
        assert_eq!(percent_decode("%4a%4A").unwrap(), "JJ");
    }
}

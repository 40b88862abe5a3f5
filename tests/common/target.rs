//! A scripted callback target for the delivery tests (issue 41): a real
//! HTTP server on a loopback port that records every request it gets and
//! answers each as a script says (a status, a `Retry-After`, a hold before
//! the answer), given what it got so far.

use super::cluster::{member_addr, member_list};
use super::read_request;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One request a [`Target`] got.
#[derive(Clone, Debug)]
pub struct Hit {
    pub at: Instant,
    pub path: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Hit {
    /// A header's value (`""` when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// `X-Chronos-Attempt` (0 when absent).
    pub fn attempt(&self) -> u32 {
        self.header("x-chronos-attempt").parse().unwrap_or(0)
    }

    /// `X-Sequence-Number` (0 when absent).
    pub fn sequence(&self) -> u32 {
        self.header("x-sequence-number").parse().unwrap_or(0)
    }
}

/// How a [`Target`] answers one request.
#[derive(Clone, Copy, Debug)]
pub struct Reply {
    pub status: u16,
    /// Sent as `Retry-After: <s>` when set.
    pub retry_after: Option<u32>,
    /// How long the target holds the request before it answers.
    pub hold: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            retry_after: None,
            hold: Duration::ZERO,
        }
    }
}

type Hits = Arc<(Mutex<Vec<Hit>>, Condvar)>;
type Script = Arc<dyn Fn(&[Hit]) -> Reply + Send + Sync>;

/// A callback target answering by a script.
pub struct Target {
    pub addr: SocketAddr,
    hits: Hits,
}

impl Target {
    /// A target whose answer to each request is `script(every request so
    /// far, this one last)`.
    pub fn start(script: impl Fn(&[Hit]) -> Reply + Send + Sync + 'static) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Hits = Default::default();
        let script: Script = Arc::new(script);
        let h = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (h, script) = (h.clone(), script.clone());
                std::thread::spawn(move || serve(stream, h, script));
            }
        });
        Target { addr, hits }
    }

    /// The first `fails` requests get `status`, the rest 200.
    pub fn failing(fails: usize, status: u16) -> Target {
        Target::start(move |hits| match hits.len() <= fails {
            true => Reply::status(status),
            false => Reply::status(200),
        })
    }

    pub fn uri(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.0.lock().unwrap().clone()
    }

    /// Every request's `X-Chronos-Attempt`, as sent.
    pub fn attempts(&self) -> Vec<String> {
        let hits = self.hits();
        hits.iter()
            .map(|h| h.header("x-chronos-attempt").to_string())
            .collect()
    }

    /// Wait until `n` requests came, or `timeout` passed; all of them.
    /// After `quiet`, still `n` requests: nothing more came (a count
    /// that must not grow, looked at once the window is over).
    pub fn assert_quiet(&self, n: usize, quiet: Duration, what: &str) {
        std::thread::sleep(quiet);
        assert_eq!(self.hits().len(), n, "{what}");
    }

    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Hit> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.hits;
        let mut hits = lock.lock().unwrap();
        while hits.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            hits = cv.wait_timeout(hits, left).unwrap().0;
        }
        hits.clone()
    }
}

fn serve(stream: TcpStream, hits: Hits, script: Script) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some((path, headers, body)) = read_request(&mut reader) {
        let reply = {
            let (lock, cv) = &*hits;
            let mut hits = lock.lock().unwrap();
            hits.push(Hit {
                at: Instant::now(),
                path,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            cv.notify_all();
            script(&hits)
        };
        std::thread::sleep(reply.hold);
        let answer = match reply.status {
            200..=299 => format!("HTTP/1.1 {} OK\r\nContent-Length: 0\r\n\r\n", reply.status),
            status => {
                let after = reply
                    .retry_after
                    .map_or(String::new(), |s| format!("Retry-After: {s}\r\n"));
                format!("HTTP/1.1 {status} No\r\n{after}Content-Length: 2\r\n\r\nno")
            }
        };
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The config of member `i` of a loopback cluster of one core per node and
/// replication factor 2, with these `nodes` and `joining` lists.
pub fn member_config(i: usize, port: u16, nodes: &[usize], joining: &[usize]) -> String {
    format!(
        "[runtime]\ncores = 1\n[timers]\ndefault-replication-factor = 2\n[cluster]\nlocalhost = {}\nnode = [{}]\njoining = [{}]\n",
        member_addr(i, port),
        member_list(nodes, port),
        member_list(joining, port),
    )
}

/// Which node of `nodes` owns the pop's attempts: the one that counted them.
pub fn owner(nodes: &[super::Node]) -> usize {
    let counted = |n: &super::Node| {
        n.metrics()
            .ok()
            .and_then(|m| super::metric_value(&m, "chronos_delivery_attempts_total"))
            .unwrap_or(0.0)
    };
    let mut found = None;
    super::wait_until("an owner", Duration::from_secs(10), || {
        found = nodes.iter().position(|n| counted(n) >= 1.0);
        found
            .map(|_| ())
            .ok_or_else(|| "no attempts counted".to_string())
    });
    found.unwrap()
}

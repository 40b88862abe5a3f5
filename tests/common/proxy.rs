//! A TCP proxy of a test's own on a free loopback port, in front of one
//! upstream address (Postgres, a broker). Each connection it accepts gets
//! an upstream connection and two threads, one per direction, which end
//! with their connections. What each direction does to the bytes (pass
//! them as they are, read them frame by frame, withhold or cut them) is
//! the test's: this file only accepts, connects and shuts down.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

/// One direction of a proxied connection: read from the first stream,
/// write to the second.
pub type Pump = dyn Fn(TcpStream, TcpStream) + Send + Sync;

/// Start a proxy to `upstream`; its port. For each connection,
/// `requests(client, server)` and `replies(server, client)` run on their
/// own threads. A connection upstream refuses is dropped.
pub fn start(upstream: SocketAddr, requests: Arc<Pump>, replies: Arc<Pump>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            join(client, upstream, &requests, &replies);
        }
    });
    port
}

/// Join `client` (accepted) to a new connection to `upstream`:
/// `requests(client, server)` and `replies(server, client)` on their own
/// threads. A connection upstream refuses is dropped.
pub fn join(client: TcpStream, upstream: SocketAddr, requests: &Arc<Pump>, replies: &Arc<Pump>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (requests, replies) = (requests.clone(), replies.clone());
    std::thread::spawn(move || requests(client, server));
    std::thread::spawn(move || replies(s2, c2));
}

/// Copy `from` to `to` as it comes, to the end of either; then shut both.
pub fn pass_as_is(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    shut_both(&from, &to);
}

/// Shut both streams down in both directions (ending the other
/// direction's thread too).
pub fn shut_both(from: &TcpStream, to: &TcpStream) {
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

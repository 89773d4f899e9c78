//! Peer addresses by name, resolved at every connection.
//!
//! Every address a process dials (a server for the coordinator and the workers, a peer server
//! for ECRec, the coordinator's control socket for a worker) is a [`PeerAddr`]: `host:port`
//! with a DNS name, an IPv4 address or a bracketed IPv6 address. A name is never resolved
//! once and remembered: [`PeerAddr::resolve`] looks it up each time it is called, and the
//! gRPC channels dial through [`connector`], whose resolver runs on every (re)connect. So a
//! server replaced at the same name but a new address (a Kubernetes pod restarted by its
//! StatefulSet) is found by the next reconnect.
//!
//! Names are looked up in the file named by `$FTREC_HOSTS` first, when it is set (the
//! `/etc/hosts` format: an address, then the names it serves; re-read at every lookup), then
//! by the system resolver. The file lets a job pin names without touching the machine's
//! resolver, and lets tests move a name to another address while a job runs.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::{dns::Name, HttpConnector};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The variable naming a hosts file consulted before the system resolver.
pub const HOSTS_ENV: &str = "FTREC_HOSTS";

/// `host:port` of a peer: a DNS name, an IPv4 address or an `[IPv6]` address, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// The name, or the address without brackets.
    host: String,
    /// The host as an address, when it is one (no lookup needed).
    ip: Option<IpAddr>,
    port: u16,
}

/// Why a string is not a peer address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not HOST:PORT ({why}): give a DNS name, an IPv4 address or an [IPv6] \
     address, then a port, e.g. ftrec-server-0.ftrec-servers:7000, 10.0.0.5:7000 or [::1]:7000"
)]
pub struct AddrError {
    value: String,
    why: &'static str,
}

impl PeerAddr {
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address, when the host is one rather than a name.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.ip.map(|ip| SocketAddr::new(ip, self.port))
    }

    /// Look the host up now (the hosts file of `$FTREC_HOSTS` first, then the system's
    /// resolver). Blocking; an error names the host.
    pub fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        if let Some(a) = self.socket_addr() {
            return Ok(vec![a]);
        }
        let ips = lookup(&self.host)?;
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, self.port))
            .collect())
    }

    /// A blocking TCP connection to the first address the host resolves to that accepts one.
    pub fn connect_std(&self) -> io::Result<std::net::TcpStream> {
        let mut last = None;
        for a in self.resolve()? {
            match std::net::TcpStream::connect(a) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} resolves to no address", self.host),
            )
        }))
    }
}

/// A listen address (`--listen`, `--control-listen`): a socket address, or `host:port` with
/// a name looked up once, now (its first address). Port 0 asks the system for a free port.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT (e.g. 0.0.0.0:7000 or localhost:7000)"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?}: the port must be a number from 0 to 65535"))?;
    // Checked as a peer's name, on a port a peer could use.
    let peer: PeerAddr = format!("{host}:1").parse().map_err(|e: AddrError| {
        AddrError {
            value: s.to_string(),
            why: e.why,
        }
        .to_string()
    })?;
    let ips = lookup(peer.host()).map_err(|e| e.to_string())?;
    Ok(SocketAddr::new(ips[0], port))
}

impl From<SocketAddr> for PeerAddr {
    fn from(a: SocketAddr) -> Self {
        PeerAddr {
            host: a.ip().to_string(),
            ip: Some(a.ip()),
            port: a.port(),
        }
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

impl FromStr for PeerAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        let bad = |why| AddrError {
            value: s.to_string(),
            why,
        };
        if let Ok(a) = s.parse::<SocketAddr>() {
            if a.port() == 0 {
                return Err(bad("port 0 names no peer"));
            }
            return Ok(a.into());
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port must be a number from 1 to 65535"))?;
        if port == 0 {
            return Err(bad("port 0 names no peer"));
        }
        if host.starts_with('[') || host.contains(':') {
            return Err(bad("not a valid [IPv6] address"));
        }
        if host.parse::<IpAddr>().is_ok() {
            // Unreachable for well-formed addresses (SocketAddr parsed them); kept so an
            // address never passes as a name.
            return Err(bad("not a valid address"));
        }
        valid_name(host).map_err(bad)?;
        if host
            .split('.')
            .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("not a valid IPv4 address"));
        }
        Ok(PeerAddr {
            host: host.to_ascii_lowercase(),
            ip: None,
            port,
        })
    }
}

/// A DNS name as RFC 1123 allows it (letters, digits, `-` inside labels; `_` too, as some
/// resolvers serve it), at most 253 characters, labels of 1 to 63.
fn valid_name(host: &str) -> Result<(), &'static str> {
    if host.is_empty() {
        return Err("no host");
    }
    if host.len() > 253 {
        return Err("a name has at most 253 characters");
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a name's labels have 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a name has only letters, digits, '-', '_' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a name's labels neither start nor end with '-'");
        }
    }
    Ok(())
}

impl Serialize for PeerAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PeerAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The addresses of `host` in the hosts file of `$FTREC_HOSTS` (`None`: no file, or the name
/// is not in it).
fn lookup_hosts_file(host: &str) -> io::Result<Option<Vec<IpAddr>>> {
    let Some(path) = std::env::var_os(HOSTS_ENV) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "reading the hosts file ${HOSTS_ENV}={}: {e}",
                std::path::Path::new(&path).display()
            ),
        )
    })?;
    let ips: Vec<IpAddr> = text
        .lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let ip: IpAddr = words.next()?.parse().ok()?;
            words
                .any(|w| w.trim_end_matches('.').eq_ignore_ascii_case(host))
                .then_some(ip)
        })
        .collect();
    Ok((!ips.is_empty()).then_some(ips))
}

/// Every address of `host` (a name): the hosts file first, then the system resolver.
fn lookup(host: &str) -> io::Result<Vec<IpAddr>> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("cannot resolve {host}: {e}"));
    if let Some(ips) = lookup_hosts_file(host).map_err(named)? {
        return Ok(ips);
    }
    let ips: Vec<IpAddr> = (host, 0)
        .to_socket_addrs()
        .map_err(named)?
        .map(|a| a.ip())
        .collect();
    if ips.is_empty() {
        return Err(named(io::Error::new(io::ErrorKind::NotFound, "no address")));
    }
    Ok(ips)
}

/// The resolver of the gRPC channels: [`lookup`] on a blocking thread, at every connect.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerResolver;

type Lookup = Pin<Box<dyn Future<Output = io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl tower_service::Service<Name> for PeerResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Lookup;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Lookup {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let ips = tokio::task::spawn_blocking(move || lookup(&host))
                .await
                .map_err(io::Error::other)??;
            // The connector sets the port from the URI.
            Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// The TCP connector every gRPC client dials through: [`PeerResolver`] at each connect, no
/// Nagle delay.
pub fn connector() -> HttpConnector<PeerResolver> {
    let mut http = HttpConnector::new_with_resolver(PeerResolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_addresses_take_names_ipv4_and_bracketed_ipv6() {
        let a: PeerAddr = "ftrec-server-1.ftrec-servers:7000".parse().unwrap();
        assert_eq!((a.host(), a.port()), ("ftrec-server-1.ftrec-servers", 7000));
        assert_eq!(a.socket_addr(), None);
        assert_eq!(a.to_string(), "ftrec-server-1.ftrec-servers:7000");
        let a: PeerAddr = "LocalHost:80".parse().unwrap();
        assert_eq!(a.to_string(), "localhost:80");
        let a: PeerAddr = "10.0.0.5:7000".parse().unwrap();
        assert_eq!(a.socket_addr(), Some("10.0.0.5:7000".parse().unwrap()));
        let a: PeerAddr = "[::1]:7000".parse().unwrap();
        assert_eq!(a.socket_addr(), Some("[::1]:7000".parse().unwrap()));
        assert_eq!(a.to_string(), "[::1]:7000");
        // Display and FromStr round-trip, and so does serde.
        for s in ["h1:1", "127.0.0.1:9", "[fe80::1]:65535", "a_b.c:2"] {
            let a: PeerAddr = s.parse().unwrap();
            assert_eq!(a.to_string().parse::<PeerAddr>().unwrap(), a);
            let j = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<PeerAddr>(&j).unwrap(), a);
        }
    }

    #[test]
    fn a_value_that_is_no_peer_address_says_why() {
        for (s, why) in [
            ("h1", "no port"),
            ("h1:", "the port must be"),
            ("h1:70000", "the port must be"),
            ("h1:0", "port 0"),
            ("127.0.0.1:0", "port 0"),
            (":7000", "no host"),
            ("::1:7000", "IPv6"),
            ("[::1:7000", "IPv6"),
            ("bad host:1", "only letters"),
            ("-h:1", "start nor end"),
            ("a..b:1", "labels have 1 to 63"),
            ("300.1.1.1:7000", "IPv4"),
        ] {
            let e = s.parse::<PeerAddr>().unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(s), "{s}: {e}");
        }
    }

    #[test]
    fn listen_addresses_take_a_socket_address_or_a_name_looked_up_once() {
        assert_eq!(
            listen_addr("0.0.0.0:0").unwrap(),
            "0.0.0.0:0".parse::<SocketAddr>().unwrap()
        );
        let a = listen_addr("localhost:7000").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 7000);
        for (s, why) in [
            ("7000", "not HOST:PORT"),
            ("h:x", "the port must be"),
            ("bad host:1", "only letters"),
        ] {
            let e = listen_addr(s).unwrap_err();
            assert!(e.contains(why) && e.contains(s), "{s}: {e}");
        }
    }

    #[test]
    fn addresses_resolve_without_a_lookup_and_names_by_the_system() {
        let a: PeerAddr = "127.0.0.3:5".parse().unwrap();
        assert_eq!(a.resolve().unwrap(), vec![a.socket_addr().unwrap()]);
        // `localhost` is in every system's hosts file.
        let a: PeerAddr = "localhost:5".parse().unwrap();
        let got = a.resolve().unwrap();
        assert!(!got.is_empty());
        assert!(got.iter().all(|s| s.ip().is_loopback() && s.port() == 5));
    }
}

//! The names this server answers to, checked on every request before it is
//! routed: the defence against DNS rebinding.
//!
//! A page on a name its author controls can make that name resolve to
//! `127.0.0.1` and then talk to a loopback server as its own origin: the
//! browser sends `Host` and `Origin` with the attacker's name, both
//! consistent with each other. So neither is compared with the other;
//! both are compared with a list of what names this server: the loopback
//! names and addresses with the listening port, the listening address
//! itself, and the names the operator allows (a reverse proxy's).
//!
//! An address literal is never a rebinding (a browser sends one only when
//! it connected to that address, so the page's origin *is* this server),
//! which is why a server listening on every address (`0.0.0.0`, with a
//! token) answers to any address literal with its port.

use std::net::{IpAddr, SocketAddr};

use reflexr::{Error, Result};

/// What names this server.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    listen: SocketAddr,
    /// Names the operator allows, lower-cased, with the port they must
    /// carry (none: any port, or none at all).
    allowed: Vec<(String, Option<u16>)>,
}

/// A `Host` value (or an origin's authority) taken apart.
struct Authority<'a> {
    host: &'a str,
    port: Option<u16>,
}

fn split(authority: &str) -> Option<Authority<'_>> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (inside, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || "/@?#[]".contains(c)) {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    Some(Authority { host, port })
}

impl Hosts {
    /// The names of a server listening on `listen`, plus `allowed`
    /// (`name` for any port, `name:port` for that port only).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an entry that is not a host name or address.
    pub fn new(listen: SocketAddr, allowed: &[String]) -> Result<Hosts> {
        let mut list = Vec::with_capacity(allowed.len());
        for entry in allowed {
            let parsed = split(entry.trim()).ok_or_else(|| {
                Error::invalid(
                    "allow_host",
                    format!("{entry:?} is not a host name or address (with an optional :port)"),
                )
            })?;
            list.push((parsed.host.to_ascii_lowercase(), parsed.port));
        }
        Ok(Hosts {
            listen,
            allowed: list,
        })
    }

    /// Whether `authority` (a `Host` header's value, or an origin's
    /// `host[:port]`) names this server. An authority without a port
    /// means port 80, as for `http://`.
    pub fn allows(&self, authority: &str, default_port: u16) -> bool {
        let Some(a) = split(authority) else {
            return false;
        };
        let host = a.host.to_ascii_lowercase();
        let allowed = self
            .allowed
            .iter()
            .any(|(name, port)| *name == host && port.is_none_or(|p| Some(p) == a.port));
        if allowed {
            return true;
        }
        if a.port.unwrap_or(default_port) != self.listen.port() {
            return false;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => {
                ip.is_loopback() || ip == self.listen.ip() || self.listen.ip().is_unspecified()
            }
            Err(_) => host == "localhost",
        }
    }

    /// Whether `origin` (an `Origin` header's value) is a page of this
    /// server: `http://` or `https://` and an authority [`Hosts::allows`].
    pub fn allows_origin(&self, origin: &str) -> bool {
        if let Some(authority) = origin.strip_prefix("http://") {
            self.allows(authority, 80)
        } else if let Some(authority) = origin.strip_prefix("https://") {
            self.allows(authority, 443)
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, allowed: &[&str]) -> Hosts {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        Hosts::new(listen.parse().unwrap(), &allowed).unwrap()
    }

    #[test]
    fn a_loopback_server_answers_to_its_loopback_names_with_its_port_only() {
        let h = hosts("127.0.0.1:7878", &[]);
        for ok in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LocalHost:7878",
            "[::1]:7878",
            "127.0.0.2:7878",
        ] {
            assert!(h.allows(ok, 80), "{ok}");
        }
        for refused in [
            "evil.example:7878",
            "evil.example",
            "localhost:7879",
            "localhost",
            "127.0.0.1",
            "10.0.0.1:7878",
            "localhost.evil.example:7878",
            "",
            "localhost:",
            "localhost:x",
            "[::1",
            "user@localhost:7878",
        ] {
            assert!(!h.allows(refused, 80), "{refused}");
        }
        assert!(h.allows_origin("http://localhost:7878"));
        assert!(h.allows_origin("http://127.0.0.1:7878"));
        assert!(!h.allows_origin("http://evil.example:7878"));
        assert!(!h.allows_origin("null"));
        assert!(!h.allows_origin("file://localhost:7878"));
    }

    #[test]
    fn an_allowed_name_matches_with_any_port_or_only_the_port_it_names() {
        let h = hosts(
            "127.0.0.1:7878",
            &["Admin.Example.com", "other.example:8443"],
        );
        assert!(h.allows("admin.example.com", 80));
        assert!(h.allows("admin.example.com:9000", 80));
        assert!(h.allows_origin("https://admin.example.com"));
        assert!(h.allows("other.example:8443", 80));
        assert!(!h.allows("other.example", 80));
        assert!(!h.allows("evil.example:7878", 80));
        assert!(Hosts::new("127.0.0.1:1".parse().unwrap(), &["a b".into()]).is_err());
        assert!(Hosts::new("127.0.0.1:1".parse().unwrap(), &["".into()]).is_err());
    }

    #[test]
    fn a_server_on_every_address_answers_to_any_address_literal_but_not_to_names() {
        let h = hosts("0.0.0.0:7878", &[]);
        assert!(h.allows("192.168.1.5:7878", 80));
        assert!(h.allows("[fe80::1]:7878", 80));
        assert!(!h.allows("192.168.1.5:7879", 80));
        assert!(!h.allows("myhost:7878", 80));
        let port_80 = hosts("127.0.0.1:80", &[]);
        assert!(port_80.allows("localhost", 80));
        assert!(port_80.allows_origin("http://localhost"));
        assert!(!port_80.allows_origin("https://localhost"));
    }
}

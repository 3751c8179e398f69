//! `cudaleak run --pushgateway URL`: each process's final figures pushed to
//! a Prometheus Pushgateway, the engine's way for jobs that end before a
//! scrape. Plain HTTP (`http://HOST[:PORT][/PREFIX]`), one PUT per process
//! to its group (job and rank, or job and instance), each bounded by
//! [`TIMEOUT`]; a push that fails gives one warning for the run, and the
//! gate's verdict never depends on it.

use cudaleak_core::metrics::{push_path, render, sample_of_report};
use cudaleak_core::report::render::escape;
use cudaleak_core::report::Report;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connecting, sending and waiting for the answer, each.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The parts of an `http://` URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    host: String,
    port: u16,
    prefix: String,
}

/// Checks `--pushgateway` before the command runs: a bad URL is bad input.
pub(super) fn parse_url(url: &str) -> Result<Target, String> {
    let bad = |why: &str| format!("--pushgateway {url:?}: {why}");
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("expected http://HOST[:PORT][/PATH] (https is not supported)"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    // An IPv6 address is written in brackets ([::1]:9091).
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| bad("no ']' after the IPv6 address"))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or_else(|| bad("expected ':' after ']'"))?),
            ),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad(&format!("bad port {p:?}")))?,
        None => 9091,
    };
    if host.is_empty()
        || host.contains(':') != authority.starts_with('[')
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad("no host"));
    }
    let prefix = path.trim_end_matches('/');
    Ok(Target {
        host: host.to_string(),
        port,
        prefix: if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        },
    })
}

impl Target {
    /// The Host header's value: an IPv6 address in brackets again.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The job label of the pushed figures: as the library takes it from the
/// environment (`run`'s here), else `cudaleak`.
fn job() -> String {
    cudaleak_core::metrics::job_of(|n| std::env::var(n).ok()).unwrap_or_else(|| "cudaleak".into())
}

/// Why a push failed: nobody to talk to (the others are not tried), or an
/// answer that was not a success.
enum PushError {
    Unreachable(String),
    Refused(String),
}

fn put(t: &Target, path: &str, body: &[u8]) -> Result<(), PushError> {
    let addrs: Vec<_> = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| PushError::Unreachable(e.to_string()))?
        .collect();
    let mut last = String::from("no address");
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e.to_string(),
        }
    }
    let mut s = stream.ok_or(PushError::Unreachable(last))?;
    let refused = |e: std::io::Error| PushError::Refused(e.to_string());
    s.set_read_timeout(Some(TIMEOUT)).map_err(refused)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(refused)?;
    let head = format!(
        "PUT {}{path} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        t.prefix,
        t.authority(),
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .map_err(refused)?;
    let mut answer = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut answer);
    let status = String::from_utf8_lossy(&answer);
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code.starts_with('2') {
        Ok(())
    } else {
        let line = status.lines().next().unwrap_or("no answer");
        Err(PushError::Refused(format!("answered {line:?}")))
    }
}

/// Pushes each final report's figures; returns how many were pushed. A
/// gateway nobody answers at is given up on after the first try, so that
/// a job of many ranks does not wait for each.
pub(super) fn push(t: &Target, finals: &[Report], top: usize) -> usize {
    let job = job();
    let mut pushed = 0;
    let mut warned = false;
    for r in finals {
        let sample = sample_of_report(r, Some(job.clone()), top);
        let path = push_path(&job, r.rank, &sample.labels.host, r.pid);
        let (why, give_up) = match put(t, &path, render(&sample).as_bytes()) {
            Ok(()) => {
                pushed += 1;
                continue;
            }
            Err(PushError::Unreachable(e)) => (e, true),
            Err(PushError::Refused(e)) => (e, false),
        };
        if !warned {
            warned = true;
            eprintln!(
                "cudaleak: could not push to the Pushgateway at {}: {}; the figures are in the reports",
                escape(&t.authority()),
                escape(&why)
            );
        }
        if give_up {
            break;
        }
    }
    pushed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("http://gw.example:9091/prefix/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("gw.example", 9091, "/prefix")
        );
        let t = parse_url("http://127.0.0.1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("127.0.0.1", 9091, "")
        );
        let t = parse_url("http://[::1]:8080").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.authority().as_str()),
            ("::1", 8080, "[::1]:8080")
        );
        let t = parse_url("http://[::1]").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9091));
        assert!(parse_url("http://::1").is_err());
        assert!(parse_url("http://[::1").is_err());
        assert!(parse_url("https://gw:9091").is_err());
        assert!(parse_url("http://gw:port").is_err());
        assert!(parse_url("http://:9091").is_err());
    }
}

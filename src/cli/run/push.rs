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
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("--pushgateway {url:?}: expected http://HOST[:PORT][/PATH] (https is not supported)")
    })?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("--pushgateway {url:?}: bad port {p:?}"))?,
        ),
        _ => (authority, 9091),
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("--pushgateway {url:?}: no host"));
    }
    let prefix = path.trim_end_matches('/');
    Ok(Target {
        host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
        port,
        prefix: if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        },
    })
}

/// The job label of the pushed figures: `CUDALEAK_JOB`, else torchrun's or
/// SLURM's id for the job as `run` sees them, else `cudaleak`.
fn job() -> String {
    ["CUDALEAK_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "cudaleak".into())
}

fn put(t: &Target, path: &str, body: &[u8]) -> Result<(), String> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    let head = format!(
        "PUT {}{path} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        t.prefix,
        t.host,
        t.port,
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut answer);
    let status = String::from_utf8_lossy(&answer);
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code.starts_with('2') {
        Ok(())
    } else {
        let line = status.lines().next().unwrap_or("no answer");
        Err(format!("answered {line:?}"))
    }
}

/// Pushes each final report's figures; returns how many were pushed.
pub(super) fn push(t: &Target, finals: &[Report], top: usize) -> usize {
    let job = job();
    let mut pushed = 0;
    let mut warned = false;
    for r in finals {
        let sample = sample_of_report(r, Some(job.clone()), top);
        let path = push_path(&job, r.rank, &sample.labels.host, r.pid);
        match put(t, &path, render(&sample).as_bytes()) {
            Ok(()) => pushed += 1,
            Err(e) if !warned => {
                warned = true;
                eprintln!(
                    "cudaleak: could not push to the Pushgateway at {}:{}: {}; the figures are in the reports",
                    escape(&t.host),
                    t.port,
                    escape(&e)
                );
            }
            Err(_) => {}
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
        assert_eq!((t.host.as_str(), t.port), ("::1", 8080));
        assert!(parse_url("https://gw:9091").is_err());
        assert!(parse_url("http://gw:port").is_err());
        assert!(parse_url("http://:9091").is_err());
    }
}

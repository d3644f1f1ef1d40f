//! Whether each mirror follows its upstream: what `/readyz` answers for a mirror, and the
//! `runnel_mirror_connected` gauge. A mirror is ready once every upstream it follows has
//! served it a replication session, and stays ready through a reconnect shorter than the
//! grace below: a session that ends to join again (a rebuilt stream, a replaced snapshot) or an
//! upstream's restart does not take it out of rotation.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a mirror that has followed its upstream may be without a session before it is no
/// longer ready.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(10);

const CONNECTED_GAUGE: &str = "runnel_mirror_connected";

/// The session state of each `--mirror-from` target, by its URL.
#[derive(Default)]
pub struct MirrorHealth {
    targets: Mutex<BTreeMap<String, Target>>,
}

#[derive(Clone, Debug)]
struct Target {
    connected: bool,
    /// When its current (or last) session began.
    joined_at: Instant,
    /// Since when it has been without a working session: a session that fails within the
    /// grace of joining (a join the upstream refuses, again and again) does not move it.
    since: Instant,
    /// It has had a session since the server started.
    ever_connected: bool,
    /// Why its last session failed, or could not start.
    last_error: Option<String>,
}

impl MirrorHealth {
    /// Health for `urls`, none of them followed yet.
    pub fn new(urls: &[String], now: Instant) -> MirrorHealth {
        let targets = urls
            .iter()
            .map(|url| {
                metrics::gauge!(CONNECTED_GAUGE, "upstream" => url.clone()).set(0.0);
                let target = Target {
                    connected: false,
                    joined_at: now,
                    since: now,
                    ever_connected: false,
                    last_error: None,
                };
                (url.clone(), target)
            })
            .collect();
        MirrorHealth {
            targets: Mutex::new(targets),
        }
    }

    /// The upstream at `url` serves this mirror a session (it took the join).
    pub(super) fn connected(&self, url: &str, now: Instant) {
        self.update(url, |target| {
            target.joined_at = now;
            target.connected = true;
            target.ever_connected = true;
            target.last_error = None;
        });
        metrics::gauge!(CONNECTED_GAUGE, "upstream" => url.to_string()).set(1.0);
    }

    /// The session with `url` ended, or could not start; `error` says why when it failed.
    pub(super) fn disconnected(&self, url: &str, error: Option<String>, now: Instant) {
        self.update(url, |target| {
            let lasted = now.duration_since(target.joined_at) >= RECONNECT_GRACE;
            if target.connected && (error.is_none() || lasted) {
                target.since = now;
            }
            target.connected = false;
            if error.is_some() {
                target.last_error = error;
            }
        });
        metrics::gauge!(CONNECTED_GAUGE, "upstream" => url.to_string()).set(0.0);
    }

    fn update(&self, url: &str, change: impl FnOnce(&mut Target)) {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(target) = targets.get_mut(url) {
            change(target);
        }
    }

    /// Why the mirror is not ready at `now`, one line per upstream it does not follow: never
    /// followed since start, or without a session for longer than [`RECONNECT_GRACE`]. Empty
    /// when it is ready.
    pub fn problems(&self, now: Instant) -> Vec<String> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets
            .iter()
            .filter(|(_, t)| {
                !t.connected && (!t.ever_connected || now.duration_since(t.since) > RECONNECT_GRACE)
            })
            .map(|(url, t)| {
                let state = if t.ever_connected {
                    format!("no session for {}s", now.duration_since(t.since).as_secs())
                } else {
                    "not followed yet".to_string()
                };
                match &t.last_error {
                    Some(error) => format!("mirror of {url}: {state}: {error}"),
                    None => format!("mirror of {url}: {state}"),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://upstream:1/docs";

    fn health(now: Instant) -> MirrorHealth {
        MirrorHealth::new(&[URL.to_string()], now)
    }

    #[test]
    fn a_mirror_is_not_ready_until_its_upstream_serves_it() {
        let start = Instant::now();
        let health = health(start);
        assert_eq!(
            health.problems(start),
            ["mirror of http://upstream:1/docs: not followed yet"]
        );
        health.disconnected(URL, Some("connection refused".into()), start);
        assert_eq!(
            health.problems(start + Duration::from_secs(60)),
            ["mirror of http://upstream:1/docs: not followed yet: connection refused"]
        );
        health.connected(URL, start + Duration::from_secs(61));
        assert!(health.problems(start + Duration::from_secs(61)).is_empty());
    }

    #[test]
    fn a_mirror_stays_ready_through_a_reconnect_within_the_grace() {
        let start = Instant::now();
        let health = health(start);
        health.connected(URL, start);
        let lost = start + Duration::from_secs(100);
        health.disconnected(URL, Some("reset".into()), lost);
        assert!(health.problems(lost + RECONNECT_GRACE).is_empty());
        let late = lost + RECONNECT_GRACE + Duration::from_secs(1);
        assert_eq!(
            health.problems(late),
            ["mirror of http://upstream:1/docs: no session for 11s: reset"]
        );
        health.connected(URL, late);
        assert!(health.problems(late).is_empty());
    }

    #[test]
    fn joins_the_upstream_refuses_at_once_do_not_keep_a_mirror_ready() {
        let start = Instant::now();
        let health = health(start);
        for second in 0..30 {
            let at = start + Duration::from_secs(second);
            health.connected(URL, at);
            health.disconnected(URL, Some("not served".into()), at);
        }
        let problems = health.problems(start + Duration::from_secs(30));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].ends_with("no session for 30s: not served"),
            "{problems:?}"
        );
    }

    #[test]
    fn an_ended_session_keeps_the_reason_the_one_before_failed() {
        let start = Instant::now();
        let health = health(start);
        health.disconnected(URL, Some("refused".into()), start);
        health.disconnected(URL, None, start);
        assert!(health.problems(start)[0].ends_with(": refused"));
    }
}

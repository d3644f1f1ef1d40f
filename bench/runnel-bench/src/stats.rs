//! HDR histograms per worker, merged at the end, printed as a table and written as JSON.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// Latencies in microseconds, 1 µs .. 1 hour, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// What one worker measured for one metric.
///
/// Samples wait in a small buffer and reach the histogram in batches. A histogram with these
/// bounds is about 180 KB, so 1,000 subscribers each recording into their own one sample at a
/// time missed the cache on every delivery: 6% of the client's time in `fanout`, which adds to
/// the latency it measures.
pub struct Recorder {
    hist: Histogram<u64>,
    pending: Vec<u64>,
    pub errors: u64,
    pub bytes: u64,
    pub first_errors: Vec<String>,
}

/// Samples buffered before they are folded into the histogram.
const PENDING_SAMPLES: usize = 4096;

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            hist: new_hist(),
            pending: Vec::new(),
            errors: 0,
            bytes: 0,
            first_errors: Vec::new(),
        }
    }
}

impl Recorder {
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_nanos() / 1000).max(1) as u64;
        self.pending.push(us);
        if self.pending.len() >= PENDING_SAMPLES {
            self.fold_pending();
        }
    }
    fn fold_pending(&mut self) {
        for us in self.pending.drain(..) {
            self.hist.saturating_record(us);
        }
    }
    /// How many samples were recorded.
    pub fn count(&self) -> u64 {
        self.hist.len() + self.pending.len() as u64
    }
    pub fn error(&mut self, what: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_errors.len() < 3 {
            self.first_errors.push(what.to_string());
        }
    }
    pub fn merge(&mut self, other: Recorder) {
        if !other.hist.is_empty() {
            self.hist.add(&other.hist).expect("same bounds");
        }
        for us in other.pending {
            self.hist.saturating_record(us);
        }
        self.errors += other.errors;
        self.bytes += other.bytes;
        for e in other.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(e);
            }
        }
    }
    /// Every sample recorded so far, buffered ones included.
    fn histogram(&self) -> Cow<'_, Histogram<u64>> {
        if self.pending.is_empty() {
            return Cow::Borrowed(&self.hist);
        }
        let mut all = self.hist.clone();
        for &us in &self.pending {
            all.saturating_record(us);
        }
        Cow::Owned(all)
    }
}

/// The measuring window: `[start + warmup, start + warmup + duration)`.
#[derive(Clone, Copy)]
pub struct Window {
    pub measure_from: Instant,
    pub end: Instant,
}

impl Window {
    pub fn new(warmup: Duration, duration: Duration) -> Window {
        let start = Instant::now();
        Window {
            measure_from: start + warmup,
            end: start + warmup + duration,
        }
    }
    pub fn measuring(&self, at: Instant) -> bool {
        at >= self.measure_from && at < self.end
    }
    pub fn done(&self) -> bool {
        Instant::now() >= self.end
    }
    pub fn secs(&self) -> f64 {
        (self.end - self.measure_from).as_secs_f64()
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub metric: String,
    pub count: u64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sample_errors: Vec<String>,
}

impl Row {
    pub fn from(metric: &str, r: &Recorder, secs: f64) -> Row {
        let h = r.histogram();
        let ms = |us: u64| us as f64 / 1000.0;
        let count = h.len();
        let empty = count == 0;
        Row {
            metric: metric.to_string(),
            count,
            ops_per_sec: count as f64 / secs,
            p50_ms: if empty {
                0.0
            } else {
                ms(h.value_at_quantile(0.50))
            },
            p90_ms: if empty {
                0.0
            } else {
                ms(h.value_at_quantile(0.90))
            },
            p99_ms: if empty {
                0.0
            } else {
                ms(h.value_at_quantile(0.99))
            },
            p999_ms: if empty {
                0.0
            } else {
                ms(h.value_at_quantile(0.999))
            },
            max_ms: if empty { 0.0 } else { ms(h.max()) },
            mean_ms: if empty { 0.0 } else { h.mean() / 1000.0 },
            errors: r.errors,
            mb_per_sec: if r.bytes > 0 {
                Some(r.bytes as f64 / secs / 1e6)
            } else {
                None
            },
            records_per_sec: None,
            sample_errors: r.first_errors.clone(),
        }
    }
}

#[derive(Serialize)]
pub struct Report {
    pub scenario: String,
    pub api: String,
    pub target: String,
    pub label: String,
    pub streams: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub client_threads: usize,
    pub unix_time: u64,
    pub params: serde_json::Value,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn print(&self) {
        println!(
            "\n{} · api={} · target={} · n={} · {:.0}s measured{}",
            self.scenario,
            self.api,
            self.target,
            self.streams,
            self.duration_s,
            if self.label.is_empty() {
                String::new()
            } else {
                format!(" · {}", self.label)
            }
        );
        println!(
            "{:<10} {:>10} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "metric", "count", "ops/s", "p50 ms", "p90 ms", "p99 ms", "p999 ms", "max ms", "errors"
        );
        for r in &self.rows {
            println!(
                "{:<10} {:>10} {:>11.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8}",
                r.metric,
                r.count,
                r.ops_per_sec,
                r.p50_ms,
                r.p90_ms,
                r.p99_ms,
                r.p999_ms,
                r.max_ms,
                r.errors
            );
            if let Some(rps) = r.records_per_sec {
                println!("{:<10} records/s {:.0}", "", rps);
            }
            if let Some(mbs) = r.mb_per_sec {
                println!("{:<10} MB/s {:.1}", "", mbs);
            }
            for e in &r.sample_errors {
                println!("{:<10} error: {}", "", e);
            }
        }
    }
}

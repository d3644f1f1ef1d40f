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
/// the latency it measures. The histogram is made only when the buffer first fills: 10,000
/// writers each starting with their own zeroed 180 KB (1.8 GB of fresh memory) kept the client's
/// core busy zeroing pages, and the writers waited.
#[derive(Default)]
pub struct Recorder {
    hist: Option<Histogram<u64>>,
    pending: Vec<u64>,
    pub errors: u64,
    pub bytes: u64,
    pub first_errors: Vec<String>,
}

/// Samples buffered before they are folded into the histogram.
const PENDING_SAMPLES: usize = 4096;

impl Recorder {
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_nanos() / 1000).max(1) as u64;
        self.pending.push(us);
        if self.pending.len() >= PENDING_SAMPLES {
            self.fold_pending();
        }
    }
    fn fold_pending(&mut self) {
        let hist = self.hist.get_or_insert_with(new_hist);
        for us in self.pending.drain(..) {
            hist.saturating_record(us);
        }
    }
    /// How many samples were recorded.
    pub fn count(&self) -> u64 {
        self.hist.as_ref().map_or(0, Histogram::len) + self.pending.len() as u64
    }
    pub fn error(&mut self, what: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_errors.len() < 3 {
            self.first_errors.push(what.to_string());
        }
    }
    pub fn merge(&mut self, other: Recorder) {
        if let Some(theirs) = other.hist.filter(|h| !h.is_empty()) {
            match &mut self.hist {
                Some(ours) => ours.add(&theirs).expect("same bounds"),
                None => self.hist = Some(theirs),
            }
        }
        self.pending.extend(other.pending);
        if self.pending.len() >= PENDING_SAMPLES {
            self.fold_pending();
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
        if self.pending.is_empty()
            && let Some(hist) = &self.hist
        {
            return Cow::Borrowed(hist);
        }
        let mut all = self.hist.clone().unwrap_or_else(new_hist);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder_of(samples_us: impl IntoIterator<Item = u64>) -> Recorder {
        let mut r = Recorder::default();
        for us in samples_us {
            r.record(Duration::from_micros(us));
        }
        r
    }

    #[test]
    fn a_recorder_with_few_samples_makes_no_histogram_and_loses_none() {
        let few = recorder_of([1_000, 2_000, 3_000]);
        assert!(few.hist.is_none());
        let row = Row::from("x", &few, 1.0);
        assert_eq!(row.count, 3);
        // Three significant digits: the histogram's values are within 0.1% of the samples.
        assert!((row.max_ms - 3.0).abs() < 0.003, "{}", row.max_ms);
    }

    #[test]
    fn merged_recorders_count_every_sample_buffered_or_folded() {
        let mut total = recorder_of((1..=5_000).map(|i| i * 10));
        assert!(total.hist.is_some());
        total.merge(recorder_of([1_000_000]));
        total.merge(recorder_of([]));
        let mut fresh = Recorder::default();
        fresh.merge(recorder_of([7, 8]));
        total.merge(fresh);
        let row = Row::from("x", &total, 1.0);
        assert_eq!(row.count, 5_003);
        assert!((row.max_ms - 1_000.0).abs() < 1.0, "{}", row.max_ms);
    }
}

//! `/metrics` in the Prometheus text format.

use std::fmt::Write as _;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Latency buckets, in seconds, for request and sync histograms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 30.0,
];
/// Buckets for the number of appends one group commit carries.
pub const GROUP_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Installs the process-wide Prometheus recorder the `metrics` macros report to.
pub fn install_recorder() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let installed = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("runnel_commit_group_appends".into()),
                GROUP_BUCKETS,
            )
        })
        .and_then(|b| b.install_recorder());
    match installed {
        Ok(handle) => {
            describe_recorded_metrics();
            Some(handle)
        }
        Err(error) => {
            tracing::warn!(%error, "metrics recorder not installed; /metrics shows gauges only");
            None
        }
    }
}

/// Gives every metric the recorder keeps its help text, and shows those that count failures or
/// backlogs from the start, at zero: an alert on them must not wait for the first occurrence.
fn describe_recorded_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "runnel_http_requests_total",
        "HTTP requests answered, by route template, method and status."
    );
    describe_histogram!(
        "runnel_http_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's head to its response's head, by route template and method."
    );
    describe_histogram!(
        "runnel_commit_group_appends",
        "Appends one group commit carried to disk."
    );
    describe_histogram!(
        "runnel_commit_seconds",
        Unit::Seconds,
        "Time one group commit took, its fsync included."
    );
    describe_counter!(
        "runnel_commit_failures_total",
        "Group commits that failed; their appends were refused with 5xx and nothing was acknowledged."
    );
    describe_counter!(
        "runnel_trim_deleted_values_total",
        "Stored values deleted by trims, retention and stream deletes."
    );
    describe_gauge!(
        "runnel_trim_pending_streams",
        "Streams with trimmed records not yet deleted from storage."
    );
    describe_gauge!(
        "runnel_replication_subscriptions",
        "Replication subscriptions (a stream or bucket a replica follows) being served."
    );
    describe_gauge!(
        "runnel_replication_streams_followed",
        "Streams the replication subscriptions being served follow."
    );
    describe_gauge!(
        "runnel_mirror_connected",
        "1 while this mirror has a replication session with the upstream (label upstream), else 0."
    );
    metrics::counter!("runnel_commit_failures_total").absolute(0);
    metrics::counter!("runnel_trim_deleted_values_total").absolute(0);
    metrics::gauge!("runnel_trim_pending_streams").set(0.0);
}

pub async fn metrics(app: &AppState) -> Response {
    let (streams, buckets, cache_bytes) = app.service.counts();
    let mut out = app
        .metrics
        .as_ref()
        .map(|handle| handle.render())
        .unwrap_or_default();
    gauge(
        &mut out,
        "runnel_live_readers",
        "Live readers (long-polls, SSE, S2S read sessions) being served.",
        app.live_reader_count(),
    );
    gauge(
        &mut out,
        "runnel_stream_bytes",
        "Bytes of stream data retained (appended and not yet trimmed), across all streams.",
        usize::try_from(app.service.retained_bytes()).unwrap_or(usize::MAX),
    );
    gauge(
        &mut out,
        "runnel_streams",
        "Streams the server holds (including soft-deleted ones kept for forks).",
        streams,
    );
    gauge(
        &mut out,
        "runnel_buckets",
        "Buckets (S2 basins) the server holds.",
        buckets,
    );
    gauge(
        &mut out,
        "runnel_tail_cache_bytes",
        "Memory the hot tail caches hold: records with their bodies and headers.",
        cache_bytes,
    );
    gauge(
        &mut out,
        "runnel_read_memory_bytes",
        "Record bytes that read responses hold while their clients take them.",
        app.service.read_memory_held(),
    );
    gauge(
        &mut out,
        "runnel_shared_body_bytes",
        "Catch-up bodies kept for the next readers of the same range.",
        app.service.shared_body_bytes(),
    );
    gauge(
        &mut out,
        "runnel_tasks",
        "Tasks alive in the server's async runtime: one per connection, live reader and \
         replication pump, among others. One that only grows is a leak.",
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
    );
    if let Some(process) = super::process_metrics::read() {
        render_process(&mut out, &process);
    }
    let lags = app.service.replication_lags();
    for (name, help, pick) in [
        (
            "runnel_replication_lag_records",
            "Records a mirrored stream is behind its upstream.",
            0,
        ),
        (
            "runnel_replication_lag_seconds",
            "Age of a lagging mirror's newest record (0 when caught up).",
            1,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (stream, upstream, records, seconds) in &lags {
            let value = if pick == 0 { records } else { seconds };
            let _ = writeln!(
                out,
                "{name}{{stream=\"{}\",upstream=\"{}\"}} {value}",
                label(stream),
                label(upstream)
            );
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// The process's figures, as Prometheus's client libraries name them.
fn render_process(out: &mut String, process: &super::process_metrics::ProcessFigures) {
    let mut sample = |name: &str, kind: &str, help: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    sample(
        "process_cpu_seconds_total",
        "counter",
        "CPU time the process has used, user and system, in seconds.",
        &process.cpu_seconds,
    );
    sample(
        "process_resident_memory_bytes",
        "gauge",
        "Memory the process holds in RAM (its resident set).",
        &process.resident_bytes,
    );
    sample(
        "process_virtual_memory_bytes",
        "gauge",
        "The process's virtual memory size.",
        &process.virtual_bytes,
    );
    sample(
        "process_start_time_seconds",
        "gauge",
        "When the process started, in seconds since the Unix epoch.",
        &process.start_time_seconds,
    );
    if let Some(open) = process.open_fds {
        sample(
            "process_open_fds",
            "gauge",
            "File descriptors the process has open.",
            &open,
        );
    }
    if let Some(max) = process.max_fds {
        sample(
            "process_max_fds",
            "gauge",
            "The most file descriptors the process may open (its soft limit).",
            &max,
        );
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: usize) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// A label value with Prometheus's escapes for backslash, double quote and newline.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

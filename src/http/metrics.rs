//! `/metrics` in the Prometheus text format.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;

pub async fn metrics(State(app): State<AppState>) -> Response {
    let (streams, buckets, cache_bytes) = app.service.counts();
    let mut out = String::new();
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
        "Record bytes held in the hot tail caches.",
        cache_bytes,
    );
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

use std::sync::Arc;

use super::super::live::tests::app_over;
use super::*;
use crate::model::Offset;
use crate::service::StreamService;

/// A read of the service's stream `s` (three records) from its start, in `view`.
pub(in crate::http) async fn read_of_three_records(view: ReadView) -> (Arc<StreamService>, Read) {
    let (service, stream) = StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let read = Read {
        stream,
        start: Offset::START,
        view,
        max_records: None,
        client_cursor: None,
    };
    (service, read)
}

#[tokio::test]
async fn records_trimmed_under_an_sse_reader_end_its_response() {
    let (service, read) = read_of_three_records(ReadView::Canonical).await;
    let app = app_over(service.clone());
    let stream = read.stream.clone();
    let response = respond(&app, read);
    // The body is read once the response goes out: the trim passes its reader first.
    service.trim_for_test(&stream, 2).await;
    let body = axum::body::to_bytes(response.into_body(), usize::MAX);
    let body = tokio::time::timeout(std::time::Duration::from_secs(5), body).await;
    assert!(body.expect("it ends").unwrap().is_empty());
}

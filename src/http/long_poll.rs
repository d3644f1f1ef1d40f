//! Durable Streams long-poll reads: the records from the reader's offset as soon as there are
//! any, or 204 once the long-poll timeout passes with none. It renders one follow of the stream
//! (`docs/live-reads.md` has the table of what it answers to each event).

use axum::http::StatusCode;
use axum::response::Response;

use super::AppState;
use super::ds_view::{
    CACHE_HISTORIC, ChunkHead, Read, describe_chunk, etag_of, next_cursor, ok_with, render,
};
use super::error::{Handled, empty, set};
use crate::model::Offset;
use crate::model::wire::ds_body::shows_nothing;
use crate::service::{Chunks, Deletion, Event, Follow, FollowOptions, ReadChunk, StreamError};

/// What a long-poll answers with.
enum Answer {
    Records(ReadChunk),
    /// No records (the timeout passed, or the stream closed, with none): where the reader is.
    Nothing {
        at: Offset,
        closed: bool,
    },
}

pub async fn respond(app: &AppState, read: Read) -> Handled {
    let source = Chunks::from(read.start, read.max_records);
    let options = FollowOptions::live(app.config.long_poll_timeout);
    let mut follow = Follow::new(&app.service, read.stream.clone(), source, options);
    let answer = loop {
        let at = follow.source().at();
        match follow.next().await {
            Event::Records(chunk) => break Answer::Records(chunk),
            Event::CaughtUp(_) | Event::Shared(_) | Event::Changed(_) => {}
            Event::Idle | Event::Ended(_) => break Answer::Nothing { at, closed: false },
            Event::Closed => break Answer::Nothing { at, closed: true },
            // As a new request would be answered: 404 once removed, 410 while forks keep it.
            Event::Deleted(Deletion::Removed) => return Err(StreamError::NotFound.into()),
            Event::Deleted(Deletion::SoftDeleted) => return Err(StreamError::Gone.into()),
            Event::Gap { first } => return Err(StreamError::Retained { first }.into()),
            Event::Failed(e) => return Err(e.into()),
        }
    };
    Ok(match answer {
        Answer::Records(chunk) => records(&read, chunk),
        Answer::Nothing { at, closed } => nothing(
            &read,
            &ChunkHead {
                start: at,
                next: at,
                up_to_date: true,
                closed,
                first_shown: at.seq,
            },
        ),
    })
}

/// A long-poll's answer with records: 200 with them (cacheable like a catch-up read), or 204
/// when it shows none of them (only S2 command records).
fn records(read: &Read, mut chunk: ReadChunk) -> Response {
    let head = ChunkHead::of(&chunk);
    if shows_nothing(&chunk.records) {
        return nothing(read, &head);
    }
    let etag = etag_of(read, &head);
    let (content_type, body) = render(read, &chunk.records);
    let body = body.holding(std::mem::take(&mut chunk.lease));
    let mut response = ok_with(content_type, body);
    set(&mut response, "cache-control", CACHE_HISTORIC);
    // As on catch-up reads (base protocol §10.1): a cache may revalidate it.
    set(&mut response, "etag", &etag);
    finish(response, read, &head)
}

/// A long-poll's answer without data: 204, where the reader now stands.
fn nothing(read: &Read, head: &ChunkHead) -> Response {
    let mut response = empty(StatusCode::NO_CONTENT);
    set(&mut response, "cache-control", "no-store");
    finish(response, read, head)
}

fn finish(mut response: Response, read: &Read, head: &ChunkHead) -> Response {
    describe_chunk(&mut response, read, head);
    if !head.closed {
        set(
            &mut response,
            "stream-cursor",
            &next_cursor(read.client_cursor).to_string(),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::super::live::tests::app_over;
    use super::super::sse::tests::read_of_three_records;
    use super::*;
    use crate::model::records::ReadView;

    #[tokio::test]
    async fn records_trimmed_under_a_long_poll_answer_it_410() {
        let (service, read) = read_of_three_records(ReadView::Canonical).await;
        let app = app_over(service.clone());
        // Retention moves between the read's resolution and its first look at the stream.
        service.trim_for_test(&read.stream, 2).await;
        let answered = respond(&app, read).await;
        let uri = axum::http::Uri::from_static("/v1/stream/s");
        let response = answered.unwrap_or_else(|failure| failure.into_response_at(&uri));
        assert_eq!(response.status(), StatusCode::GONE);
    }
}

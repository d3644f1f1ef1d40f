//! Buckets: listing pages, and counting the streams of a bucket.

use std::sync::Arc;

use crate::service::tests::{create_text, one_text_stream};
use crate::service::{CreateRequest, ForkRequest, ServiceConfig, StreamService, WALKED_AT_ONCE};
use crate::storage::MemoryEngine;

#[tokio::test]
async fn a_listing_page_goes_on_past_streams_it_does_not_show() {
    let (service, _) = one_text_stream().await;
    service.create_bucket("pages", None, None).await.unwrap();
    for name in ["a", "b", "c", "d"] {
        service
            .create(create_text(&format!("/pages/{name}")))
            .await
            .unwrap();
    }
    // Deleted while a fork reads through it: kept, but not listed.
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "/pages/b".into(),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text("s-fork")
    };
    service.create(fork).await.unwrap();
    service.delete("/pages/b").await.unwrap();
    let page = |after: Option<&'static str>| {
        let listing = service
            .list_streams("pages", "", after, 1, |_| true)
            .unwrap();
        let ids: Vec<String> = listing.streams.into_iter().map(|s| s.stream_id).collect();
        (ids, listing.has_more)
    };
    assert_eq!(page(None), (vec!["a".to_string()], true));
    assert_eq!(page(Some("a")), (vec!["c".to_string()], true));
    assert_eq!(page(Some("c")), (vec!["d".to_string()], false));
}

#[tokio::test]
async fn a_bucket_count_walks_every_stream_of_its_bucket_and_no_other() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    for bucket in ["buck", "buck-2"] {
        service.create_bucket(bucket, None, None).await.unwrap();
    }
    let in_b = 2 * WALKED_AT_ONCE + 5;
    for n in 0..in_b {
        service
            .create(create_text(&format!("/buck/s{n:05}")))
            .await
            .unwrap();
    }
    service.create(create_text("/buck-2/other")).await.unwrap();
    assert_eq!(service.bucket_stream_count("buck", |_| true).unwrap(), in_b);
    assert_eq!(
        service
            .bucket_stream_count("buck", |id| id.ends_with('7'))
            .unwrap(),
        (0..in_b).filter(|n| n % 10 == 7).count()
    );
    assert_eq!(service.bucket_stream_count("buck-2", |_| true).unwrap(), 1);
}

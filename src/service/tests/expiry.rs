//! Streams with a TTL: what renews one, and the sweep that removes expired streams.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{create_text, text};
use crate::model::Offset;
use crate::service::{
    AppendRequest, CreateRequest, Position, ServiceConfig, StreamError, StreamService,
    WALKED_AT_ONCE,
};
use crate::storage::MemoryEngine;

#[tokio::test]
async fn only_accepted_reads_and_appends_renew_a_ttl() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    let with_ttl = |name: &str| CreateRequest {
        ttl_secs: Some(1),
        ..create_text(name)
    };
    service.create(with_ttl("rejected")).await.unwrap();
    service.create(with_ttl("accepted")).await.unwrap();
    service.create(with_ttl("snapshot-refused")).await.unwrap();
    let publish = |blob: &'static [u8]| {
        service.publish_snapshot(
            "snapshot-refused",
            Position::Offset(Offset::START),
            "text/plain".into(),
            Bytes::from_static(blob),
            None,
        )
    };
    publish(b"first").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let wrong_type = AppendRequest {
        content_type: Some("application/json"),
        ..text("{}")
    };
    assert!(matches!(
        service.append("rejected", wrong_type).await,
        Err(StreamError::ContentTypeMismatch)
    ));
    assert!(matches!(
        publish(b"another").await,
        Err(StreamError::Conflict(_))
    ));
    service.append("accepted", text("kept")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        matches!(
            service.find("rejected", false).await,
            Err(StreamError::NotFound)
        ),
        "a refused append does not keep the stream alive"
    );
    assert!(
        matches!(
            service.find("snapshot-refused", false).await,
            Err(StreamError::NotFound)
        ),
        "nor does a refused snapshot"
    );
    service.find("accepted", false).await.unwrap();
}

#[tokio::test]
async fn the_expiry_sweep_removes_expired_streams_past_a_batch_of_them_and_only_them() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    let expiring = WALKED_AT_ONCE + 300;
    for n in 0..expiring {
        let request = CreateRequest {
            ttl_secs: Some(1),
            ..create_text(&format!("ttl-{n:05}"))
        };
        service.create(request).await.unwrap();
    }
    for n in 0..20 {
        service
            .create(create_text(&format!("kept-{n}")))
            .await
            .unwrap();
    }
    assert_eq!(service.lock_registry().expiring.len(), expiring);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    service.sweep_expired().await;
    assert_eq!(
        service.counts().0,
        20,
        "only the streams without a TTL are left"
    );
    assert!(service.lock_registry().expiring.is_empty());
}

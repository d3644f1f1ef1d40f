//! Creating a stream: what a create asks for, what a bucket takes, what an existing stream makes
//! of a create of its name, and the new stream's metadata. One test per rule and per precedence
//! between two of them.

use bytes::Bytes;

use super::*;
use crate::model::ledger::testing::Fixture;

const NOW: i64 = 1_000;

const NO_ATTRS: Attrs = None;

fn ask() -> Ask<'static> {
    Ask {
        content_type: Some("text/plain"),
        ttl_secs: None,
        expires_at_ms: None,
        closed: false,
        attrs: &NO_ATTRS,
        cipher: None,
        mirror_of: None,
        s2_creation: None,
        s2_config: None,
        fork: None,
    }
}

fn source(content_type: &str) -> Inherited<'_> {
    Inherited {
        content_type,
        ttl_secs: Some(60),
        expires_at_ms: Some(NOW + 5_000),
    }
}

fn requested() -> RequestedConfig {
    RequestedConfig::resolve(ask(), None, NOW).unwrap()
}

// What a create asks for.

#[test]
fn a_fork_asking_for_another_media_type_is_refused_before_its_expiry_in_the_past() {
    let asked = Ask {
        content_type: Some("application/json"),
        expires_at_ms: Some(NOW - 1),
        ..ask()
    };
    assert_eq!(
        RequestedConfig::resolve(asked, Some(source("text/plain")), NOW),
        Err(Refusal::Conflict(Conflict::ForkContentType))
    );
}

#[test]
fn an_expiry_in_the_past_is_refused_except_on_a_mirror_which_copies_its_upstreams() {
    let past = Ask {
        expires_at_ms: Some(NOW),
        ..ask()
    };
    assert_eq!(
        RequestedConfig::resolve(past, None, NOW),
        Err(Refusal::ExpiresInThePast)
    );
    let mirror = Ask {
        mirror_of: Some("http://up:1"),
        ..past
    };
    let copied = RequestedConfig::resolve(mirror, None, NOW).unwrap();
    assert_eq!(copied.expires_at_ms, Some(NOW));
}

#[test]
fn a_fork_takes_its_sources_content_type_and_expiry_only_where_the_request_gives_none() {
    let silent = Ask {
        content_type: None,
        ..ask()
    };
    let inherited = RequestedConfig::resolve(silent, Some(source("text/plain")), NOW).unwrap();
    assert_eq!(inherited.content_type, "text/plain");
    assert_eq!(
        (inherited.ttl_secs, inherited.expires_at_ms),
        (Some(60), Some(NOW + 5_000))
    );
    // A TTL alone replaces both: the fork does not keep its source's expiry time beside it.
    let own_ttl = Ask {
        ttl_secs: Some(7),
        ..silent
    };
    let own = RequestedConfig::resolve(own_ttl, Some(source("text/plain")), NOW).unwrap();
    assert_eq!((own.ttl_secs, own.expires_at_ms), (Some(7), None));
}

#[test]
fn a_malformed_content_type_becomes_the_sources_or_the_default() {
    let malformed = Ask {
        content_type: Some("not a media type"),
        ..ask()
    };
    let plain = RequestedConfig::resolve(malformed, None, NOW).unwrap();
    assert_eq!(plain.content_type, content_type::DEFAULT_CONTENT_TYPE);
    let fork = RequestedConfig::resolve(malformed, Some(source("not a media type")), NOW);
    assert_eq!(fork.unwrap().content_type, "not a media type");
}

#[test]
fn a_repeated_fork_keeps_the_forks_own_content_type_and_expiry_where_the_request_gives_none() {
    let mut existing = StreamMeta {
        ttl_secs: Some(9),
        ..StreamMeta::new("/b/f", "application/json")
    };
    existing.expires_at_ms = None;
    let silent = Ask {
        content_type: None,
        ..ask()
    };
    let repeat = RequestedConfig::repeating_fork(silent, &existing, NOW).unwrap();
    assert_eq!(repeat.content_type, "application/json");
    assert_eq!(repeat.ttl_secs, Some(9));
    let given = RequestedConfig::repeating_fork(ask(), &existing, NOW).unwrap();
    assert_eq!(
        given.content_type, "text/plain",
        "what is given is compared"
    );
}

// A create of a name that is taken.

#[test]
fn a_repeated_create_reports_the_first_difference_content_type_ttl_expiry_closed_attrs_fork() {
    let mut existing = StreamMeta {
        ttl_secs: Some(60),
        expires_at_ms: Some(NOW + 1),
        closed: true,
        ..StreamMeta::new("/b/s", "text/plain")
    };
    existing.extra_mut().attrs = Some(serde_json::Map::from_iter([("title".into(), "t".into())]));
    existing.extra_mut().fork = Some(ForkOrigin {
        source_id: 1,
        source_name: "/b/src".into(),
        offset: Offset::START,
        sub_offset: 0,
    });
    // Each request differs from `existing` in every field from one on.
    let mut differs = RequestedConfig {
        content_type: "application/json".into(),
        ..requested()
    };
    assert_eq!(differs.mismatch(&existing), Some(Mismatch::ContentType));
    differs.content_type = "TEXT/PLAIN; charset=utf-8".into();
    assert_eq!(differs.mismatch(&existing), Some(Mismatch::Ttl));
    differs.ttl_secs = Some(60);
    assert_eq!(differs.mismatch(&existing), Some(Mismatch::ExpiresAt));
    differs.expires_at_ms = Some(NOW + 1);
    assert_eq!(differs.mismatch(&existing), Some(Mismatch::Closed));
    differs.closed = true;
    assert_eq!(differs.mismatch(&existing), Some(Mismatch::Attrs));
    differs.attrs = existing.extra().attrs.clone();
    assert_eq!(
        differs.mismatch(&existing),
        Some(Mismatch::ForkConfiguration)
    );
    differs.fork = Some(RequestedFork {
        source_name: "/b/src".into(),
        offset: None,
        sub_offset: 0,
    });
    assert_eq!(differs.mismatch(&existing), None);
}

#[test]
fn a_repeated_fork_compares_its_offset_only_when_named() {
    let mut existing = StreamMeta::new("/b/f", "text/plain");
    existing.extra_mut().fork = Some(ForkOrigin {
        source_id: 1,
        source_name: "src".into(),
        offset: Offset::new(1, 5),
        sub_offset: 0,
    });
    let want = |offset, sub_offset| RequestedConfig {
        fork: Some(RequestedFork {
            source_name: "src".into(),
            offset,
            sub_offset,
        }),
        ..requested()
    };
    assert_eq!(want(None, 0).mismatch(&existing), None);
    assert_eq!(want(Some(Offset::new(1, 5)), 0).mismatch(&existing), None);
    let other = Some(Mismatch::OtherFork);
    assert_eq!(want(Some(Offset::new(0, 0)), 0).mismatch(&existing), other);
    assert_eq!(want(Some(Offset::new(1, 5)), 2).mismatch(&existing), other);
}

fn recreate(
    f: &mut Fixture,
    requested: &RequestedConfig,
    expired: bool,
) -> Result<Recreated, Refusal> {
    f.ledger().apply(Recreate { requested, expired }, NOW)
}

#[test]
fn a_recreate_of_a_removed_stream_is_not_found_rather_than_a_conflict_with_its_forks() {
    let mut f = Fixture::text();
    f.removed = true;
    f.meta.soft_deleted = true;
    assert_eq!(recreate(&mut f, &requested(), true), Err(Refusal::NotFound));
}

#[test]
fn a_recreate_of_a_stream_kept_for_its_forks_conflicts_before_its_expiry_is_looked_at() {
    let mut f = Fixture::text();
    f.meta.soft_deleted = true;
    assert_eq!(
        recreate(&mut f, &requested(), true),
        Err(Refusal::Conflict(Conflict::DeletedForForks))
    );
}

#[test]
fn a_recreate_of_an_expired_stream_removes_it_before_comparing() {
    let mut f = Fixture::text();
    let differs = RequestedConfig {
        closed: true,
        ..requested()
    };
    assert_eq!(recreate(&mut f, &differs, true), Ok(Recreated::Expired));
    assert_eq!(
        recreate(&mut f, &differs, false),
        Err(Refusal::Conflict(Conflict::Exists(Mismatch::Closed)))
    );
    assert_eq!(recreate(&mut f, &requested(), false), Ok(Recreated::Repeat));
}

#[test]
fn an_expired_stream_removed_for_good_frees_the_name_and_one_kept_for_forks_holds_it() {
    assert_eq!(Removal::Hard.refusing_recreate(), Refusal::NotFound);
    assert_eq!(
        Removal::Soft.refusing_recreate(),
        Refusal::Conflict(Conflict::ExpiredForForks)
    );
}

// What a bucket takes.

fn bucket(deleting: bool, sealed: bool) -> BucketMeta {
    BucketMeta {
        created_ms: 0,
        s2_config: sealed.then(|| crate::model::s2::BasinConfig {
            stream_cipher: Some("aegis-256".into()),
            ..Default::default()
        }),
        s2_creation: None,
        deleting,
    }
}

fn admitted(
    meta: Option<&BucketMeta>,
    requested: &RequestedConfig,
    held: usize,
) -> Result<(), Refusal> {
    admit(meta.map(|m| ("b", m)), requested, Some(1), |_| held)
}

#[test]
fn a_missing_bucket_is_refused_before_anything_else() {
    assert_eq!(
        admitted(None, &requested(), 9),
        Err(Refusal::BucketNotFound)
    );
}

#[test]
fn a_bucket_being_deleted_refuses_before_its_sealing_is_looked_at() {
    let doomed = bucket(true, true);
    assert_eq!(
        admitted(Some(&doomed), &requested(), 9),
        Err(Refusal::BucketDeleting)
    );
}

#[test]
fn a_sealed_bucket_refuses_a_stream_in_the_clear_before_its_limit_is_counted() {
    let sealed = bucket(false, true);
    let counted = std::cell::Cell::new(false);
    let refused = admit(Some(("b", &sealed)), &requested(), Some(1), |_| {
        counted.set(true);
        9
    });
    assert_eq!(refused, Err(Refusal::Conflict(Conflict::SealedBucket)));
    assert!(!counted.get(), "the bucket's streams are not walked");
}

#[test]
fn a_sealed_bucket_takes_sealed_streams_and_mirrors() {
    let sealed = bucket(false, true);
    let s2 = RequestedConfig {
        cipher: Some("aegis-256".into()),
        ..requested()
    };
    assert_eq!(admitted(Some(&sealed), &s2, 0), Ok(()));
    let mirror = RequestedConfig {
        mirror_of: Some("http://up:1".into()),
        ..requested()
    };
    assert_eq!(admitted(Some(&sealed), &mirror, 0), Ok(()));
}

#[test]
fn a_bucket_at_its_limit_takes_no_more_streams() {
    let open = bucket(false, false);
    assert_eq!(admitted(Some(&open), &requested(), 0), Ok(()));
    assert_eq!(
        admitted(Some(&open), &requested(), 1),
        Err(Refusal::BucketFull {
            bucket: "b".into(),
            limit: 1
        })
    );
    let unlimited = admit(Some(("b", &open)), &requested(), None, |_| usize::MAX);
    assert_eq!(unlimited, Ok(()));
}

#[test]
fn an_s2_create_is_repeated_only_by_the_request_that_made_it() {
    assert_eq!(
        repeat_of_s2_create("stream", Some("k"), Some("k")),
        Ok(Creation::Repeated)
    );
    let exists = Err(Refusal::AlreadyExists("stream"));
    assert_eq!(repeat_of_s2_create("stream", Some("k"), Some("j")), exists);
    assert_eq!(repeat_of_s2_create("stream", None, None), exists);
    assert_eq!(repeat_of_s2_create("stream", Some("k"), None), exists);
}

// The new stream.

fn birth<'a>(requested: &'a RequestedConfig, bodies: &[&'static str]) -> Birth<'a> {
    Birth {
        name: "/b/s",
        requested,
        bodies: bodies
            .iter()
            .map(|b| Bytes::from_static(b.as_bytes()))
            .collect(),
        mirror: None,
        fork: None,
    }
}

#[test]
fn a_new_stream_starts_at_the_start_with_its_body_as_one_unit_arrived_now() {
    let requested = requested();
    let Born { meta, records } = Ledger::create(birth(&requested, &["ab", "c"]), NOW);
    assert_eq!(meta.tail, Offset::new(2, 3));
    assert_eq!(meta.retained_from, Offset::START);
    assert_eq!((meta.created_ms, meta.last_timestamp_ms), (NOW, NOW));
    assert_eq!(records.len(), 2);
    assert!(records[0].starts_unit && !records[1].starts_unit);
    let Born { meta, records } = Ledger::create(birth(&requested, &[]), NOW);
    assert!(records.is_empty());
    assert_eq!(
        meta.last_timestamp_ms, 0,
        "an empty stream's latest timestamp is 0"
    );
}

#[test]
fn a_mirror_starts_at_its_upstreams_retained_start_with_its_creation_time_and_snapshot() {
    let requested = requested();
    let snapshot = SnapshotInfo {
        offset: Offset::new(3, 3),
        content_type: "a/b".into(),
        digest: "d".into(),
    };
    let Born { meta, .. } = Ledger::create(
        Birth {
            mirror: Some(MirrorOrigin {
                at: Offset::new(3, 3),
                created_ms: 7,
                snapshot: Some(&snapshot),
            }),
            ..birth(&requested, &[])
        },
        NOW,
    );
    assert_eq!(
        (meta.tail, meta.retained_from),
        (Offset::new(3, 3), Offset::new(3, 3))
    );
    assert_eq!(meta.created_ms, 7);
    assert_eq!(meta.extra().snapshot.as_ref(), Some(&snapshot));
}

#[test]
fn a_fork_continues_after_its_copied_prefix_from_its_sources_retained_start_never_back_in_time() {
    let requested = requested();
    let prefix = lay_out_arrived(
        Offset::new(4, 4),
        NOW + 50,
        NOW,
        vec![Bytes::from_static(b"x")],
    );
    let base = ForkBase {
        source_id: 1,
        source_name: "/b/src",
        anchor: Offset::new(4, 4),
        sub_offset: 1,
        prefix: &prefix,
        first: Offset::new(2, 2),
        last_timestamp_ms: NOW + 90,
        snapshot: None,
    };
    let Born { meta, records } = Ledger::create(
        Birth {
            fork: Some(base),
            ..birth(&requested, &["yz"])
        },
        NOW,
    );
    assert_eq!(meta.retained_from, Offset::new(2, 2));
    assert_eq!(meta.tail, Offset::new(6, 7));
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[1].timestamp_ms,
        NOW + 50,
        "the body's timestamp is not below the prefix's"
    );
    let origin = meta.extra().fork.clone().unwrap();
    assert_eq!((origin.offset, origin.sub_offset), (Offset::new(4, 4), 1));
    // Without a prefix, the source's latest timestamp is the floor.
    let Born { meta, .. } = Ledger::create(
        Birth {
            fork: Some(ForkBase {
                prefix: &[],
                ..base
            }),
            ..birth(&requested, &[])
        },
        NOW,
    );
    assert_eq!(meta.tail, Offset::new(4, 4));
    assert_eq!(meta.last_timestamp_ms, NOW + 90);
}

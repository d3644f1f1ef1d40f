//! Mirror targets: the URLs that name a bucket or a stream, and the ones that overlap.

use super::*;

#[test]
fn overlapping_mirror_targets_are_refused() {
    let urls = |list: &[&str]| list.iter().map(|u| u.to_string()).collect::<Vec<_>>();
    assert!(check_targets(&urls(&["http://a:1/docs", "http://a:1/logs/s"])).is_ok());
    assert!(check_targets(&urls(&["http://a:1/docs/x", "http://a:1/docs/y"])).is_ok());
    for overlapping in [
        ["http://a:1/docs", "http://a:1/docs/s"],
        ["http://a:1/docs/s", "http://a:1/docs"],
        ["http://a:1/docs", "http://b:2/docs"],
        ["http://a:1/docs/s", "http://b:2/docs/s"],
    ] {
        assert!(
            check_targets(&urls(&overlapping)).is_err(),
            "{overlapping:?}"
        );
    }
}

#[test]
fn upstream_urls_name_a_bucket_or_one_of_its_streams() {
    let bucket = Upstream::parse("http://127.0.0.1:9/docs").unwrap();
    assert_eq!(
        (bucket.base.as_str(), bucket.bucket.as_str(), bucket.stream),
        ("http://127.0.0.1:9", "docs", None)
    );
    let stream = Upstream::parse("http://h:1/docs/a%20b/").unwrap();
    assert_eq!(stream.stream.as_deref(), Some("a b"));
    assert_eq!(stream.url(), "http://h:1/docs/a%20b");
    let nested = Upstream::parse("http://h:1/docs/users/42").unwrap();
    assert_eq!(
        nested.stream.as_deref(),
        Some("users/42"),
        "S2 names may hold '/'"
    );
    for bad in [
        "docs",
        "ftp://h:1/docs",
        "http://h:1",
        "http://h:1/v1",
        "http://h:1/docs/%2E%2E",
    ] {
        assert!(Upstream::parse(bad).is_err(), "{bad}");
    }
}

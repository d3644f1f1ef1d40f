//! Attributes and S2 configuration.

use super::*;
use crate::model::ledger::testing::Fixture;

const NOW: i64 = 1_000;

fn titled(title: &str) -> Attrs {
    Some(serde_json::Map::from_iter([("title".into(), title.into())]))
}

#[test]
fn attributes_of_a_deleted_stream_are_refused_without_renewing_it() {
    let mut f = Fixture::text();
    f.meta.soft_deleted = true;
    assert_eq!(
        f.ledger().apply(SetAttrs(titled("t")), NOW),
        Err(Refusal::Gone)
    );
    assert_eq!(f.last_access_ms, 0);
}

#[test]
fn the_same_attributes_again_change_nothing_but_renew() {
    let mut f = Fixture::text();
    assert_eq!(
        f.ledger().apply(SetAttrs(titled("t")), NOW),
        Ok(Setting::Changed)
    );
    assert_eq!(f.meta.extra().attrs, titled("t"));
    assert_eq!(
        f.ledger().apply(SetAttrs(titled("t")), NOW + 1),
        Ok(Setting::Unchanged)
    );
    assert_eq!(f.last_access_ms, NOW + 1);
}

#[test]
fn a_closed_stream_takes_new_attributes() {
    let mut f = Fixture::text();
    f.meta.closed = true;
    assert_eq!(
        f.ledger().apply(SetAttrs(titled("t")), NOW),
        Ok(Setting::Changed)
    );
}

#[test]
fn a_removed_streams_configuration_is_not_changed() {
    let mut f = Fixture::text();
    f.removed = true;
    let config = StreamConfig::default();
    assert_eq!(
        f.ledger().apply(Reconfigure(config), NOW),
        Err(Refusal::NotFound)
    );
    assert_eq!(f.meta.extra().s2_config, None);
}

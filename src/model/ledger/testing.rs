//! A stream's ledger state owned by a test, with no service around it.

use std::collections::BTreeMap;

use super::Ledger;
use crate::model::offset::Offset;
use crate::model::producer::ProducerState;
use crate::model::stream::StreamMeta;

pub(crate) struct Fixture {
    pub meta: StreamMeta,
    pub producers: BTreeMap<String, ProducerState>,
    pub last_access_ms: i64,
    pub removed: bool,
    pub forks: u32,
    pub json: bool,
}

impl Fixture {
    /// An empty, open `text/plain` stream.
    pub fn text() -> Fixture {
        Fixture::of("text/plain")
    }

    /// An empty, open `application/json` stream.
    pub fn json() -> Fixture {
        Fixture::of("application/json")
    }

    fn of(content_type: &str) -> Fixture {
        Fixture {
            meta: StreamMeta::new("/b/s", content_type),
            producers: BTreeMap::new(),
            last_access_ms: 0,
            removed: false,
            forks: 0,
            json: crate::model::content_type::is_json(content_type),
        }
    }

    /// This stream, its tail at `seq` records of one byte each.
    pub fn at(mut self, seq: u64) -> Fixture {
        self.meta.tail = Offset::new(seq, seq);
        self
    }

    pub fn ledger(&mut self) -> Ledger<'_> {
        Ledger {
            meta: &mut self.meta,
            producers: &mut self.producers,
            last_access_ms: &mut self.last_access_ms,
            removed: &mut self.removed,
            forks: &mut self.forks,
            json: self.json,
        }
    }
}

//! A stream's settings that change after its creation: its attributes (seed 000 §5) and its S2
//! configuration.

use super::{Command, Ledger, Refusal};
use crate::model::attrs::Attrs;
use crate::model::s2::StreamConfig;

/// Whether an accepted change changed anything (and so must be stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Unchanged,
    Changed,
}

/// The command: replace the attributes. Closed streams take it: closing forbids appends only.
pub struct SetAttrs(pub Attrs);

impl Command for SetAttrs {
    type Outcome = Result<Setting, Refusal>;

    /// An accepted change renews the stream, a repeat too.
    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) -> Self::Outcome {
        ledger.present()?;
        *ledger.last_access_ms = now_ms;
        if ledger.meta.extra().attrs == self.0 {
            return Ok(Setting::Unchanged);
        }
        ledger.meta.extra_mut().attrs = self.0;
        Ok(Setting::Changed)
    }
}

/// The command: make the stream's S2 configuration this (already resolved against its basin's
/// defaults and checked).
pub struct Reconfigure(pub StreamConfig);

impl Command for Reconfigure {
    type Outcome = Result<(), Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        ledger.present()?;
        ledger.meta.extra_mut().s2_config = Some(self.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests;

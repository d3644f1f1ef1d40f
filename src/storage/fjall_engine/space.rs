//! Free disk space, measured in the background, against the reserve below which writes are
//! refused.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How often free disk space is measured.
const SPACE_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// Free space on the data directory's file system, measured in the background, against the
/// reserve below which writes are refused. Refusing early keeps the engine from ever meeting a
/// full disk mid-write (which would poison it until a restart); deleting data or freeing space
/// elsewhere lets writes through again on the next measurement.
pub(super) struct FreeSpace {
    pub(super) reserve: u64,
    pub(super) has_room: AtomicBool,
}

impl FreeSpace {
    pub(super) fn watch(dir: &Path, reserve: u64) -> Arc<FreeSpace> {
        let space = Arc::new(FreeSpace {
            reserve,
            has_room: AtomicBool::new(true),
        });
        if reserve == 0 {
            return space;
        }
        space.measure(dir);
        let (weak, dir) = (Arc::downgrade(&space), dir.to_path_buf());
        let _ = std::thread::Builder::new()
            .name("runnel-free-space".into())
            .spawn(move || {
                while let Some(space) = weak.upgrade() {
                    space.measure(&dir);
                    drop(space);
                    std::thread::sleep(SPACE_CHECK_INTERVAL);
                }
            });
        space
    }

    fn measure(&self, dir: &Path) {
        let Ok(stats) = rustix::fs::statvfs(dir) else {
            return;
        };
        let free = stats.f_bavail.saturating_mul(stats.f_frsize);
        let had = self.has_room.swap(free >= self.reserve, Ordering::AcqRel);
        if had && free < self.reserve {
            tracing::error!(
                free,
                reserve = self.reserve,
                "disk nearly full; refusing writes until space returns"
            );
        } else if !had && free >= self.reserve {
            tracing::info!(free, "disk space is back; accepting writes again");
        }
    }
}

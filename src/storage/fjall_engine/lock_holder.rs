//! Which process holds a data directory: fjall takes an exclusive `flock` on `DIR/lock`, and
//! `/proc/locks` names the process of every lock by its file's inode. Only for the message of a
//! refused start, so a lookup that fails just leaves the process unnamed.

use std::path::Path;

/// The id of the process holding the lock on `dir`'s lock file, when `/proc/locks` says.
pub(super) fn lock_holder(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let inode = std::fs::metadata(dir.join("lock")).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_of(&locks, inode)
}

/// The process that `locks` (the text of `/proc/locks`) says holds a lock on `inode`.
fn holder_of(locks: &str, inode: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 4242 fd:00:1234 0 EOF`; a waiter's line has `->` after
        // the number.
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") {
            return None;
        }
        let pid = fields.get(4)?.parse().ok()?;
        let locked_inode: u64 = fields.get(5)?.rsplit(':').next()?.parse().ok()?;
        (locked_inode == inode).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_the_process_whose_lock_is_on_the_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 17 fd:00:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:00:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 5151 fd:00:1234 0 EOF\n";
        assert_eq!(holder_of(locks, 1234), Some(4242));
        assert_eq!(holder_of(locks, 99), Some(17));
        assert_eq!(holder_of(locks, 7), None);
        assert_eq!(holder_of("garbage\n", 1234), None);
    }
}

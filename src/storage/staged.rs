//! Large bodies written to a file of their own before the commit that refers to them.
//!
//! The engine commits every batch through one writer thread. A batch that carried a 64 MiB body
//! took that thread half a second to two seconds here (most of it copying the body into the
//! journal), and every append on the server waited behind it. So a request with large bodies
//! first writes them to a new file and syncs it, on its own blocking thread, outside the stream
//! lock; its commit then carries only where each body lies in that file (see `Change`), and the
//! writer stores that small reference. The file is named by a number the engine never reuses
//! while the file exists, and belongs to the one commit that refers to it; the engine deletes it
//! when it deletes what refers to it, and deletes at start any file nothing refers to (a crash
//! between writing the file and committing, or a refused request).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

/// Bodies written, in order, to a file of their own and synced. Cloning shares the file.
#[derive(Clone)]
pub struct Staged(Arc<StagedFile>);

struct StagedFile {
    number: u64,
    path: PathBuf,
    /// Each body's position in the file, by the address and length of its bytes. The bodies are
    /// held, so no other body can take the same address while this file is staged.
    placed: HashMap<(usize, usize), u64>,
    /// The file's length.
    len: u64,
    bodies: Vec<Bytes>,
    /// Set once a commit that may refer to the file was attempted: from then on only the
    /// engine, which knows whether it is referred to, deletes it.
    handed_over: AtomicBool,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("number", &self.0.number)
            .field("bodies", &self.0.bodies.len())
            .finish()
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        // Never committed (the request was refused, or went away before its commit): nothing
        // refers to the file. A failure here leaves it to the next start's cleanup.
        if !self.handed_over.load(Ordering::Acquire) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Staged {
    /// Writes `bodies` one after another to a new file `number` in `dir`, and syncs the file and
    /// the directory (so the file is durable before any commit refers to it). Blocking. An error
    /// keeps its kind (a full disk is told apart) and says what failed.
    pub fn write(dir: &Path, number: u64, bodies: Vec<Bytes>) -> Result<Staged, std::io::Error> {
        let path = dir.join(file_name(number));
        let io = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io("creating", e))?;
        let mut placed = HashMap::with_capacity(bodies.len());
        let mut at = 0u64;
        for body in bodies.iter().filter(|b| !b.is_empty()) {
            placed
                .entry((body.as_ptr() as usize, body.len()))
                .or_insert_with(|| {
                    let place = at;
                    at += body.len() as u64;
                    place
                });
        }
        // From here on, dropping `staged` deletes the file, whatever fails next.
        let staged = StagedFile {
            number,
            path: path.clone(),
            placed,
            len: at,
            bodies,
            handed_over: AtomicBool::new(false),
        };
        let mut written = HashSet::new();
        for body in staged.bodies.iter().filter(|b| !b.is_empty()) {
            // A body given twice (the same bytes) is stored once, where `placed` says.
            if written.insert((body.as_ptr() as usize, body.len())) {
                file.write_all(body).map_err(|e| io("writing", e))?;
            }
        }
        file.sync_data().map_err(|e| io("syncing", e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing the directory of", e))?;
        Ok(Staged(Arc::new(staged)))
    }

    /// The number the file is named by.
    pub fn number(&self) -> u64 {
        self.0.number
    }

    /// Where `body` lies in the file, if it is one of the staged bodies (the same bytes, not an
    /// equal copy). An empty body lies anywhere: at 0.
    pub fn place_of(&self, body: &Bytes) -> Option<u64> {
        if body.is_empty() {
            return Some(0);
        }
        self.0
            .placed
            .get(&(body.as_ptr() as usize, body.len()))
            .copied()
    }

    /// Whether the file holds `body` and nothing else.
    pub fn holds_only(&self, body: &Bytes) -> bool {
        self.0.len == body.len() as u64 && self.place_of(body) == Some(0)
    }

    /// The engine is about to commit a batch that may refer to the file: it decides its fate now.
    pub fn hand_over(&self) {
        self.0.handed_over.store(true, Ordering::Release);
    }
}

/// The name of file `number`: fixed-width hex, so names sort by number.
pub fn file_name(number: u64) -> String {
    format!("{number:016x}")
}

/// The number of a file named by [`file_name`], or `None` for any other name.
pub fn file_number(name: &str) -> Option<u64> {
    if name.len() != 16 {
        return None;
    }
    u64::from_str_radix(name, 16).ok()
}

//! Linux `perf`'s map of JIT code (`/tmp/perf-<pid>.map`): names each primitive's pages by
//! its key, so that `perf report` attributes samples to kernels instead of `[unknown]`.
//!
//! perf reads the file when it reports, not while it records: an entry must outlive the
//! pages it names, and pages that an evicted primitive returned may be mapped again for
//! another. Profile with an unlimited cache budget so that every address keeps one name.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::error::RuntimeError;
use crate::primitive::Primitive;

/// The open map file of this process; one line per primitive placed in executable pages.
#[derive(Debug)]
pub(crate) struct PerfMap {
    path: PathBuf,
    file: Mutex<File>,
}

impl PerfMap {
    /// The path perf looks for: `/tmp/perf-<pid>.map`.
    pub(crate) fn path() -> PathBuf {
        PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()))
    }

    /// Opens this process's map for appending (engines of one process share the file, each
    /// adding its own lines).
    pub(crate) fn open() -> Result<Self, RuntimeError> {
        let path = Self::path();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| failed(&path, e))?;
        Ok(PerfMap {
            path,
            file: Mutex::new(file),
        })
    }

    /// Appends `START SIZE primjit <key>` (hexadecimal, the code's bytes only) for
    /// `primitive`: the whole line in one `write_all` to a file opened for appending, under
    /// the lock, so that concurrent compiles do not interleave their lines.
    pub(crate) fn record(&self, primitive: &Primitive) -> Result<(), RuntimeError> {
        let start = primitive.code_range().start;
        let line = format!(
            "{start:x} {:x} primjit {}\n",
            primitive.memory().code,
            primitive.key()
        );
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(line.as_bytes())
            .map_err(|e| failed(&self.path, e))
    }
}

/// The error of opening or writing the map at `path`.
fn failed(path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::PerfMap {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

//! Opening the files a model is read from (the model, its external data) only when they are
//! regular files: a device, FIFO or directory would be read without end, block, or fail late.
//!
//! The facade's `primjit::file` makes the same check, with the same messages, for the CLI and
//! the Python package; the importer sits beside the IR and cannot depend on the facade.

use std::fs::{File, FileType};
use std::io;
use std::path::Path;

/// Opens `path` for reading when it is a regular file, following symlinks; otherwise an
/// [`io::ErrorKind::InvalidInput`] error that says what it is instead.
///
/// The type is checked before opening, since opening a FIFO blocks until a writer comes, and
/// again on the opened file, in case the path was replaced in between.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    refuse_irregular(std::fs::metadata(path)?.file_type())?;
    let file = File::open(path)?;
    refuse_irregular(file.metadata()?.file_type())?;
    Ok(file)
}

fn refuse_irregular(t: FileType) -> io::Result<()> {
    if t.is_file() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {}, not a regular file", describe(t)),
    ))
}

/// What a file that is not a regular one is, with its article.
fn describe(t: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

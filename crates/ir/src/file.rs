//! Opening the files that the tools, the bindings and the ONNX importer read (graphs,
//! parameters, inputs, models and their external data) only when they are regular files: a
//! device such as `/dev/zero` would be read without end, opening a FIFO blocks until a writer
//! comes, and a directory fails late. It lives here, at the bottom of the crates, so that the
//! importer (beside the IR) and the facade (`primjit::file`) share one check.

use std::fs::{File, FileType};
use std::io::{self, Read};
use std::path::Path;

/// What a path that is not a regular file is. [`open_regular`] returns it inside an
/// [`io::Error`] of kind [`io::ErrorKind::InvalidInput`]; [`NotRegularFile::in_error`] gets it
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotRegularFile {
    #[error("it is a directory, not a regular file")]
    Directory,
    #[error("it is a character device, not a regular file")]
    CharDevice,
    #[error("it is a block device, not a regular file")]
    BlockDevice,
    #[error("it is a FIFO, not a regular file")]
    Fifo,
    #[error("it is a socket, not a regular file")]
    Socket,
    /// Any other type of file that the platform has.
    #[error("it is a special file, not a regular file")]
    Other,
}

impl NotRegularFile {
    /// What a file of type `t` is, or `None` when it is a regular file.
    pub fn of(t: FileType) -> Option<Self> {
        if t.is_file() {
            return None;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_char_device() {
                return Some(Self::CharDevice);
            }
            if t.is_block_device() {
                return Some(Self::BlockDevice);
            }
            if t.is_fifo() {
                return Some(Self::Fifo);
            }
            if t.is_socket() {
                return Some(Self::Socket);
            }
        }
        Some(if t.is_dir() {
            Self::Directory
        } else {
            Self::Other
        })
    }

    /// What the file was, when `e` is [`open_regular`]'s refusal of a file that is not regular.
    pub fn in_error(e: &io::Error) -> Option<Self> {
        e.get_ref()?.downcast_ref::<Self>().copied()
    }
}

fn refuse_irregular(t: FileType) -> io::Result<()> {
    match NotRegularFile::of(t) {
        None => Ok(()),
        Some(what) => Err(io::Error::new(io::ErrorKind::InvalidInput, what)),
    }
}

/// Opens `path` for reading when it is a regular file, following symlinks. Anything else is
/// an [`io::ErrorKind::InvalidInput`] error that says what it is ([`NotRegularFile`]); a
/// missing or unreadable file is the operating system's error.
///
/// The type is checked before opening (opening a FIFO blocks until a writer comes) and again
/// on the opened file, in case the path was replaced in between.
pub fn open_regular(path: &Path) -> io::Result<File> {
    refuse_irregular(std::fs::metadata(path)?.file_type())?;
    let file = File::open(path)?;
    refuse_irregular(file.metadata()?.file_type())?;
    Ok(file)
}

/// Reads a regular file as UTF-8 text, such as an IR file ([`open_regular`]).
pub fn read_regular_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    open_regular(path)?.read_to_string(&mut text)?;
    Ok(text)
}

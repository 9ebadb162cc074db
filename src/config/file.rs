//! Reading a file the config names (the config itself, secrets, certificates, a deny body):
//! a regular file only, and at most a bound. `/dev/zero` or a named pipe in the config would
//! otherwise grow the process until the OOM killer stops it, or block a reload forever (and
//! with it every later reload), with nothing logged.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// The largest config file read (the file itself; what it names has bounds of its own).
pub const MAX_CONFIG: u64 = 16 << 20;

/// The largest certificate, key or CA bundle read.
pub const MAX_PEM: u64 = 4 << 20;

/// The largest `deny_body_file` read: an answer body, not a page of assets.
pub const MAX_DENY_BODY: u64 = 64 << 10;

/// The largest secret read (a token, a key).
pub const MAX_SECRET: u64 = 64 << 10;

/// The bytes of `path`, a regular file of at most `max` bytes; else why not (without the
/// path, which the caller names).
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    // Opened without blocking (a FIFO would wait for a writer), then checked on the open
    // handle, so the file cannot be swapped between the check and the read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::with_capacity(meta.len().min(max) as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

/// [`read_bounded`], as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_its_bound_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"12345").unwrap();
        assert_eq!(read_bounded(&small, 5).unwrap(), b"12345");
        let err = read_bounded(&small, 4).unwrap_err().to_string();
        assert!(err.contains("larger than 4 bytes"), "{err}");
        let zero = read_bounded(Path::new("/dev/zero"), 10)
            .unwrap_err()
            .to_string();
        assert!(zero.contains("not a regular file"), "{zero}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_bounded(&fifo, 10).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(read_bounded(&dir.path().join("none"), 10).is_err());
        assert!(read_bounded(dir.path(), 10).is_err());
    }
}

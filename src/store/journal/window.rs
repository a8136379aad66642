//! A file read through a window of a few MiB: replay reads every record of a store's files,
//! and a base holds every live value, so reading a file whole would cost as much memory, at
//! open, as the store's data.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// How much is read at a time (more for a record longer than this).
pub(super) const CHUNK: usize = 4 * 1024 * 1024;

/// A file's bytes, read a window at a time.
pub(super) struct Window<'f> {
    file: &'f File,
    size: u64,
    /// Where in the file `bytes` starts.
    start: u64,
    bytes: Vec<u8>,
}

impl<'f> Window<'f> {
    pub(super) fn new(file: &'f File) -> io::Result<Self> {
        Ok(Self {
            file,
            size: file.metadata()?.len(),
            start: 0,
            bytes: Vec::new(),
        })
    }

    /// The file's length.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// The bytes from `at` on: at least `want` of them, or every one left in the file if it
    /// has fewer (the caller tells a record cut short by the length it gets).
    pub(super) fn at(&mut self, at: u64, want: usize) -> io::Result<&[u8]> {
        let left = self.size.saturating_sub(at);
        let end = at.saturating_add((want as u64).min(left));
        let held = self.start + self.bytes.len() as u64;
        if at < self.start || end > held {
            let len = left.min(want.max(CHUNK) as u64) as usize;
            self.bytes.resize(len, 0);
            self.file.read_exact_at(&mut self.bytes, at)?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        Ok(&self.bytes[from..])
    }

    /// The CRC-32 of the `len` bytes from `at` (fewer if the file ends first), read a window
    /// at a time: a long record's checksum is checked before the record is held whole, so a
    /// flipped byte in its length makes replay read the rest of a file, not hold it.
    pub(super) fn crc32(&mut self, at: u64, len: u64) -> io::Result<u32> {
        let mut hasher = crc32fast::Hasher::new();
        let end = at.saturating_add(len).min(self.size);
        let mut pos = at;
        while pos < end {
            let bytes = self.at(pos, CHUNK)?;
            let take = bytes.len().min(CHUNK).min((end - pos) as usize);
            if take == 0 {
                break;
            }
            hasher.update(&bytes[..take]);
            pos += take as u64;
        }
        Ok(hasher.finalize())
    }

    /// Where the bytes after `from` that are not zeros end (`from` if all of them are): the end
    /// of a write a crash cut short, past the last whole record of a journal file.
    pub(super) fn last_nonzero_end(&mut self, from: u64) -> io::Result<u64> {
        let mut end = from;
        let mut at = from;
        while at < self.size {
            let bytes = self.at(at, CHUNK)?;
            let len = bytes.len().min(CHUNK);
            if let Some(last) = bytes[..len].iter().rposition(|&byte| byte != 0) {
                end = at + last as u64 + 1;
            }
            at += len as u64;
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_gives_the_files_bytes_wherever_they_are_asked_for() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("file");
        let bytes: Vec<u8> = (0..CHUNK * 2 + 10).map(|i| (i % 251) as u8).collect();
        let mut with_zeros = bytes.clone();
        with_zeros.extend_from_slice(&[0; 1000]);
        std::fs::write(&path, &with_zeros)?;
        let file = File::open(&path)?;
        let mut window = Window::new(&file)?;
        for (at, want) in [
            (0, 8),
            (CHUNK - 3, 8),
            (5, CHUNK + 100),
            (CHUNK * 2, 10),
            (3, 1),
        ] {
            let got = window.at(at as u64, want)?;
            assert!(got.len() >= want.min(with_zeros.len() - at), "{at} {want}");
            assert_eq!(&got[..want], &with_zeros[at..at + want], "{at} {want}");
        }
        // Past the end: what is left, then nothing.
        assert_eq!(window.at(with_zeros.len() as u64 - 2, 8)?.len(), 2);
        assert!(window.at(with_zeros.len() as u64, 8)?.is_empty());
        // The last byte that is not a zero (the pattern's zeros, every 251 bytes, included).
        let last = bytes
            .iter()
            .rposition(|&byte| byte != 0)
            .map_or(0, |at| at + 1);
        assert_eq!(window.last_nonzero_end(0)?, last as u64);
        assert_eq!(
            window.last_nonzero_end(bytes.len() as u64)?,
            bytes.len() as u64
        );
        Ok(())
    }

    #[test]
    fn a_long_stretch_s_checksum_is_read_a_window_at_a_time() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("file");
        let bytes: Vec<u8> = (0..CHUNK * 3 + 17).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &bytes)?;
        let file = File::open(&path)?;
        let mut window = Window::new(&file)?;
        assert_eq!(
            window.crc32(5, (CHUNK * 3) as u64)?,
            crc32fast::hash(&bytes[5..5 + CHUNK * 3])
        );
        assert!(
            window.bytes.len() <= CHUNK,
            "held {} bytes",
            window.bytes.len()
        );
        // A length past the end (a flipped byte): what the file has.
        assert_eq!(
            window.crc32(9, u64::from(u32::MAX))?,
            crc32fast::hash(&bytes[9..])
        );
        assert!(window.bytes.len() <= CHUNK);
        Ok(())
    }
}

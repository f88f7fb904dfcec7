//! The keys a node wrote to its NVMe tier, in a file beside the block
//! files, so that after a restart the node knows which keys the tier holds
//! without reading them: `EXISTS`/`PREFIX` answer for them and cluster
//! repair pushes them like any other key. foyer recovers its own index but
//! cannot list it.
//!
//! The file is a sequence of records, each
//! `key_len u32 | expire_at_ms u64 (u64::MAX: none) | created_ms u64 | key | crc32c u32`
//! (little-endian; the checksum covers everything before it). A record is
//! appended after each completed NVMe write; forgotten keys are not
//! recorded, because recovery keeps only the keys foyer still indexes. A
//! torn or corrupt tail (a crash mid-append) ends the file: what follows is
//! unknown until read, as without the log. The file is rewritten from the
//! live set at start and whenever it holds four times more records than
//! live keys.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use parking_lot::Mutex;

pub const KEY_LOG_FILE: &str = "strata-keys.log";
/// Longest key a record may name: far above any key the server accepts.
const KEY_MAX: usize = 64 << 20;
const NO_EXPIRY: u64 = u64::MAX;
/// Records below which the log is never compacted at run time.
const COMPACT_FLOOR: u64 = 1 << 16;

/// One recorded key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Bytes,
    pub expire_at_ms: Option<u64>,
    pub created_ms: u64,
}

pub struct KeyLog {
    path: PathBuf,
    file: Mutex<Option<File>>,
    /// Records in the file.
    records: AtomicU64,
}

fn encode(out: &mut Vec<u8>, key: &[u8], expire_at_ms: Option<u64>, created_ms: u64) {
    let start = out.len();
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&expire_at_ms.unwrap_or(NO_EXPIRY).to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(key);
    let crc = crate::checksum::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// The records of `bytes`, up to the first torn or corrupt one.
pub fn decode(bytes: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= 20 {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + 20 + len;
        if len > KEY_MAX || end + 4 > bytes.len() {
            break;
        }
        let crc = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes"));
        if crate::checksum::crc32c(&bytes[at..end]) != crc {
            break;
        }
        let expire = u64_at(at + 4);
        out.push(Entry {
            key: Bytes::copy_from_slice(&bytes[at + 20..end]),
            expire_at_ms: (expire != NO_EXPIRY).then_some(expire),
            created_ms: u64_at(at + 12),
        });
        at = end + 4;
    }
    out
}

impl KeyLog {
    /// Reads the log in `dir` (missing: empty) and opens it for appending.
    pub fn open(dir: &Path) -> io::Result<(KeyLog, Vec<Entry>)> {
        let path = dir.join(KEY_LOG_FILE);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let entries = decode(&bytes);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let log = KeyLog {
            path,
            file: Mutex::new(Some(file)),
            records: AtomicU64::new(entries.len() as u64),
        };
        Ok((log, entries))
    }

    /// Records that `key` is on NVMe. An error is logged by the caller: the
    /// key is then unknown after a restart until read, nothing worse.
    pub fn append(&self, key: &[u8], expire_at_ms: Option<u64>, created_ms: u64) -> io::Result<()> {
        let mut rec = Vec::with_capacity(key.len() + 24);
        encode(&mut rec, key, expire_at_ms, created_ms);
        let mut file = self.file.lock();
        match file.as_mut() {
            // One write(2) per record: a kill -9 loses no finished record.
            Some(f) => f.write_all(&rec)?,
            None => return Err(io::Error::other("key log closed after a failed rewrite")),
        }
        self.records.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Whether the file holds many more records than `live` keys.
    pub fn wants_compaction(&self, live: usize) -> bool {
        self.records.load(Relaxed) > 4 * (live as u64).max(COMPACT_FLOOR)
    }

    /// Replaces the file with one record per entry of `live` (taken while
    /// appends wait), atomically (a temporary file, then rename).
    pub fn rewrite<I>(&self, live: impl FnOnce() -> I) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry>,
    {
        let mut file = self.file.lock();
        let tmp = self.path.with_extension("log.tmp");
        let mut n = 0u64;
        let built = (|| {
            let mut w = BufWriter::new(File::create(&tmp)?);
            let mut rec = Vec::new();
            for e in live() {
                rec.clear();
                encode(&mut rec, &e.key, e.expire_at_ms, e.created_ms);
                w.write_all(&rec)?;
                n += 1;
            }
            w.into_inner().map_err(|e| e.into_error())?.sync_all()
        })();
        if let Err(e) = built.and_then(|()| std::fs::rename(&tmp, &self.path)) {
            // The old file is still the log: keep appending to it.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // Renamed: the open handle names the old, unlinked file now.
        match OpenOptions::new().append(true).open(&self.path) {
            Ok(f) => {
                *file = Some(f);
                self.records.store(n, Relaxed);
                Ok(())
            }
            Err(e) => {
                *file = None;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str, expire: Option<u64>, created: u64) -> Entry {
        Entry {
            key: Bytes::copy_from_slice(k.as_bytes()),
            expire_at_ms: expire,
            created_ms: created,
        }
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (log, old) = KeyLog::open(dir.path()).unwrap();
            assert!(old.is_empty());
            log.append(b"a", None, 1).unwrap();
            log.append(b"b", Some(99), 2).unwrap();
        }
        // A crash mid-append: half a record at the end.
        let path = dir.path().join(KEY_LOG_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let mut torn = Vec::new();
        encode(&mut torn, b"c", None, 3);
        bytes.extend_from_slice(&torn[..torn.len() - 3]);
        std::fs::write(&path, &bytes).unwrap();
        let (log, got) = KeyLog::open(dir.path()).unwrap();
        assert_eq!(got, vec![entry("a", None, 1), entry("b", Some(99), 2)]);
        // A flipped byte in a record ends the log there too.
        let mut bad = std::fs::read(&path).unwrap();
        bad[5] ^= 1;
        assert!(decode(&bad).is_empty());
        drop(log);
    }

    #[test]
    fn rewrite_keeps_only_the_live_set_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = KeyLog::open(dir.path()).unwrap();
        for i in 0..10 {
            log.append(format!("k{i}").as_bytes(), None, i).unwrap();
        }
        log.rewrite(|| vec![entry("k3", None, 3), entry("k7", Some(5), 7)])
            .unwrap();
        log.append(b"k10", None, 10).unwrap();
        drop(log);
        let (_, got) = KeyLog::open(dir.path()).unwrap();
        assert_eq!(
            got,
            vec![
                entry("k3", None, 3),
                entry("k7", Some(5), 7),
                entry("k10", None, 10)
            ]
        );
    }
}

//! The SmolLM2 logits corpus: real f32 logits rows and final hidden states
//! for tests and benches. `cargo xtask logits-corpus` writes it (through
//! `examples/corpus.rs`) next to the model; include this module with
//! `#[path]` to read it.
//!
//! # File format (version 1, little-endian)
//!
//! | field | type |
//! | --- | --- |
//! | magic | 8 bytes, `FSLOGITS` |
//! | version | u32, 1 |
//! | vocab | u32 (49152 for SmolLM2) |
//! | hidden | u32 (576 for SmolLM2-135M) |
//! | count | u32, the number of rows |
//!
//! then `count` rows of `12 + 4 * (vocab + hidden)` bytes each:
//!
//! | field | type |
//! | --- | --- |
//! | prompt | u32, an index into [`PROMPTS`] |
//! | temperature | f32, one of [`TEMPERATURES`] |
//! | step | u32, the decoding step (0 = the logits after the prompt) |
//! | logits | `[f32; vocab]`, candle's logits (Q8_0 LM head) |
//! | hidden | `[f32; hidden]`, the LM head's input (after the final RMS norm) |
//!
//! Rows come in runs of consecutive steps per (prompt, temperature). Within a
//! run, the token fed after step `s` is flashsample's CPU reference sample of
//! row `s`: `flashsample::reference::sample_gumbel` with the row's
//! temperature, seed [`seed`]`(prompt)` and offset `s` (greedy at
//! temperature 0). Runs do not stop at end-of-text tokens.
#![allow(dead_code)] // each includer uses its own subset

// Std-only paths and constants; a crate that also includes
// `examples/smollm` gets a second copy of them, which is harmless.
#[allow(clippy::duplicate_mod)]
#[path = "../../examples/smollm/cache.rs"]
mod cache;

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"FSLOGITS";
/// The format version this module reads and writes.
pub const VERSION: u32 = 1;
/// Bytes before the first row.
const HEADER_BYTES: u64 = 8 + 4 * 4;

/// One prompt of the corpus.
pub struct Prompt {
    /// A short name (`chat`, `code`, ...).
    pub name: &'static str,
    /// The text.
    pub text: &'static str,
    /// Whether `text` is a user message wrapped in the chat template (else
    /// a raw text to continue).
    pub chat: bool,
}

/// The corpus's prompts, by index.
pub const PROMPTS: [Prompt; 5] = [
    Prompt {
        name: "chat",
        text: "What are three good habits for staying healthy? Explain each one briefly.",
        chat: true,
    },
    Prompt {
        name: "code",
        text: "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
        chat: false,
    },
    Prompt {
        name: "prose",
        text: "The old lighthouse keeper climbed the spiral stairs every evening, and on the night of the storm",
        chat: false,
    },
    Prompt {
        name: "list",
        text: "Things to pack for a week of hiking in the mountains:\n1. A warm jacket\n2.",
        chat: false,
    },
    Prompt {
        name: "numbers",
        text: "1, 1, 2, 3, 5, 8, 13, 21, 34,",
        chat: false,
    },
];

/// The temperatures of the corpus's runs (0 is greedy).
pub const TEMPERATURES: [f32; 3] = [0.0, 0.7, 1.0];

/// The sampling seed of prompt `prompt`'s runs.
pub fn seed(prompt: u32) -> u64 {
    0x5EED_0000 + u64::from(prompt)
}

/// The corpus's default path, next to the model (whether or not it exists).
pub fn default_path() -> Result<PathBuf, String> {
    cache::corpus_path()
}

/// One row of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Index into [`PROMPTS`].
    pub prompt: u32,
    /// Sampling temperature of the run.
    pub temperature: f32,
    /// Decoding step within the run.
    pub step: u32,
    /// `vocab` f32 logits.
    pub logits: Vec<f32>,
    /// `hidden` f32 values, the LM head's input.
    pub hidden: Vec<f32>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Streams the rows of a corpus file.
pub struct Reader {
    file: BufReader<File>,
    vocab: usize,
    hidden: usize,
    count: usize,
    read: usize,
}

impl Reader {
    /// Opens `path` and checks its header and its length (a truncated file
    /// is an error here, not half-way through).
    pub fn open(path: &Path) -> io::Result<Reader> {
        let mut file = BufReader::new(File::open(path)?);
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic)?;
        if magic != MAGIC {
            return Err(invalid(format!(
                "{} is not a logits corpus",
                path.display()
            )));
        }
        let mut word = || -> io::Result<u32> {
            let mut b = [0u8; 4];
            file.read_exact(&mut b)?;
            Ok(u32::from_le_bytes(b))
        };
        let (version, vocab, hidden, count) = (word()?, word()?, word()?, word()?);
        if version != VERSION {
            return Err(invalid(format!(
                "{}: format version {version}, this reader knows {VERSION}",
                path.display()
            )));
        }
        let (vocab, hidden, count) = (vocab as usize, hidden as usize, count as usize);
        let expected = HEADER_BYTES + count as u64 * row_bytes(vocab, hidden);
        let len = file.get_ref().metadata()?.len();
        if len != expected {
            return Err(invalid(format!(
                "{}: {len} bytes, the header calls for {expected}",
                path.display()
            )));
        }
        Ok(Reader {
            file,
            vocab,
            hidden,
            count,
            read: 0,
        })
    }

    /// Logits per row.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Hidden-state values per row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Rows in the file.
    pub fn count(&self) -> usize {
        self.count
    }

    fn next_row(&mut self) -> io::Result<Row> {
        let mut head = [0u8; 12];
        self.file.read_exact(&mut head)?;
        let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
        let mut floats = |n: usize| -> io::Result<Vec<f32>> {
            let mut bytes = vec![0u8; 4 * n];
            self.file.read_exact(&mut bytes)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let (vocab, hidden) = (self.vocab, self.hidden);
        Ok(Row {
            prompt: u32::from_le_bytes(word(0)),
            temperature: f32::from_le_bytes(word(4)),
            step: u32::from_le_bytes(word(8)),
            logits: floats(vocab)?,
            hidden: floats(hidden)?,
        })
    }
}

impl Iterator for Reader {
    type Item = io::Result<Row>;

    fn next(&mut self) -> Option<io::Result<Row>> {
        (self.read < self.count).then(|| {
            self.read += 1;
            self.next_row()
        })
    }
}

/// All rows of the corpus at `path`.
pub fn read_all(path: &Path) -> io::Result<Vec<Row>> {
    Reader::open(path)?.collect()
}

fn row_bytes(vocab: usize, hidden: usize) -> u64 {
    12 + 4 * (vocab + hidden) as u64
}

/// Writes a corpus file: rows as they come, the count at
/// [`Writer::finish`]. The file appears at its path only when finished (it
/// is written next to it under a temporary name first, removed when the
/// writer is dropped unfinished).
pub struct Writer {
    /// `None` once finished.
    file: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    vocab: usize,
    hidden: usize,
    count: u32,
}

impl Writer {
    /// Starts a corpus of rows of `vocab` logits and `hidden` values.
    pub fn create(path: &Path, vocab: usize, hidden: usize) -> io::Result<Writer> {
        let dims = u32::try_from(vocab).and_then(|v| Ok((v, u32::try_from(hidden)?)));
        let (vocab32, hidden32) =
            dims.map_err(|_| invalid(format!("vocab {vocab} / hidden {hidden} too large")))?;
        let tmp = path.with_extension(format!("partial-{}", std::process::id()));
        let mut file = BufWriter::new(File::create(&tmp)?);
        file.write_all(&MAGIC)?;
        for w in [VERSION, vocab32, hidden32, 0] {
            file.write_all(&w.to_le_bytes())?;
        }
        Ok(Writer {
            file: Some(file),
            tmp,
            path: path.to_path_buf(),
            vocab,
            hidden,
            count: 0,
        })
    }

    /// Appends one row; `logits` and `hidden` must have the corpus's sizes.
    pub fn push(
        &mut self,
        prompt: u32,
        temperature: f32,
        step: u32,
        logits: &[f32],
        hidden: &[f32],
    ) -> io::Result<()> {
        if logits.len() != self.vocab || hidden.len() != self.hidden {
            return Err(invalid(format!(
                "row of {} logits and {} hidden values, the corpus has {} and {}",
                logits.len(),
                hidden.len(),
                self.vocab,
                self.hidden
            )));
        }
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| invalid("corpus already finished".into()))?;
        self.count = self
            .count
            .checked_add(1)
            .ok_or_else(|| invalid("more than u32::MAX rows".into()))?;
        file.write_all(&prompt.to_le_bytes())?;
        file.write_all(&temperature.to_le_bytes())?;
        file.write_all(&step.to_le_bytes())?;
        let bytes: Vec<u8> = logits
            .iter()
            .chain(hidden)
            .flat_map(|x| x.to_le_bytes())
            .collect();
        file.write_all(&bytes)
    }

    /// Writes the row count and moves the file to its path; returns its size
    /// in bytes.
    pub fn finish(mut self) -> io::Result<u64> {
        let mut file = self
            .file
            .take()
            .ok_or_else(|| invalid("corpus already finished".into()))?;
        file.seek(SeekFrom::Start(HEADER_BYTES - 4))?;
        file.write_all(&self.count.to_le_bytes())?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let len = file.metadata()?.len();
        drop(file);
        std::fs::rename(&self.tmp, &self.path)?;
        Ok(len)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Rows of the SmolLM2 logits corpus: the bundle's subset
/// (`FLASHSAMPLE_CORPUS`) or the full corpus next to the model, at most `max`
/// rows spread over it; none (with a visible note) when there is no corpus.
pub fn spread_rows(test: &str, max: usize) -> Vec<Row> {
    use std::io::Write;
    let path = match std::env::var("FLASHSAMPLE_CORPUS") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => match default_path() {
            Ok(p) => p,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "NOTE {test}: no logits corpus ({e})");
                return Vec::new();
            }
        },
    };
    let Ok(reader) = Reader::open(&path) else {
        let _ = writeln!(
            std::io::stderr(),
            "NOTE {test}: no logits corpus at {} (cargo xtask logits-corpus)",
            path.display()
        );
        return Vec::new();
    };
    let every = Reader::count(&reader).div_ceil(max).max(1);
    reader
        .step_by(every)
        .map(|r| r.unwrap_or_else(|e| panic!("{test}: reading {}: {e}", path.display())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("flashsample-corpus-{name}-{}", std::process::id()))
    }

    #[test]
    fn corpus_round_trip() -> io::Result<()> {
        let path = temp_path("round-trip");
        let rows: Vec<Row> = (0..3u32)
            .map(|i| Row {
                prompt: i % 2,
                temperature: [0.0, 0.7, 1.0][i as usize],
                step: i,
                logits: (0..5).map(|j| j as f32 * 0.5 - i as f32).collect(),
                hidden: vec![f32::MIN_POSITIVE, -0.0, f32::NEG_INFINITY],
            })
            .collect();
        let mut w = Writer::create(&path, 5, 3)?;
        for r in &rows {
            w.push(r.prompt, r.temperature, r.step, &r.logits, &r.hidden)?;
        }
        assert!(w.push(0, 0.0, 0, &[0.0; 4], &[0.0; 3]).is_err());
        let len = w.finish()?;
        assert_eq!(len, HEADER_BYTES + 3 * row_bytes(5, 3));

        let reader = Reader::open(&path)?;
        assert_eq!((reader.vocab(), reader.hidden(), reader.count()), (5, 3, 3));
        let back = read_all(&path)?;
        assert_eq!(back.len(), 3);
        for (a, b) in rows.iter().zip(&back) {
            // Bitwise, so that -0.0 and infinities count.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!((a.prompt, a.step), (b.prompt, b.step));
            assert_eq!(a.temperature.to_bits(), b.temperature.to_bits());
            assert_eq!(bits(&a.logits), bits(&b.logits));
            assert_eq!(bits(&a.hidden), bits(&b.hidden));
        }

        // A writer dropped unfinished leaves nothing behind.
        let unfinished = temp_path("unfinished");
        let mut w = Writer::create(&unfinished, 5, 3)?;
        w.push(0, 1.0, 0, &rows[0].logits, &rows[0].hidden)?;
        drop(w);
        let tmp = unfinished.with_extension(format!("partial-{}", std::process::id()));
        assert!(!unfinished.exists() && !tmp.exists());

        // A truncated file and a foreign file are rejected at open.
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() - 1])?;
        assert!(Reader::open(&path).is_err());
        std::fs::write(&path, b"GGUF and more bytes than a header")?;
        assert!(Reader::open(&path).is_err());
        std::fs::remove_file(&path)
    }
}

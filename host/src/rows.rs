//! Row-major `[batch, vocab]` tensors, per-row parameters in device memory,
//! and how the row kernels split a row over thread blocks.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use flashsample_kernels::params::{CHUNK_ALIGN, ROW_THREADS, RowSplit, SAMPLING_BLOCKS_PER_SM};
use flashsample_kernels::sample::MAX_VOCAB;

use crate::error::{Result, param, shape};

/// Element type of a logits tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
}

/// Element types the row kernels read (sealed: f32 and bf16).
pub trait LogitElem: crate::sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + 'static {
    const DTYPE: DType;
}

impl LogitElem for f32 {
    const DTYPE: DType = DType::F32;
}

impl LogitElem for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}

/// Shape of a row-major `[batch, vocab]` tensor whose rows start
/// `row_stride` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub batch: usize,
    pub vocab: usize,
    pub row_stride: usize,
}

impl Rows {
    /// A contiguous `[batch, vocab]` tensor.
    pub fn contiguous(batch: usize, vocab: usize) -> Rows {
        Rows {
            batch,
            vocab,
            row_stride: vocab,
        }
    }

    /// Elements a buffer must hold for this shape.
    pub fn min_len(&self) -> usize {
        if self.batch == 0 {
            0
        } else {
            (self.batch - 1) * self.row_stride + self.vocab
        }
    }

    /// Rejects empty, oversized or inconsistent shapes and a buffer `what`
    /// of `len` elements shorter than the shape needs: the check every
    /// launch makes first. `Ok` guarantees `min_len() <= len` without
    /// overflow.
    pub fn validate(&self, what: &'static str, len: usize) -> Result<()> {
        if self.batch == 0 || self.batch > u32::MAX as usize / 2 {
            return Err(param("batch", self.batch));
        }
        if self.vocab == 0 || self.vocab as u64 > MAX_VOCAB {
            return Err(param("vocab", self.vocab));
        }
        if self.row_stride < self.vocab {
            return Err(shape(
                "row_stride",
                format!(">= vocab ({})", self.vocab),
                self.row_stride,
            ));
        }
        let need = (self.batch - 1)
            .checked_mul(self.row_stride)
            .and_then(|n| n.checked_add(self.vocab))
            .ok_or_else(|| param("row_stride", self.row_stride))?;
        if len < need {
            return Err(shape(what, format!("at least {need} elements"), len));
        }
        Ok(())
    }
}

/// Temperature, seed and offset of every row, in device memory so that a
/// captured CUDA graph reads the current values at each replay.
#[derive(Debug)]
pub struct RowParams {
    /// Per-row temperature; `<= 0` or NaN samples greedily.
    pub temperature: CudaSlice<f32>,
    /// Per-row 64-bit Philox seed.
    pub seed: CudaSlice<u64>,
    /// Per-row Philox offset (advance it every step).
    pub offset: CudaSlice<u64>,
}

impl RowParams {
    /// Uploads per-row parameters (all three slices of one length).
    pub fn upload(
        stream: &Arc<CudaStream>,
        temperature: &[f32],
        seed: &[u64],
        offset: &[u64],
    ) -> Result<RowParams> {
        let b = temperature.len();
        if seed.len() != b {
            return Err(shape("seed", b, seed.len()));
        }
        if offset.len() != b {
            return Err(shape("offset", b, offset.len()));
        }
        Ok(RowParams {
            temperature: stream.clone_htod(temperature)?,
            seed: stream.clone_htod(seed)?,
            offset: stream.clone_htod(offset)?,
        })
    }

    /// Rows described.
    pub fn batch(&self) -> usize {
        self.temperature.len()
    }

    pub(crate) fn check(&self, batch: usize) -> Result<()> {
        for (what, len) in [
            ("temperature", self.temperature.len()),
            ("seed", self.seed.len()),
            ("offset", self.offset.len()),
        ] {
            if len < batch {
                return Err(shape(what, format!("at least {batch} rows"), len));
            }
        }
        Ok(())
    }
}

/// Blocks per multiprocessor a sampling split aims for when the batch is
/// small: half the [`SAMPLING_BLOCKS_PER_SM`] the kernels fit. Fewer, longer
/// blocks raise each block's filter threshold earlier and pay its start
/// and finish fewer times (H200, session 15: B = 32, V = 128256 took 14.6
/// us on 8 blocks a row, 15.2 on 12, 15.9 on 16; B = 128 30.7 us on 2,
/// 31.4 on 4); large batches take a block a row anyway.
const BLOCKS_PER_SM: usize = SAMPLING_BLOCKS_PER_SM as usize / 2;
/// Fewest elements worth a block of its own.
const MIN_CHUNK: usize = 1024;

/// Split for kernels whose result per row does not depend on the split
/// (sampling: an exact maximum): enough blocks per row to fill the GPU when
/// the batch is small, one block per row when it is large.
pub(crate) fn split_for_batch(rows: &Rows, sm_count: u32) -> RowSplit {
    let target = BLOCKS_PER_SM * sm_count.max(1) as usize;
    let max_ctas = rows
        .vocab
        .div_ceil(MIN_CHUNK)
        .clamp(1, ROW_THREADS as usize);
    // Rounded down: never more blocks than the target (B = 32: 8 a row,
    // 256 blocks on 132 SMs).
    let ctas = (target / rows.batch).clamp(1, max_ctas);
    make_split(rows, ctas)
}

/// Elements per block of kernels whose floating-point result depends on the
/// split (softmax sums): a function of `vocab` alone, so a row's bits do not
/// depend on batch size or GPU.
const VOCAB_ONLY_CHUNK: usize = 8192;

/// Split of a row as a function of its length only (see
/// [`VOCAB_ONLY_CHUNK`]).
pub(crate) fn split_for_vocab(rows: &Rows) -> RowSplit {
    make_split(rows, rows.vocab.div_ceil(VOCAB_ONLY_CHUNK))
}

fn make_split(rows: &Rows, ctas: usize) -> RowSplit {
    let align = CHUNK_ALIGN as usize;
    let chunk = rows.vocab.div_ceil(ctas).div_ceil(align) * align;
    RowSplit {
        batch: rows.batch as u32,
        vocab: rows.vocab as u32,
        row_stride: rows.row_stride as u64,
        ctas_per_row: rows.vocab.div_ceil(chunk) as u32,
        chunk: chunk as u32,
    }
}

/// Kernel-argument wrapper of [`RowSplit`] (passed by value).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct SplitArg(pub RowSplit);

// SAFETY: `RowSplit` is `#[repr(C)]` plain data whose layout the kernels
// crate pins with const asserts; the kernels take it by value.
unsafe impl DeviceRepr for SplitArg {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_rows_exactly() {
        for vocab in [1usize, 7, 111, 1024, 32_000, 128_256, 151_936, 262_144] {
            for batch in [1usize, 3, 32, 1024] {
                let rows = Rows::contiguous(batch, vocab);
                for s in [split_for_batch(&rows, 132), split_for_vocab(&rows)] {
                    assert_eq!(s.chunk % CHUNK_ALIGN, 0);
                    assert!(s.ctas_per_row >= 1 && s.ctas_per_row <= ROW_THREADS);
                    let c = s.ctas_per_row as usize;
                    let chunk = s.chunk as usize;
                    assert!(
                        (c - 1) * chunk < vocab && c * chunk >= vocab,
                        "{vocab} {batch} {s:?}"
                    );
                }
            }
        }
        let s = split_for_batch(&Rows::contiguous(1, 128_256), 132);
        assert!(
            s.ctas_per_row >= 100,
            "B = 1 must spread over the GPU: {s:?}"
        );
        assert_eq!(
            split_for_batch(&Rows::contiguous(1024, 128_256), 132).ctas_per_row,
            1
        );
        // Small batches fill one wave of resident blocks, never a second.
        for batch in 1..=BLOCKS_PER_SM * 132 {
            let s = split_for_batch(&Rows::contiguous(batch, 262_144), 132);
            assert!(
                batch * s.ctas_per_row as usize <= BLOCKS_PER_SM * 132,
                "{batch}: {s:?}"
            );
        }
    }

    #[test]
    fn shapes_are_validated() {
        let r = Rows::contiguous(2, 10);
        assert!(r.validate("x", 20).is_ok());
        assert!(r.validate("x", 19).is_err());
        assert!(Rows::contiguous(0, 10).validate("x", 100).is_err());
        assert!(Rows::contiguous(1, 0).validate("x", 100).is_err());
        assert!(
            Rows {
                batch: 2,
                vocab: 10,
                row_stride: 9
            }
            .validate("x", 100)
            .is_err()
        );
        assert!(
            Rows {
                batch: 3,
                vocab: 10,
                row_stride: usize::MAX / 2
            }
            .validate("x", 100)
            .is_err()
        );
    }
}

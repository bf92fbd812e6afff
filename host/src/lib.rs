//! flashsample: exact, deterministic token sampling for LLM decoding.
pub mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx_modules.rs"));
}

//! How text becomes tokens: characters (the demo's tokenizer), or GPT-2's byte-level BPE (the
//! `r50k_base` ranks that tiktoken-rs ships inside the crate, so nothing is downloaded).

use crate::error::{Error, Result};

/// GPT-2's vocabulary size (50256 BPE merges and bytes, plus `<|endoftext|>`).
pub const GPT2_VOCAB: usize = 50257;

/// Which tokenizer a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// Characters for text files (or the checkpoint's characters); GPT-2's BPE for token files
    /// and for checkpoints without a character vocabulary whose vocabulary is GPT-2's.
    #[default]
    Auto,
    Chars,
    Gpt2,
}

impl std::str::FromStr for Tokenizer {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Tokenizer::Auto),
            "chars" => Ok(Tokenizer::Chars),
            "gpt2" => Ok(Tokenizer::Gpt2),
            other => Err(format!("`{other}`: use auto, chars or gpt2")),
        }
    }
}

fn bpe() -> &'static tiktoken_rs::CoreBPE {
    tiktoken_rs::r50k_base_singleton()
}

/// GPT-2 BPE ids of `text` (special tokens are plain text here).
pub fn gpt2_encode(text: &str) -> Vec<u32> {
    bpe().encode_ordinary(text)
}

/// Text of GPT-2 ids; bytes that do not form UTF-8 (a token boundary inside a character)
/// become U+FFFD. Ids outside the vocabulary are an error naming the first.
pub fn gpt2_decode(tokens: &[u32]) -> Result<String> {
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= GPT2_VOCAB) {
        return Err(Error::invalid("decode", format!("token {t} is not in GPT-2's vocabulary of {GPT2_VOCAB}")));
    }
    let bytes = bpe().decode_bytes(tokens).map_err(|e| Error::invalid("decode", e.to_string()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_ids_match_the_reference() {
        // Ids from GPT-2's tokenizer (Hugging Face `gpt2`): "Hello world" and a non-ASCII text.
        assert_eq!(gpt2_encode("Hello world"), vec![15496, 995]);
        assert_eq!(gpt2_encode(" the cat sat."), vec![262, 3797, 3332, 13]);
        for text in ["Hello world", "naïve café — 東京\n\n  spaces", "<|endoftext|> is plain text here"] {
            assert_eq!(gpt2_decode(&gpt2_encode(text)).unwrap(), text);
        }
        assert!(gpt2_decode(&[50257]).is_err());
    }
}

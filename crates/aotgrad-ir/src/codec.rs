//! The one binary codec of aotgrad: every artifact and cache entry is encoded here
//! (`bincode` 2 over serde, standard configuration: little endian, variable-length
//! integers). Readable dumps use `serde_json` instead; nothing else picks a format.
//!
//! Decoding never trusts its input: a truncated, overlong or malformed payload is a
//! [`CodecError`], never a panic, and no length read from the payload can make the
//! decoder reserve more memory than the payload itself could describe.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The value could not be encoded (a type serde cannot express in bincode).
    #[error("cannot encode {what}: {msg}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's message.
        msg: String,
    },
    /// The bytes are not a valid encoding of the expected type.
    #[error("cannot decode {what}: {msg}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's message.
        msg: String,
    },
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encode `value` (`what` names it in errors).
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| CodecError::Encode { what, msg: e.to_string() })
}

/// Encode `value` into `writer` (a hasher, a file), returning the bytes written.
pub fn encode_into<T: Serialize, W: std::io::Write>(
    what: &'static str,
    value: &T,
    writer: &mut W,
) -> Result<usize, CodecError> {
    bincode::serde::encode_into_std_write(value, writer, config())
        .map_err(|e| CodecError::Encode { what, msg: e.to_string() })
}

/// Decode a value that must fill `bytes` exactly (trailing bytes are an error).
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    // The serde decoder reserves at most the bytes that remain for a sequence (serde's
    // cautious size hint caps it further), so a forged length fails as "unexpected end".
    let limited = config().with_limit::<{ 1 << 40 }>();
    let (value, used) = bincode::serde::decode_from_slice(bytes, limited)
        .map_err(|e| CodecError::Decode { what, msg: e.to_string() })?;
    if used != bytes.len() {
        return Err(CodecError::Decode {
            what,
            msg: format!("{} trailing byte(s) after the value ({used} of {} used)", bytes.len() - used, bytes.len()),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Dim, SymId, TensorMeta};
    use proptest::prelude::*;

    #[test]
    fn round_trips_metadata() {
        let m = TensorMeta::contiguous(vec![Dim::sym(SymId(0)), Dim::Const(3)], DType::F32);
        let bytes = encode("meta", &m).unwrap();
        assert_eq!(decode::<TensorMeta>("meta", &bytes).unwrap(), m);
    }

    #[test]
    fn trailing_and_truncated_bytes_are_errors() {
        let bytes = encode("v", &vec![1u64, 2, 3]).unwrap();
        let mut long = bytes.clone();
        long.push(0);
        let e = decode::<Vec<u64>>("v", &long).unwrap_err();
        assert!(e.to_string().contains("trailing"), "{e}");
        assert!(decode::<Vec<u64>>("v", &bytes[..bytes.len() - 1]).is_err());
        assert!(decode::<Vec<u64>>("v", &[]).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<crate::Graph>("graph", &bytes);
            let _ = decode::<Vec<String>>("strings", &bytes);
            let _ = decode::<TensorMeta>("meta", &bytes);
        }
    }
}

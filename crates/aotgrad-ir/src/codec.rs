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
///
/// A sequence reserves at most what serde's cautious size hint allows, but bincode
/// allocates a string or byte buffer at its stated length before reading it: the
/// decoder's limit on such claims is what keeps a forged length (say 2^39) from
/// asking for memory the process cannot have (an abort, not an error). A valid
/// encoding never claims more than its own length (every claimed byte is then read),
/// so the limit is the input's length rounded up to one of three bounds.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    fn run<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8]) -> Result<(T, usize), String> {
        bincode::serde::decode_from_slice(bytes, config().with_limit::<LIMIT>()).map_err(|e| e.to_string())
    }
    let decoded = match bytes.len() {
        n if n <= 1 << 26 => run::<T, { 1 << 26 }>(bytes),
        n if n <= 1 << 32 => run::<T, { 1 << 32 }>(bytes),
        _ => run::<T, { 1 << 40 }>(bytes),
    };
    let (value, used) = decoded.map_err(|msg| CodecError::Decode { what, msg })?;
    if used != bytes.len() {
        return Err(CodecError::Decode {
            what,
            msg: format!("{} trailing byte(s) after the value ({used} of {} used)", bytes.len() - used, bytes.len()),
        });
    }
    Ok(value)
}

/// Largest expansion deflate can express (a stream of back-references): a packed
/// payload claiming more than this per compressed byte is corrupt.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// Encode `value` and compress it (deflate, fastest level): for bulky data kept only
/// in case it is needed (graphs for logs, an artifact's source graph). The bytes are
/// the uncompressed length (8 bytes, little endian) and the deflate stream.
pub fn pack<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    let raw = encode(what, value)?;
    let mut out = Vec::with_capacity(8 + raw.len() / 4);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    let mut z = flate2::write::DeflateEncoder::new(out, flate2::Compression::fast());
    std::io::Write::write_all(&mut z, &raw).map_err(|e| CodecError::Encode { what, msg: e.to_string() })?;
    z.finish().map_err(|e| CodecError::Encode { what, msg: e.to_string() })
}

/// Decode [`pack`]'s bytes. A length that the stream cannot hold, a stream that
/// inflates to more or fewer bytes than it says, or a malformed stream is an error,
/// and inflating never allocates more than the stated length.
pub fn unpack<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let bad = |msg: String| CodecError::Decode { what, msg };
    let (len, stream) = match bytes.split_first_chunk::<8>() {
        Some((len, stream)) => (u64::from_le_bytes(*len), stream),
        None => return Err(bad(format!("{} bytes is too short for a packed value", bytes.len()))),
    };
    if len > (stream.len() as u64).saturating_mul(MAX_DEFLATE_RATIO) {
        return Err(bad(format!("says it inflates to {len} bytes, more than {} compressed bytes can", stream.len())));
    }
    let mut raw = Vec::with_capacity(len as usize);
    let inflater = flate2::read::DeflateDecoder::new(stream);
    std::io::Read::read_to_end(&mut std::io::Read::take(inflater, len + 1), &mut raw)
        .map_err(|e| bad(format!("corrupt compressed stream: {e}")))?;
    if raw.len() as u64 != len {
        return Err(bad(format!(
            "inflates to {}{} bytes, it says {len}",
            raw.len(),
            if raw.len() as u64 > len { "+" } else { "" }
        )));
    }
    decode(what, &raw)
}

/// Byte fields (`#[serde(with = "aotgrad_ir::codec::bytes")]` on a `Vec<u8>`, or
/// [`Bytes`] where a type is needed): one byte string in the binary codec, decoded
/// through the borrowed path, which checks the stated length against the input
/// before anything is allocated and copies once (bincode's owned path allocates,
/// zeroes, then reads). Readable formats see a list of numbers, as `serde_bytes`
/// writes them.
pub mod bytes {
    use serde::{de, Deserializer, Serializer};

    /// Serialize (see the module).
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    /// Deserialize (see the module).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(V)
    }
}

/// A byte string field with [`bytes`]' encoding (for `Option`s and arrays of them).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Bytes(#[serde(with = "bytes")] pub Vec<u8>);

/// Zigzag LEB128 integers: how compact size lists ([`compact_dims`], and the kernel
/// plan's size table) write each size, stride and offset.
pub mod varint {
    /// Append `v` (small magnitudes, either sign, take one byte).
    #[inline]
    pub fn push(out: &mut impl Extend<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.extend([(z as u8) | 0x80]);
            z >>= 7;
        }
        out.extend([z as u8]);
    }

    /// Take one value off the front of `rest`; a truncated or overlong value is an
    /// error, never a panic.
    #[inline]
    pub fn read(rest: &mut &[u8]) -> Result<i64, &'static str> {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let (&b, r) = rest.split_first().ok_or("a truncated size list")?;
            *rest = r;
            if shift == 63 && b > 1 {
                return Err("a size overflows 64 bits");
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
            shift += 7;
        }
    }
}

/// The binary form of [`Dims`](crate::Dims) fields
/// (`#[serde(with = "aotgrad_ir::codec::compact_dims")]`): sizes and strides are most
/// of a graph's or a kernel plan's bytes, and decoding each dim as an enum through
/// serde's visitors was most of the time spent loading a plan. In the binary codec a
/// list of constant dims is one byte string: the count (below 255), then each value
/// as a zigzag LEB128 varint; a list holding a symbol (dynamic shapes) is the byte 255
/// and the list's ordinary encoding. Human-readable formats (`serde_json` dumps) keep
/// the plain list of dims.
pub mod compact_dims {
    use crate::{Dim, Dims};
    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    /// The first byte of a list encoded in the general (enum) form.
    const GENERAL: u8 = 255;

    /// Serialize (see the module).
    pub fn serialize<S: Serializer>(dims: &Dims, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return dims.serialize(s);
        }
        let mut buf: smallvec::SmallVec<[u8; 48]> = smallvec::SmallVec::new();
        if dims.len() < GENERAL as usize && dims.iter().all(|d| matches!(d, Dim::Const(_))) {
            buf.push(dims.len() as u8);
            for d in dims {
                if let Dim::Const(v) = d {
                    super::varint::push(&mut buf, *v);
                }
            }
        } else {
            buf.push(GENERAL);
            let general = super::encode("dims", &dims.as_slice()).map_err(serde::ser::Error::custom)?;
            buf.extend_from_slice(&general);
        }
        s.serialize_bytes(&buf)
    }

    /// Deserialize (see the module); malformed bytes are an error, never a panic.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Dims, D::Error> {
        if d.is_human_readable() {
            return Dims::deserialize(d);
        }
        d.deserialize_bytes(DimsVisitor)
    }

    /// Parse the bytes of one list.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Dims, String> {
        let (&count, mut rest) = bytes.split_first().ok_or("an empty dims list")?;
        if count == GENERAL {
            let v: Vec<Dim> = super::decode("dims", rest).map_err(|e| e.to_string())?;
            return Ok(v.into());
        }
        let mut out = Dims::with_capacity(count as usize);
        for _ in 0..count {
            out.push(Dim::Const(super::varint::read(&mut rest)?));
        }
        if !rest.is_empty() {
            return Err(format!("{} trailing byte(s) after a dims list", rest.len()));
        }
        Ok(out)
    }

    struct DimsVisitor;

    impl<'de> de::Visitor<'de> for DimsVisitor {
        type Value = Dims;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a compact dims list")
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Dims, E> {
            parse(v).map_err(E::custom)
        }
    }
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
    fn a_forged_length_is_an_error_not_an_allocation() {
        #[derive(Debug, serde::Serialize, serde::Deserialize)]
        struct S {
            name: String,
            #[serde(with = "serde_bytes_vec")]
            blob: Vec<u8>,
        }
        mod serde_bytes_vec {
            pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(v)
            }
            /// Through bincode's allocating path (what `serde_bytes` uses).
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = Vec<u8>;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("bytes")
                    }
                    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                        Ok(v)
                    }
                }
                d.deserialize_byte_buf(V)
            }
        }
        // 2^39 bytes, as bincode's largest varint (marker 253, then 8 bytes): for the
        // string, then for the byte buffer after a valid string.
        let huge = |prefix: &[u8]| {
            let mut b = prefix.to_vec();
            b.push(253);
            b.extend_from_slice(&(1u64 << 39).to_le_bytes());
            b.extend_from_slice(b"only a few bytes follow");
            b
        };
        assert!(decode::<S>("s", &huge(&[])).is_err());
        assert!(decode::<S>("s", &huge(&[2, b'o', b'k'])).is_err());
        assert!(decode::<String>("s", &huge(&[])).is_err());
        assert!(decode::<Vec<u8>>("s", &huge(&[])).is_err());
    }

    #[test]
    fn byte_fields_round_trip_and_check_their_length_first() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct S {
            #[serde(with = "bytes")]
            a: Vec<u8>,
            b: [Option<Bytes>; 2],
        }
        let v = S { a: vec![0, 1, 255], b: [Some(Bytes(vec![7; 300])), None] };
        let enc = encode("s", &v).unwrap();
        assert_eq!(decode::<S>("s", &enc).unwrap(), v);
        // Binary: one length and the bytes (as `serde_bytes` wrote them).
        assert_eq!(&enc[..4], &[3, 0, 1, 255]);
        let json = serde_json::to_string(&v).unwrap();
        assert!(json.starts_with(r#"{"a":[0,1,255]"#), "{json}");
        assert_eq!(serde_json::from_str::<S>(&json).unwrap(), v);
        let mut forged = vec![253];
        forged.extend_from_slice(&(1u64 << 39).to_le_bytes());
        forged.extend_from_slice(b"a few bytes");
        assert!(decode::<S>("s", &forged).is_err());
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

    #[test]
    fn packed_round_trip_and_defects() {
        let v: Vec<String> = (0..500).map(|i| format!("node {i} of a long and repetitive graph")).collect();
        let packed = pack("v", &v).unwrap();
        assert!(packed.len() * 4 < encode("v", &v).unwrap().len(), "{} bytes", packed.len());
        assert_eq!(unpack::<Vec<String>>("v", &packed).unwrap(), v);
        // A truncated stream, a wrong length, an impossible length, no length at all.
        assert!(unpack::<Vec<String>>("v", &packed[..packed.len() - 3]).is_err());
        let mut longer = packed.clone();
        longer[0] = longer[0].wrapping_add(1);
        let e = unpack::<Vec<String>>("v", &longer).unwrap_err().to_string();
        assert!(e.contains("inflates to"), "{e}");
        let mut bomb = packed.clone();
        bomb[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = unpack::<Vec<String>>("v", &bomb).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        assert!(unpack::<Vec<String>>("v", &[1, 2]).is_err());
        // Every flipped byte is an error or (deflate has no checksum) some value,
        // never a panic; the cache's envelope checksum is what catches flips.
        for i in 0..packed.len() {
            let mut f = packed.clone();
            f[i] ^= 0x55;
            let _ = unpack::<Vec<String>>("v", &f);
        }
    }

    #[test]
    fn compact_dims_round_trip_and_defects() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct S(#[serde(with = "compact_dims")] crate::Dims);
        let cases: Vec<crate::Dims> = vec![
            smallvec::smallvec![],
            smallvec::smallvec![Dim::Const(0), Dim::Const(1), Dim::Const(-1)],
            smallvec::smallvec![Dim::Const(i64::MAX), Dim::Const(i64::MIN), Dim::Const(63), Dim::Const(64)],
            (0..9).map(|i| Dim::Const(1 << (i * 7))).collect(),
            smallvec::smallvec![Dim::Const(4), Dim::sym(SymId(2)), Dim::sym(SymId(0)).mul(&Dim::Const(3))],
        ];
        for dims in cases {
            let bytes = encode("dims", &S(dims.clone())).unwrap();
            assert_eq!(decode::<S>("dims", &bytes).unwrap().0, dims);
            // The readable form is the plain list.
            let json = serde_json::to_string(&S(dims.clone())).unwrap();
            assert_eq!(json, serde_json::to_string(&dims).unwrap());
            assert_eq!(serde_json::from_str::<S>(&json).unwrap().0, dims);
        }
        // Three small dims take a length byte, a count byte and three bytes.
        let small = S(smallvec::smallvec![Dim::Const(8), Dim::Const(-3), Dim::Const(5)]);
        assert_eq!(encode("dims", &small).unwrap().len(), 5);
        // Truncated, trailing, overlong or empty lists are errors.
        assert!(compact_dims::parse(&[]).is_err());
        assert!(compact_dims::parse(&[2, 4]).is_err());
        assert!(compact_dims::parse(&[1, 4, 4]).is_err());
        assert!(compact_dims::parse(&[1, 0x80]).is_err());
        assert!(compact_dims::parse(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(compact_dims::parse(&[255, 9]).is_err());
    }

    #[test]
    fn decoded_locations_share_file_names() {
        let loc = |line| crate::SourceLoc { file: "src/model.rs".into(), line, col: 1 };
        let locs = vec![loc(1), loc(2)];
        let back: Vec<crate::SourceLoc> = decode("locs", &encode("locs", &locs).unwrap()).unwrap();
        assert_eq!(back, locs);
        assert!(std::sync::Arc::ptr_eq(&back[0].file, &back[1].file));
        let json: Vec<crate::SourceLoc> = serde_json::from_str(&serde_json::to_string(&locs).unwrap()).unwrap();
        assert_eq!(json, locs);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = unpack::<crate::Graph>("graph", &bytes);
            let _ = decode::<crate::Graph>("graph", &bytes);
            let _ = decode::<Vec<String>>("strings", &bytes);
            let _ = decode::<TensorMeta>("meta", &bytes);
            let _ = compact_dims::parse(&bytes);
        }
    }
}

//! The frame around every stored blob: a fixed header (magic, format version, kind,
//! payload length, checksum) in front of the payload. The checksum is blake3 over the
//! header fields and the payload; with a secret key it is blake3's keyed hash, a MAC:
//! a blob written without the key is rejected before a byte of it is decoded.

use crate::key::FORMAT_VERSION;

const MAGIC: &[u8; 8] = b"AOTGRAD\x1a";
/// Header length in bytes.
pub const HEADER_LEN: usize = 8 + 4 + 1 + 1 + 2 + 8 + 32;

/// What a blob holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A cache entry (one [`crate::StoredEntry`]).
    Entry = 1,
    /// An artifact's bytes in the content-addressed store.
    Artifact = 2,
    /// A precompiled function (bundled results for deployment).
    Precompiled = 3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Entry => "cache entry",
            Kind::Artifact => "artifact",
            Kind::Precompiled => "precompiled function",
        }
    }
}

/// Why a blob was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Shorter than a header (a zero-length or truncated file).
    #[error("{len} bytes is too short for a header ({HEADER_LEN} bytes): empty or truncated")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Not written by aotgrad.
    #[error("bad magic: not an aotgrad file")]
    BadMagic,
    /// Written by another format version.
    #[error("format version {found}, this build reads version {FORMAT_VERSION}")]
    WrongVersion {
        /// The version found.
        found: u32,
    },
    /// A blob of another kind.
    #[error("holds a {found} where a {expected} was expected")]
    WrongKind {
        /// What it holds.
        found: String,
        /// What was asked for.
        expected: &'static str,
    },
    /// The payload is shorter or longer than the header says (truncated or appended).
    #[error("payload is {found} bytes, the header says {expected}: truncated or corrupt")]
    Length {
        /// Bytes present.
        found: u64,
        /// Bytes promised.
        expected: u64,
    },
    /// The checksum does not match (a flipped bit anywhere).
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    /// Keyed and the MAC does not match: written without the key, or tampered with.
    #[error("MAC mismatch: written without this cache key, or tampered with")]
    Mac,
    /// Written without a key where one is required.
    #[error("not signed: written without a cache key, which this cache requires")]
    Unsigned,
    /// Signed with a key, and this cache has none to check it.
    #[error("signed with a cache key, and none is configured to check it (set AOTGRAD_CACHE_KEY)")]
    NoKey,
}

fn digest(fields: &[u8], payload: &[u8], key: Option<&[u8; 32]>) -> [u8; 32] {
    let mut h = match key {
        Some(k) => blake3::Hasher::new_keyed(k),
        None => blake3::Hasher::new(),
    };
    h.update(fields);
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Frame `payload` as a blob of `kind`, signed with `key` when given.
pub fn seal(kind: Kind, payload: &[u8], key: Option<&[u8; 32]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(kind as u8);
    out.push(u8::from(key.is_some()));
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let sum = digest(&out, payload, key);
    out.extend_from_slice(&sum);
    out.extend_from_slice(payload);
    out
}

/// Whether `bytes` carries an aotgrad header of this format version that says it is
/// signed (nothing else about it is checked; for tools and tests: a cache tells whose
/// an entry is by its id, not by this flag).
pub fn is_signed(bytes: &[u8]) -> bool {
    bytes.len() >= HEADER_LEN && &bytes[..8] == MAGIC && bytes[8..12] == FORMAT_VERSION.to_le_bytes() && bytes[13] == 1
}

/// Check a blob and return its payload. A blob signed with a key needs that key; with
/// `require_mac`, an unsigned blob is refused.
pub fn open<'a>(
    bytes: &'a [u8],
    kind: Kind,
    key: Option<&[u8; 32]>,
    require_mac: bool,
) -> Result<&'a [u8], EnvelopeError> {
    if bytes.len() < HEADER_LEN {
        return Err(EnvelopeError::TooShort { len: bytes.len() });
    }
    if &bytes[..8] != MAGIC {
        return Err(EnvelopeError::BadMagic);
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != FORMAT_VERSION {
        return Err(EnvelopeError::WrongVersion { found: version });
    }
    let fields = &bytes[..24];
    let payload = &bytes[HEADER_LEN..];
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let expected = u64::from_le_bytes(len);
    if payload.len() as u64 != expected {
        return Err(EnvelopeError::Length { found: payload.len() as u64, expected });
    }
    let signed = match bytes[13] {
        0 => false,
        1 => true,
        _ => return Err(EnvelopeError::Checksum),
    };
    let found = &bytes[24..HEADER_LEN];
    match (signed, key) {
        (true, None) => return Err(EnvelopeError::NoKey),
        (false, _) if require_mac => return Err(EnvelopeError::Unsigned),
        (true, Some(k)) => {
            if !constant_time_eq(&digest(fields, payload, Some(k)), found) {
                return Err(EnvelopeError::Mac);
            }
        }
        (false, _) => {
            if digest(fields, payload, None) != found {
                return Err(EnvelopeError::Checksum);
            }
        }
    }
    if bytes[12] != kind as u8 {
        let found = match bytes[12] {
            1 => Kind::Entry.name().to_string(),
            2 => Kind::Artifact.name().to_string(),
            3 => Kind::Precompiled.name().to_string(),
            k => format!("blob of unknown kind {k}"),
        };
        return Err(EnvelopeError::WrongKind { found, expected: kind.name() });
    }
    Ok(payload)
}

fn constant_time_eq(a: &[u8; 32], b: &[u8]) -> bool {
    // blake3's Hash equality is constant time.
    b.len() == 32
        && blake3::Hash::from_bytes(*a) == blake3::Hash::from_slice(b).unwrap_or(blake3::Hash::from_bytes([0; 32]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_every_defect_is_named() {
        let blob = seal(Kind::Entry, b"hello", None);
        assert_eq!(open(&blob, Kind::Entry, None, false).unwrap(), b"hello");
        assert_eq!(open(&[], Kind::Entry, None, false), Err(EnvelopeError::TooShort { len: 0 }));
        assert_eq!(
            open(&blob[..blob.len() - 1], Kind::Entry, None, false),
            Err(EnvelopeError::Length { found: 4, expected: 5 })
        );
        let mut v = blob.clone();
        let other = FORMAT_VERSION + 1;
        v[8] = other as u8;
        assert_eq!(open(&v, Kind::Entry, None, false), Err(EnvelopeError::WrongVersion { found: other }));
        assert!(matches!(open(&blob, Kind::Artifact, None, false), Err(EnvelopeError::WrongKind { .. })));
        assert_eq!(open(&blob, Kind::Entry, None, true), Err(EnvelopeError::Unsigned));
        // Every single flipped bit is caught.
        for i in 0..blob.len() {
            for bit in 0..8 {
                let mut f = blob.clone();
                f[i] ^= 1 << bit;
                assert!(open(&f, Kind::Entry, None, false).is_err(), "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn a_mac_needs_the_key() {
        let k = [7u8; 32];
        let blob = seal(Kind::Entry, b"payload", Some(&k));
        assert_eq!(open(&blob, Kind::Entry, Some(&k), true).unwrap(), b"payload");
        assert_eq!(open(&blob, Kind::Entry, Some(&[8u8; 32]), true), Err(EnvelopeError::Mac));
        assert_eq!(open(&blob, Kind::Entry, None, false), Err(EnvelopeError::NoKey));
        // Re-signing as unsigned after tampering does not pass a keyed cache.
        let unsigned = seal(Kind::Entry, b"evil", None);
        assert_eq!(open(&unsigned, Kind::Entry, Some(&k), true), Err(EnvelopeError::Unsigned));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = open(&bytes, Kind::Entry, None, false);
            let _ = open(&bytes, Kind::Entry, Some(&[1; 32]), true);
        }
    }
}

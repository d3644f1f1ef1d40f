//! Record encryption for S2 streams created with a cipher: each body is sealed with the client's
//! 256-bit key (AES-256-GCM, a fresh random nonce per record), so storage only ever holds
//! ciphertext and a read without the right key fails instead of returning it.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The ciphers a basin may name in `stream_cipher`.
pub const AES_256_GCM: &str = "aes-256-gcm";
const NONCE_LEN: usize = 12;
/// AES-GCM's authentication tag, after the ciphertext.
const TAG_LEN: usize = 16;

/// The length of the plaintext sealed in `sealed_len` bytes (S2 meters plaintext).
pub fn opened_len(sealed_len: usize) -> usize {
    sealed_len.saturating_sub(NONCE_LEN + TAG_LEN)
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CipherError {
    #[error("s2-encryption-key must be 32 bytes, base64-encoded")]
    BadKey,
    #[error("cipher {0:?} is not supported (supported: aes-256-gcm)")]
    Unsupported(String),
    #[error("the record could not be decrypted with this key")]
    DecryptionFailed,
}

/// A client's key, checked and ready to use.
#[derive(Clone)]
pub struct RecordKey {
    key: [u8; 32],
}

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(..)") // never log key material
    }
}

impl RecordKey {
    /// Parses the `s2-encryption-key` header value.
    pub fn from_base64(text: &str) -> Result<RecordKey, CipherError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| CipherError::BadKey)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| CipherError::BadKey)?;
        Ok(RecordKey { key })
    }

    /// A digest that identifies the key without revealing it, to refuse appends under another key.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"runnel record key\0");
        hasher.update(self.key);
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn seal(&self, plaintext: &[u8]) -> Bytes {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&self.key));
        // Encryption with a valid key and nonce length cannot fail.
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), plaintext)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Bytes::from(out)
    }

    pub fn open(&self, sealed: &[u8]) -> Result<Bytes, CipherError> {
        let (nonce, ciphertext) = sealed
            .split_at_checked(NONCE_LEN)
            .ok_or(CipherError::DecryptionFailed)?;
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&self.key));
        cipher
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map(Bytes::from)
            .map_err(|_| CipherError::DecryptionFailed)
    }
}

/// Checks a basin's `stream_cipher`.
pub fn check_cipher(name: &str) -> Result<(), CipherError> {
    if name == AES_256_GCM {
        Ok(())
    } else {
        Err(CipherError::Unsupported(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> RecordKey {
        RecordKey::from_base64(&base64::engine::general_purpose::STANDARD.encode([byte; 32]))
            .unwrap()
    }

    #[test]
    fn sealed_records_open_with_their_key_only() {
        let sealed = key(1).seal(b"secret");
        assert!(
            !sealed.windows(6).any(|w| w == b"secret"),
            "no plaintext in storage"
        );
        assert_eq!(key(1).open(&sealed).unwrap(), "secret");
        assert_eq!(opened_len(sealed.len()), b"secret".len());
        assert_eq!(key(2).open(&sealed), Err(CipherError::DecryptionFailed));
        assert_eq!(key(1).open(b"short"), Err(CipherError::DecryptionFailed));
    }

    #[test]
    fn keys_must_be_32_bytes_of_base64() {
        assert_eq!(
            RecordKey::from_base64("not base64!").unwrap_err(),
            CipherError::BadKey
        );
        assert_eq!(
            RecordKey::from_base64("AAAA").unwrap_err(),
            CipherError::BadKey
        );
        assert_ne!(key(1).fingerprint(), key(2).fingerprint());
    }

    #[test]
    fn only_aes_256_gcm_is_offered() {
        assert!(check_cipher("aes-256-gcm").is_ok());
        assert!(check_cipher("aegis-256").is_err());
    }
}

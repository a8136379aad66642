//! Session-bound tokens: `dst1.<session id, hex>.<HMAC-SHA256 of it, hex>`. Nothing is
//! stored: a token is valid for its session as long as the server keeps its key.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use dormant::SessionId;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const PREFIX: &str = "dst1.";
const KEY_BYTES: usize = 32;

/// The key that signs session tokens. Tokens issued under one key are valid until the key
/// changes: keep it (see [`TokenKey::load_or_create`]) for tokens to survive a restart.
#[derive(Clone)]
pub struct TokenKey([u8; KEY_BYTES]);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Not a token of this server (malformed, or signed under another key).
    Invalid,
}

impl TokenKey {
    /// A new random key (from the operating system's generator).
    ///
    /// # Errors
    /// The generator failed.
    pub fn random() -> io::Result<Self> {
        let mut key = [0u8; KEY_BYTES];
        getrandom::fill(&mut key).map_err(|error| io::Error::other(error.to_string()))?;
        Ok(Self(key))
    }

    /// A key from its bytes (32 of them).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// Reads the key kept in `path`, or creates one there (readable by the owner only) if the
    /// file does not exist.
    ///
    /// A missing file is not always a first start: if the store already holds sessions, their
    /// tokens were signed with a key that is gone, and a new one makes every one of them
    /// invalid (401). The `dormant-server` binary refuses that unless told to
    /// (`--new-token-key`): a daemon that can tell a new store from an old one should use
    /// [`TokenKey::load`] and [`TokenKey::create`] to do the same.
    ///
    /// # Errors
    /// The file could not be read or written, or does not hold a 32-byte key.
    pub fn load_or_create(path: &Path) -> io::Result<Self> {
        if let Some(key) = Self::load(path)? {
            return Ok(key);
        }
        match Self::create(path) {
            // Another process (a node started at the same moment) made it first: use its.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Self::load(path)?
                .ok_or_else(|| io::Error::other(format!("{} vanished", path.display()))),
            created => created,
        }
    }

    /// Reads the key kept in `path`; `None` if there is no such file.
    ///
    /// # Errors
    /// The file could not be read, or does not hold a 32-byte key.
    pub fn load(path: &Path) -> io::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|bytes: Vec<u8>| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} holds {} bytes, not a {KEY_BYTES}-byte token key",
                            path.display(),
                            bytes.len()
                        ),
                    )
                })?;
                Ok(Some(Self(key)))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Creates a new random key in `path` (readable by the owner only), which must not exist.
    /// The file appears whole or not at all: it is written beside `path` and linked there, so
    /// that a node reading it at the same moment never reads half a key.
    ///
    /// # Errors
    /// The file exists ([`io::ErrorKind::AlreadyExists`]), or could not be written.
    pub fn create(path: &Path) -> io::Result<Self> {
        let key = Self::random()?;
        let mut draft = path.as_os_str().to_os_string();
        draft.push(format!(".{}.new", hex(&Self::random()?.0[..8])));
        let draft = std::path::PathBuf::from(draft);
        let written = (|| {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&draft)?;
            file.write_all(&key.0)?;
            file.sync_all()?;
            // A link, not a rename: it fails if `path` exists instead of replacing it.
            std::fs::hard_link(&draft, path)
        })();
        let _ = std::fs::remove_file(&draft);
        written.map(|()| key)
    }

    /// A name for the key that does not reveal it: 16 hex digits of an HMAC of a fixed text
    /// under it. Two nodes whose fingerprints differ sign with different keys; the binary
    /// records it in a shared store to refuse a node started with another key.
    pub fn fingerprint(&self) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"dormant-token-key-fingerprint");
        hex(&mac.finalize().into_bytes()[..8])
    }

    /// The token that authorizes `session`.
    pub fn issue(&self, session: &SessionId) -> String {
        let id = hex(session.as_str().as_bytes());
        let mac = hex(&self.mac(session.as_str()).finalize().into_bytes());
        format!("{PREFIX}{id}.{mac}")
    }

    /// The session a token authorizes, if this key signed it.
    pub(crate) fn verify(&self, token: &str) -> Result<String, TokenError> {
        let rest = token.strip_prefix(PREFIX).ok_or(TokenError::Invalid)?;
        let (id, mac) = rest.split_once('.').ok_or(TokenError::Invalid)?;
        let id = String::from_utf8(unhex(id).ok_or(TokenError::Invalid)?)
            .map_err(|_| TokenError::Invalid)?;
        let mac = unhex(mac).ok_or(TokenError::Invalid)?;
        // Constant time: the comparison does not tell how much of a forged MAC was right.
        self.mac(&id)
            .verify_slice(&mac)
            .map_err(|_| TokenError::Invalid)?;
        Ok(id)
    }

    /// The HMAC of `data` under this key, in the name of `domain` (so a signature made for
    /// one kind of token is never valid for another).
    pub(crate) fn sign(&self, domain: &[u8], data: &[u8]) -> Vec<u8> {
        self.domain_mac(domain, data)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// Whether `mac` is this key's signature of `data` for `domain` (in constant time).
    pub(crate) fn signed(&self, domain: &[u8], data: &[u8], mac: &[u8]) -> bool {
        self.domain_mac(domain, data).verify_slice(mac).is_ok()
    }

    fn domain_mac(&self, domain: &[u8], data: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(domain);
        mac.update(b"\0");
        mac.update(data);
        mac
    }

    fn mac(&self, session: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"dormant-session-token\0");
        mac.update(session.as_bytes());
        mac
    }
}

/// Whether `text` looks like a session token (rather than a credential for the hook).
pub(crate) fn is_token(text: &str) -> bool {
    text.starts_with(PREFIX)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // One allocation, not one `format!` per byte: a token is issued on every start.
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// The bytes of lower-case hex, the one form [`hex`] writes: a token has one spelling, so
/// an upper-case copy of a token is not a second valid token.
fn unhex(text: &str) -> Option<Vec<u8>> {
    unhex_within(text, 1024)
}

/// [`unhex`] of at most `limit` characters.
pub(crate) fn unhex_within(text: &str, limit: usize) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || text.len() > limit {
        return None;
    }
    fn digit(byte: u8) -> Option<u8> {
        match byte {
            b'0'..=b'9' => Some(byte - b'0'),
            b'a'..=b'f' => Some(byte - b'a' + 10),
            _ => None,
        }
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| match pair {
            [high, low] => Some((digit(*high)? << 4) | digit(*low)?),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_unhex_are_each_others_inverse() {
        let bytes = [0x00, 0x0f, 0xab, 0xff];
        assert_eq!(hex(&bytes), "000fabff");
        assert_eq!(unhex("000fabff"), Some(bytes.to_vec()));
        assert_eq!(unhex("000FABFF"), None);
        assert_eq!(unhex("0g"), None);
    }

    #[test]
    fn a_token_names_its_session_and_only_this_key_signed_it(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let key = TokenKey::from_bytes([7; 32]);
        let id: SessionId = "s-1".parse()?;
        let token = key.issue(&id);
        assert_eq!(key.verify(&token), Ok("s-1".to_string()));
        assert_eq!(
            TokenKey::from_bytes([8; 32]).verify(&token),
            Err(TokenError::Invalid)
        );
        let forged = token.replacen(&hex(b"s-1"), &hex(b"s-2"), 1);
        assert_eq!(key.verify(&forged), Err(TokenError::Invalid));
        for garbage in [
            "",
            "dst1.",
            "dst1.zz.00",
            "dst1.00",
            "Bearer x",
            "dst1.733.ab",
        ] {
            assert_eq!(key.verify(garbage), Err(TokenError::Invalid), "{garbage:?}");
        }
        Ok(())
    }

    #[test]
    fn a_kept_key_is_read_back() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("key");
        let first = TokenKey::load_or_create(&path)?;
        let again = TokenKey::load_or_create(&path)?;
        assert_eq!(first.0, again.0);
        assert_eq!(first.fingerprint(), again.fingerprint());
        assert_eq!(first.fingerprint().len(), 16);
        assert_ne!(first.fingerprint(), TokenKey::random()?.fingerprint());
        assert!(TokenKey::create(&path).is_err(), "create never overwrites");
        std::fs::write(&path, b"short")?;
        assert!(TokenKey::load_or_create(&path).is_err());
        assert!(TokenKey::load(&dir.path().join("missing"))?.is_none());
        Ok(())
    }
}

//! Signed approval tokens: one approval request, handed to a person's device as a link. A
//! token names the call (its root, the session that made it, its approval id) and what it is
//! bound to, and expires with the call's deadline; whoever holds it may approve or deny that
//! call and nothing else, with no other credential. Nothing is stored: it is
//! `dat1.<the grant as JSON, hex>.<HMAC-SHA256 of it under the server's token key, hex>`, so
//! it is valid on every node that shares the key and across restarts. A decision made with it
//! is submitted bound to the request it names, so a call whose input or tool changed since is
//! `stale_approval`; a second decision is `already_completed` (first writer wins).

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::token::{hex, unhex_within, TokenKey};

const PREFIX: &str = "dat1.";
const DOMAIN: &[u8] = b"dormant-approval-token";
/// The longest grant a token carries, in hex characters: ids of a few hundred bytes each.
const MAX_GRANT_HEX: usize = 8 * 1024;

/// What an approval token grants: a decision on this one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApprovalGrant {
    /// The root session, where the decision is submitted.
    pub(crate) root: String,
    /// The session that made the call (the root, or a sub-agent under it).
    pub(crate) owner: String,
    pub(crate) call: String,
    pub(crate) approval_id: String,
    /// The request's binding, if it has one: the decision is bound to it.
    pub(crate) binding: Option<String>,
    /// When the token stops working (the server's clock, ms): the call's deadline.
    pub(crate) expires_at_ms: u64,
}

impl ApprovalGrant {
    /// The token for this grant.
    pub(crate) fn issue(&self, key: &TokenKey) -> Result<String, ApiError> {
        let grant = serde_json::to_vec(self).map_err(|error| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("approval grant: {error}"),
            )
        })?;
        let mac = key.sign(DOMAIN, &grant);
        Ok(format!("{PREFIX}{}.{}", hex(&grant), hex(&mac)))
    }

    /// The grant of `token`, if this server's key signed it and it has not expired at `now`.
    pub(crate) fn verify(key: &TokenKey, token: &str, now: u64) -> Result<Self, ApiError> {
        let invalid = || {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the approval token is not one this server issued",
            )
        };
        let rest = token.strip_prefix(PREFIX).ok_or_else(invalid)?;
        let (grant, mac) = rest.split_once('.').ok_or_else(invalid)?;
        let grant = unhex_within(grant, MAX_GRANT_HEX).ok_or_else(invalid)?;
        let mac = unhex_within(mac, 64).ok_or_else(invalid)?;
        if !key.signed(DOMAIN, &grant, &mac) {
            return Err(invalid());
        }
        let grant: Self = serde_json::from_slice(&grant).map_err(|_| invalid())?;
        if now >= grant.expires_at_ms {
            return Err(ApiError::new(
                StatusCode::GONE,
                "token_expired",
                "the approval token expired with the call it was for",
            ));
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> ApprovalGrant {
        ApprovalGrant {
            root: "s1".into(),
            owner: "s1-sub-h1".into(),
            call: "d1".into(),
            approval_id: "run::d1".into(),
            binding: Some("ab".repeat(32)),
            expires_at_ms: 10_000,
        }
    }

    #[test]
    fn a_token_grants_what_it_was_issued_for_until_it_expires() -> Result<(), ApiError> {
        let key = TokenKey::from_bytes([7; 32]);
        let token = grant().issue(&key)?;
        assert_eq!(ApprovalGrant::verify(&key, &token, 9_999)?, grant());
        let expired = ApprovalGrant::verify(&key, &token, 10_000).map(drop);
        assert_eq!(expired.map_err(|error| error.code()), Err("token_expired"));
        Ok(())
    }

    #[test]
    fn a_token_of_another_key_another_kind_or_altered_is_refused() -> Result<(), ApiError> {
        let key = TokenKey::from_bytes([7; 32]);
        let token = grant().issue(&key)?;
        let refused = |token: &str| {
            ApprovalGrant::verify(&key, token, 0)
                .map(drop)
                .map_err(|error| error.code())
        };
        let other = grant().issue(&TokenKey::from_bytes([8; 32]))?;
        assert_eq!(refused(&other), Err("invalid_token"));
        // A session token of the same key is no approval token.
        let session = key.issue(&"s1".parse().map_err(|_| ApiError::invalid("id"))?);
        assert_eq!(refused(&session), Err("invalid_token"));
        // Another grant under the first one's signature.
        let (_, mac) = token.rsplit_once('.').unwrap_or_default();
        let mut wider = grant();
        wider.expires_at_ms = u64::MAX;
        let forged = format!(
            "{PREFIX}{}.{mac}",
            hex(&serde_json::to_vec(&wider).unwrap_or_default())
        );
        assert_eq!(refused(&forged), Err("invalid_token"));
        assert_eq!(refused("dat1.zz.zz"), Err("invalid_token"));
        assert_eq!(refused(""), Err("invalid_token"));
        Ok(())
    }
}

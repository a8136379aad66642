//! Values every node sharing the database must agree on, recorded once
//! (`dormant_settings`): the fingerprint of the key the nodes sign session tokens with, say,
//! so that a node started with another key is refused at start instead of refusing every
//! token the others issued.

use super::{db, Error, PgStore};

/// A value recorded in the database, with a note of who recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSetting {
    /// The value.
    pub value: String,
    /// Who recorded it, in words (a node's name, the file the value came from).
    pub note: String,
}

impl PgStore {
    /// Records `value` under `name` unless a value is recorded there already, and returns the
    /// value in force: `value` (with `note`) for the first node to claim it, what another node
    /// recorded otherwise. Every node and anyone who reads the database sees it: never a
    /// secret.
    ///
    /// # Errors
    /// A closed store, or a backend failure.
    pub async fn claim_setting(
        &self,
        name: &str,
        value: &str,
        note: &str,
    ) -> Result<PgSetting, Error> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO dormant_settings (name, value, note) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
                &[&name, &value, &note],
            )
            .await
            .map_err(db)?;
        // Whoever won: values are never changed but by `replace_setting`.
        self.setting(name)
            .await?
            .ok_or_else(|| Error::backend(format!("the setting {name} vanished as it was claimed")))
    }

    /// The value recorded under `name`, if any.
    ///
    /// # Errors
    /// A closed store, or a backend failure.
    pub async fn setting(&self, name: &str) -> Result<Option<PgSetting>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT value, note FROM dormant_settings WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(db)?;
        row.map(|row| {
            Ok(PgSetting {
                value: row.try_get(0).map_err(db)?,
                note: row.try_get(1).map_err(db)?,
            })
        })
        .transpose()
    }

    /// Records `value` under `name`, replacing whatever was recorded there.
    ///
    /// # Errors
    /// A closed store, or a backend failure.
    pub async fn replace_setting(&self, name: &str, value: &str, note: &str) -> Result<(), Error> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO dormant_settings (name, value, note) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value, note = excluded.note, \
                 set_at = now()",
                &[&name, &value, &note],
            )
            .await
            .map_err(db)?;
        Ok(())
    }
}

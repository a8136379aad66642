//! Versioned migrations, run when a store opens: each one once, in order, in a transaction
//! that holds an advisory lock, so nodes that open the same database at once apply each
//! migration exactly once. A database migrated by a newer dormant is refused rather than
//! written in a layout this version does not know.

use deadpool_postgres::Object;

use super::db;
use crate::store::Error;

/// The advisory lock key migrations hold (any constant; "dormant" in ASCII).
const LOCK: i64 = 0x0064_6f72_6d61_6e74;

/// The migrations, in order; a migration's version is its position from 1. Never edit one
/// that shipped: add another.
const MIGRATIONS: [&str; 5] = [
    // 1: every tree in one table, ordered by (tree, key).
    "CREATE TABLE dormant_kv (
         tree smallint NOT NULL,
         key bytea NOT NULL,
         value bytea NOT NULL,
         PRIMARY KEY (tree, key)
     )",
    // 2: one owner per session: its lease, with an epoch that only grows.
    "CREATE TABLE dormant_leases (
         session text PRIMARY KEY,
         owner text NOT NULL,
         epoch bigint NOT NULL,
         expires_at timestamptz NOT NULL
     )",
    // 3: the nodes, with the address others forward requests to and their last heartbeat.
    "CREATE TABLE dormant_nodes (
         node text PRIMARY KEY,
         address text NOT NULL,
         heartbeat_at timestamptz NOT NULL
     )",
    // 4: node liveness: a node renews its own row, not each of its leases; a lease is held
    // while it is not given up (`expires_at` in the future, 'infinity' once taken) and its
    // owner's row is live. Every node has a row, with an address or without, and the key its
    // peers call it with.
    "ALTER TABLE dormant_nodes ALTER COLUMN address DROP NOT NULL;
     ALTER TABLE dormant_nodes ADD COLUMN expires_at timestamptz NOT NULL DEFAULT '-infinity';
     ALTER TABLE dormant_nodes ADD COLUMN peer_key text",
    // 5: values every node must agree on (the fingerprint of the token key), each recorded
    // once, with who recorded it.
    "CREATE TABLE dormant_settings (
         name text PRIMARY KEY,
         value text NOT NULL,
         note text NOT NULL,
         set_at timestamptz NOT NULL DEFAULT now()
     )",
];

pub(super) async fn run(client: &mut Object) -> Result<(), Error> {
    let transaction = client.transaction().await.map_err(db)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(db)?;
    transaction
        .execute(
            "CREATE TABLE IF NOT EXISTS dormant_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
            &[],
        )
        .await
        .map_err(db)?;
    let row = transaction
        .query_one(
            "SELECT coalesce(max(version), 0) FROM dormant_migrations",
            &[],
        )
        .await
        .map_err(db)?;
    let applied: i32 = row.try_get(0).map_err(db)?;
    let known = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
    if applied > known {
        return Err(Error::backend(format!(
            "the database is at migration {applied}; this dormant knows {known}: upgrade dormant"
        )));
    }
    for (index, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(applied).unwrap_or(0))
    {
        let version = i32::try_from(index + 1).unwrap_or(i32::MAX);
        transaction.batch_execute(sql).await.map_err(db)?;
        transaction
            .execute(
                "INSERT INTO dormant_migrations (version) VALUES ($1)",
                &[&version],
            )
            .await
            .map_err(db)?;
        tracing::info!(version, "store.postgres_migrated");
    }
    transaction.commit().await.map_err(db)
}

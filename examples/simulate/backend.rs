//! The store the default mode runs on: the sled store (`--store DIR`, or a temporary
//! directory), `FjallStore` there with `--engine fjall`, `JournalStore` with
//! `--engine journal`, or with `--postgres URL` a PostgreSQL database (`--features postgres`).

use std::path::PathBuf;
use std::sync::Arc;

use dormant::{FjallStore, JournalStore, SledStore};

use crate::{Args, DurabilityArg, EngineArg};

/// The store of one run.
pub(crate) enum Backend {
    Sled {
        /// Removed at exit when the run made it.
        _temp: Option<tempfile::TempDir>,
        path: PathBuf,
        store: Arc<SledStore>,
    },
    Fjall {
        /// Removed at exit when the run made it.
        _temp: Option<tempfile::TempDir>,
        path: PathBuf,
        store: Arc<FjallStore>,
    },
    Journal {
        /// Removed at exit when the run made it.
        _temp: Option<tempfile::TempDir>,
        path: PathBuf,
        store: Arc<JournalStore>,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        store: Arc<dormant::PgStore>,
        /// The server's WAL flushes when the run began.
        wal_before: u64,
    },
}

/// What a PostgreSQL run measures of its store, read before the store closes.
pub(crate) struct PgTotals {
    pub(crate) bytes: u64,
    pub(crate) transactions: u64,
    pub(crate) wal_syncs: u64,
}

impl Backend {
    pub(crate) async fn open(args: &Args) -> anyhow::Result<Self> {
        match (&args.postgres, args.engine) {
            (None, EngineArg::Sled) => {
                let (temp, path, store) = crate::open_store(args)?;
                Ok(Self::Sled {
                    _temp: temp,
                    path,
                    store,
                })
            }
            (None, EngineArg::Fjall) => Self::fjall(args),
            (None, EngineArg::Journal) => Self::journal(args),
            (Some(_), EngineArg::Fjall | EngineArg::Journal) => {
                anyhow::bail!(
                    "--engine {:?} is an embedded store: it does not go with --postgres",
                    args.engine
                )
            }
            (Some(url), EngineArg::Sled) => Self::postgres(url).await,
        }
    }

    fn fjall(args: &Args) -> anyhow::Result<Self> {
        power_loss_in_groups(args)?;
        let (temp, path) = crate::store_dir(args)?;
        let store = FjallStore::open(&path).map_err(|error| {
            anyhow::anyhow!("opening the fjall store at {}: {error}", path.display())
        })?;
        Ok(Self::Fjall {
            _temp: temp,
            path,
            store: Arc::new(store),
        })
    }

    fn journal(args: &Args) -> anyhow::Result<Self> {
        power_loss_in_groups(args)?;
        let (temp, path) = crate::store_dir(args)?;
        let store = JournalStore::open(&path).map_err(|error| {
            anyhow::anyhow!("opening the journal store at {}: {error}", path.display())
        })?;
        Ok(Self::Journal {
            _temp: temp,
            path,
            store: Arc::new(store),
        })
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str) -> anyhow::Result<Self> {
        let store = Arc::new(dormant::PgStore::connect(url).await?);
        let wal_before = store.wal_syncs().await?;
        Ok(Self::Postgres { store, wal_before })
    }

    #[cfg(not(feature = "postgres"))]
    async fn postgres(_url: &str) -> anyhow::Result<Self> {
        anyhow::bail!(
            "--postgres needs the PostgreSQL store: cargo run --release --features postgres --example simulate -- --postgres URL"
        )
    }

    pub(crate) fn store(&self) -> Arc<dyn dormant::store::Store> {
        match self {
            Self::Sled { store, .. } => Arc::clone(store) as Arc<dyn dormant::store::Store>,
            Self::Fjall { store, .. } => Arc::clone(store) as Arc<dyn dormant::store::Store>,
            Self::Journal { store, .. } => Arc::clone(store) as Arc<dyn dormant::store::Store>,
            #[cfg(feature = "postgres")]
            Self::Postgres { store, .. } => Arc::clone(store) as Arc<dyn dormant::store::Store>,
        }
    }

    /// Who owns which tree: the PostgreSQL store's leases (`None` for sled, alone on it).
    pub(crate) fn leases(&self) -> Option<Arc<dyn dormant::cluster::leases::Leases>> {
        match self {
            Self::Sled { .. } | Self::Fjall { .. } | Self::Journal { .. } => None,
            #[cfg(feature = "postgres")]
            Self::Postgres { store, .. } => {
                Some(Arc::clone(store) as Arc<dyn dormant::cluster::leases::Leases>)
            }
        }
    }

    /// A PostgreSQL run's totals (`None` for sled, measured once its store is closed).
    pub(crate) async fn postgres_totals(&self) -> anyhow::Result<Option<PgTotals>> {
        match self {
            Self::Sled { .. } | Self::Fjall { .. } | Self::Journal { .. } => Ok(None),
            #[cfg(feature = "postgres")]
            Self::Postgres { store, wal_before } => Ok(Some(PgTotals {
                bytes: dormant::store::Store::size_on_disk(store.as_ref()).await?,
                transactions: store.transaction_count(),
                wal_syncs: store.wal_syncs().await?.saturating_sub(*wal_before),
            })),
        }
    }

    /// Every transaction the PostgreSQL store made in the database so far (`None` for sled).
    pub(crate) fn database_transactions(&self) -> Option<u64> {
        match self {
            Self::Sled { .. } | Self::Fjall { .. } | Self::Journal { .. } => None,
            #[cfg(feature = "postgres")]
            Self::Postgres { store, .. } => Some(store.database_transactions()),
        }
    }

    /// The bytes on disk and the flushes (fjall's and the journal's syncs) of an embedded
    /// store's run, once its store is closed. fjall makes its journal 32 MiB at once, and the
    /// journal store its files 64 MiB: their bytes are those the files take on disk, not
    /// their lengths.
    pub(crate) fn sled_totals(&self) -> anyhow::Result<Option<(u64, u64)>> {
        match self {
            Self::Sled { path, store, .. } => {
                Ok(Some((crate::dir_size(path)?, store.flush_count())))
            }
            Self::Fjall { path, store, .. } => {
                Ok(Some((crate::dir_allocated(path)?, store.sync_count())))
            }
            Self::Journal { path, store, .. } => {
                Ok(Some((crate::dir_allocated(path)?, store.sync_count())))
            }
            #[cfg(feature = "postgres")]
            Self::Postgres { .. } => Ok(None),
        }
    }

    /// The sled directory a run kept (`--store DIR`), for the report.
    pub(crate) fn kept_path(&self, args: &Args) -> Option<PathBuf> {
        match self {
            Self::Sled { path, .. } | Self::Fjall { path, .. } | Self::Journal { path, .. }
                if args.store.is_some() =>
            {
                Some(path.clone())
            }
            _ => None,
        }
    }
}

/// fjall and the journal are power-loss safe with group commit only.
fn power_loss_in_groups(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.durability == DurabilityArg::PowerLoss && !args.no_group_commit,
        "--engine {:?} is power-loss safe with group commit only: drop --durability process-crash and --no-group-commit",
        args.engine
    );
    Ok(())
}

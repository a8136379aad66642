//! `PgStore` groups what many sessions ask of the database at once (issue 30): reads queued
//! together are answered by one statement, each with what it would have read alone, and
//! lease takes queued together are one statement too, a refused one still naming its owner.
//! The tests run on a current-thread runtime, where every request of a `join` is queued
//! before the store's tasks run, so the groups they form are known.
#![cfg(feature = "postgres")]

use std::time::Duration;

use dormant::cluster::leases::Leases;
use dormant::store::{Batch, CommitKind, Error, Store, Tree};
use dormant::testkit::PgCluster;
use dormant::PgStore;

/// A store whose renewal does not come during a test (a renewal is a transaction too).
async fn store(url: &str, node: &str) -> anyhow::Result<PgStore> {
    Ok(PgStore::builder(url)
        .node(node)
        .lease_ttl(Duration::from_secs(600))
        .connect()
        .await?)
}

#[tokio::test]
async fn reads_queued_together_are_one_transaction_and_each_reads_what_it_would_alone(
) -> anyhow::Result<()> {
    let Some(cluster) = PgCluster::start()? else {
        return Ok(());
    };
    let store = store(&cluster.url(), "a").await?;
    let mut batch = Batch::new(CommitKind::Other);
    for index in 0..20u8 {
        batch.put(Tree::Pending, vec![b's', index], vec![index]);
        batch.put(Tree::Log, vec![b'l', index], vec![100 + index]);
    }
    store.commit(batch).await?;

    let before = store.database_transactions();
    let (present, absent, prefix, newest, range) = tokio::join!(
        store.get(Tree::Pending, &[b's', 3]),
        store.get(Tree::Pending, &[b's', 99]),
        store.scan_prefix(Tree::Pending, b"s"),
        store.scan_prefix_rev(Tree::Log, b"l", 2),
        store.scan_range(Tree::Log, &[b'l', 5], &[b'l', 9], 3),
    );
    let many = futures::future::join_all((0..50u8).map(|index| {
        let store = &store;
        async move { store.get(Tree::Pending, &[b's', index % 25]).await }
    }))
    .await;
    // The five reads went together, then the fifty: two statements, two transactions.
    assert_eq!(store.database_transactions() - before, 2);

    assert_eq!(present?, Some(vec![3]));
    assert_eq!(absent?, None);
    let prefix = prefix?;
    assert_eq!(prefix.len(), 20);
    assert!(prefix.windows(2).all(|pair| pair[0].0 < pair[1].0));
    assert_eq!(
        newest?,
        vec![(vec![b'l', 19], vec![119]), (vec![b'l', 18], vec![118])]
    );
    assert_eq!(
        range?,
        vec![
            (vec![b'l', 5], vec![105]),
            (vec![b'l', 6], vec![106]),
            (vec![b'l', 7], vec![107]),
        ]
    );
    for (index, read) in many.into_iter().enumerate() {
        let expected = u8::try_from(index % 25)?;
        assert_eq!(read?, (expected < 20).then_some(vec![expected]));
    }
    store.close().await?;
    Ok(())
}

#[tokio::test]
async fn lease_takes_queued_together_are_one_statement_and_a_refusal_names_the_owner(
) -> anyhow::Result<()> {
    let Some(cluster) = PgCluster::start()? else {
        return Ok(());
    };
    let other = store(&cluster.url(), "other").await?;
    other.acquire("held", "held").await?;
    let store = store(&cluster.url(), "this").await?;

    let before = store.database_transactions();
    let takes =
        futures::future::join_all((0..30).map(|index| format!("tree-{index}")).map(|lease| {
            let store = &store;
            async move { store.acquire(&lease, &lease).await }
        }))
        .await;
    assert!(takes.iter().all(Result::is_ok), "{takes:?}");
    assert!((0..30).all(|index| store.holds(&format!("tree-{index}"))));
    // Thirty trees' leases in one statement.
    assert_eq!(store.database_transactions() - before, 1);

    let before = store.database_transactions();
    let (mine, theirs) = tokio::join!(
        store.acquire("fresh", "fresh"),
        store.acquire("held", "held")
    );
    mine?;
    match theirs {
        Err(Error::LeaseHeld { session, owner }) => {
            assert_eq!((session.as_str(), owner.as_str()), ("held", "other"));
        }
        other => panic!("a lease another live node holds is refused, got {other:?}"),
    }
    // The take, then the refused lease's owner looked up.
    assert_eq!(store.database_transactions() - before, 2);
    assert!(!store.holds("held"));
    store.close().await?;
    other.close().await?;
    Ok(())
}

/// Commits queued together are one group, and the first group of a store whose lease on one
/// session was taken over writes the others of the group and refuses that one alone
/// (`LeaseLost`, nothing of it written): the check that finds the lease gone aborts the
/// one-round-trip transaction, and the group is written again knowing which lease is held.
#[tokio::test]
async fn a_group_with_a_lease_taken_over_writes_the_others_and_refuses_that_one(
) -> anyhow::Result<()> {
    let Some(cluster) = PgCluster::start()? else {
        return Ok(());
    };
    let this = store(&cluster.url(), "this").await?;
    let (lost, kept) = tokio::join!(this.acquire("lost", "lost"), this.acquire("kept", "kept"));
    lost?;
    kept?;
    // This node's lease on `lost` expires (by the database's clock), and another node takes it;
    // this one does not know.
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    sql.execute(
        "UPDATE dormant_leases SET expires_at = now() - interval '1 second' WHERE session = 'lost'",
        &[],
    )
    .await?;
    let other = store(&cluster.url(), "other").await?;
    other.acquire("lost", "lost").await?;
    assert!(this.holds("lost"), "this node has not learnt it yet");

    let write = |session: &str| {
        let mut batch = Batch::new(CommitKind::Other).for_session(session);
        batch.put(Tree::Pending, session.as_bytes().to_vec(), b"v".to_vec());
        batch
    };
    let (refused, written) = tokio::join!(this.commit(write("lost")), this.commit(write("kept")));
    match refused {
        Err(Error::LeaseLost { session }) => assert_eq!(session, "lost"),
        other => panic!("a batch whose lease was taken over is refused, got {other:?}"),
    }
    written?;
    assert_eq!(this.get(Tree::Pending, b"kept").await?, Some(b"v".to_vec()));
    assert_eq!(this.get(Tree::Pending, b"lost").await?, None);
    assert!(!this.holds("lost"), "the lost lease is forgotten");
    // The store goes on writing, in one round trip again.
    this.commit(write("kept")).await?;
    this.close().await?;
    other.close().await?;
    Ok(())
}

/// A batch PostgreSQL refuses for what it holds (a key too long for an index row) fails
/// alone: the batches grouped with it are written.
#[tokio::test]
async fn a_batch_refused_for_its_data_fails_alone_and_the_rest_of_its_group_is_written(
) -> anyhow::Result<()> {
    let Some(cluster) = PgCluster::start()? else {
        return Ok(());
    };
    let store = store(&cluster.url(), "a").await?;
    // 3,000 bytes that do not compress: past the 2,704 bytes of a B-tree index row.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let too_long: Vec<u8> = (0..3_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()[0]
        })
        .collect();
    let write = |key: Vec<u8>| {
        let mut batch = Batch::new(CommitKind::Other);
        batch.put(Tree::Pending, key, b"v".to_vec());
        batch
    };
    let answers = futures::future::join_all((0..9u8).map(|index| {
        let key = if index == 4 {
            too_long.clone()
        } else {
            vec![b'k', index]
        };
        store.commit(write(key))
    }))
    .await;
    for (index, answer) in answers.into_iter().enumerate() {
        if index == 4 {
            assert!(answer.is_err(), "the key too long is refused");
        } else {
            answer?;
            let key = [b'k', u8::try_from(index)?];
            assert_eq!(store.get(Tree::Pending, &key).await?, Some(b"v".to_vec()));
        }
    }
    store.close().await?;
    Ok(())
}

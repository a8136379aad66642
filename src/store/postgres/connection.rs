//! How the store's connections are set up, so that a database that stops answering is an
//! error in seconds, not a wait of hours: TCP's own defaults leave a dead host's connection
//! open for about two hours (keepalive) or fifteen minutes (unacknowledged data), and a node
//! paused inside a transaction would hold its row locks, and every takeover of its leases,
//! for as long as the pause. What the URL sets itself is kept.

use std::time::Duration;

use tokio_postgres::Config;

/// The longest a connection attempt waits.
const CONNECT: Duration = Duration::from_secs(5);
/// The longest data sent may go unacknowledged before the connection is given up (Linux's
/// `TCP_USER_TIMEOUT`): a database host that died while a commit waited.
const UNACKNOWLEDGED: Duration = Duration::from_secs(10);
/// Keepalive probes on a connection that is quiet (a reply awaited, nothing unacknowledged):
/// after 5 s of quiet, every 2 s, 3 unanswered ones give it up.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_RETRIES: u32 = 3;
/// The least a transaction may idle before the server ends it (four times the lease's time to
/// live, if longer): long past any wait of a live node, even one whose group's statement
/// takes a while to arrive, and short beside a pause that holds a takeover up.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// `config` with the store's timeouts where the URL set none, and, server side, a
/// transaction left idle for four times the lease's time to live (10 s at least) ended by the
/// server: a node paused (or cut off) between its fence's check and its commit then releases
/// the lease rows it locked, and the node taking its leases over waits no longer than that. A
/// live node never idles inside a transaction for that long: each is one or two round trips.
pub(super) fn bounded(mut config: Config, lease_ttl: Duration) -> Config {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(UNACKNOWLEDGED);
    }
    // tokio-postgres's own default idle time (two hours) stands for "not set"; keepalives
    // turned off by the URL stay off.
    if config.get_keepalives() && config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
    }
    let said = config
        .get_options()
        .is_some_and(|options| options.contains("idle_in_transaction_session_timeout"));
    if !said {
        let idle_ms = lease_ttl
            .saturating_mul(4)
            .max(IDLE_IN_TRANSACTION)
            .as_millis();
        with_option(
            &mut config,
            &format!("-c idle_in_transaction_session_timeout={idle_ms}"),
        );
    }
    config
}

/// Adds a server option (`-c name=value`) to what the URL's `options` say.
pub(super) fn with_option(config: &mut Config, option: &str) {
    let options = match config.get_options() {
        Some(options) if !options.is_empty() => format!("{options} {option}"),
        _ => option.to_string(),
    };
    config.options(&options);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_gives_up_on_a_silent_database_unless_the_url_says_otherwise() {
        let parsed = |url: &str| url.parse::<Config>().map_err(|error| error.to_string());
        let Ok(plain) = parsed("postgres://node@db/dormant") else {
            panic!("a URL that parses");
        };
        let config = bounded(plain, Duration::from_millis(2_500));
        assert_eq!(config.get_connect_timeout(), Some(&CONNECT));
        assert_eq!(config.get_tcp_user_timeout(), Some(&UNACKNOWLEDGED));
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(
            config.get_options(),
            Some("-c idle_in_transaction_session_timeout=10000")
        );

        let Ok(own) =
            parsed("postgres://node@db/dormant?connect_timeout=30&options=-c%20search_path%3Dx")
        else {
            panic!("a URL that parses");
        };
        let config = bounded(own, Duration::from_millis(200));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(30)));
        assert_eq!(
            config.get_options(),
            Some("-c search_path=x -c idle_in_transaction_session_timeout=10000")
        );

        // Keepalives off, and a timeout of its own: kept as said.
        let Ok(off) = parsed(
            "postgres://node@db/dormant?keepalives=0&options=-c%20idle_in_transaction_session_timeout%3D0",
        ) else {
            panic!("a URL that parses");
        };
        let config = bounded(off, Duration::from_secs(60));
        assert!(!config.get_keepalives());
        assert_eq!(
            config.get_options(),
            Some("-c idle_in_transaction_session_timeout=0")
        );
        // A long lease: four times it.
        let Ok(plain) = parsed("postgres://node@db/dormant") else {
            panic!("a URL that parses");
        };
        assert_eq!(
            bounded(plain, Duration::from_secs(5)).get_options(),
            Some("-c idle_in_transaction_session_timeout=20000")
        );
    }
}

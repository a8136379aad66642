//! What the server's streams wait on to end at a shutdown (the switch is [`Closing`] in
//! server.rs; this file imports nothing of the server, so every stream can use it).
//!
//! [`Closing`]: crate::Closing

use tokio::sync::watch;

/// Done once `closing` says the server shuts down. A switch nobody holds any more (the
/// [`Server`](crate::Server) that made it and every [`Closing`](crate::Closing) are gone, as
/// with [`crate::router`]) can never be thrown: never done, rather than done at once, which
/// would end every stream as at a shutdown.
pub(crate) async fn shutting_down(mut closing: watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        std::future::pending::<()>().await;
    }
}

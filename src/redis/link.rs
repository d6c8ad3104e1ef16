//! The connection to the primary: a redis-rs `ConnectionManager` (which reconnects by itself when
//! the socket drops), replaced by a fresh one when the server it talks to can no longer serve the
//! registry, so that a failover recovers without restarting the router:
//!
//! - `READONLY`: the server was demoted to a replica (a failover, `REPLICAOF`). The manager would
//!   keep its healthy socket to it and fail every write; a new one goes to the primary the
//!   Sentinels name (or, on a plain URL, to whatever the address resolves to now).
//! - A response timeout: the socket may be stuck (a partition where no reset arrives), and the
//!   manager only reconnects on errors that close it; a fresh connection is cheap next to every
//!   call timing out until TCP gives up.
//! - With Sentinel, a lost connection too: the manager would reconnect to the old primary's
//!   address, which is gone; the Sentinels are asked again.
//!
//! The call that saw the error still fails (retryable); the replacement is opened in the
//! background, one at a time, and the calls after it use it.
//!
//! The first connection may be one the application gave the builder (its `ConnectionManager`,
//! or its cluster connection): the registry's commands share it with the application's, and it
//! reconnects as the application configured it. Its replacement, if one is needed, is opened
//! from the source like any other, as is the listener's pub/sub connection.
//!
//! With Redis Cluster (feature `redis-cluster`) the connection is redis-rs's cluster client
//! instead: it routes each command by its key (every key of a registry shares the hash tag
//! `{name}`, so one registry lives in one slot on one primary), follows `MOVED` and `ASK`, and
//! refreshes its slot map after a failover by itself. The few keyless commands whose answer must
//! come from the registry's primary (`INFO`, `WAIT`) are sent to the primary of the registry's
//! slot; every other keyless command goes where the cluster client routes it (`FUNCTION LOAD`
//! and `SCRIPT LOAD` to every primary). A response timeout replaces it as above.

use std::sync::Arc;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use crate::sync::{AtomicU64, Ordering};

/// Where the primary is found.
pub(crate) enum Source {
    /// One URL.
    Direct(Client),
    /// Asked of the Sentinels each time a connection is (re)opened.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
    /// A Redis Cluster: its client, the registry's slot, and a client per seed node for the
    /// pub/sub connection (a cluster forwards every `PUBLISH` to all its nodes).
    #[cfg(feature = "redis-cluster")]
    Cluster(Cluster),
}

/// What a [`Source::Cluster`] holds.
#[cfg(feature = "redis-cluster")]
pub(crate) struct Cluster {
    pub(crate) client: redis::cluster::ClusterClient,
    /// The primary of the slot of `{name}` (the registry's keys).
    pub(crate) home: redis::cluster_routing::Route,
    /// One client per seed node, tried in turn for the pub/sub connection.
    pub(crate) seeds: Vec<Client>,
}

/// The connection of one generation: opened from the [`Source`], or (the first) one the
/// application gave the builder.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "ConnectionManager",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "ClusterConnection",
        })
    }
}

/// A cloneable connection to the primary (see the module documentation).
#[derive(Clone)]
pub(crate) struct Link {
    shared: Arc<Shared>,
}

struct Shared {
    source: Source,
    config: ConnectionManagerConfig,
    current: ArcSwap<Current>,
    /// 1 while a replacement is being opened (so that a burst of failing calls opens one).
    renewing: AtomicU64,
    /// Connections replaced so far (diagnostics and tests).
    renewals: AtomicU64,
    /// Pub/sub connections handed out (which seed node of a cluster the next one goes to).
    subscriptions: AtomicU64,
}

struct Current {
    client: Client,
    conn: Conn,
    generation: u64,
}

impl Link {
    /// Opens the first connection, or takes `given` as the first (the source still supplies the
    /// pub/sub connection's client and every replacement); fails as the manager's first
    /// connection attempt does.
    pub(crate) async fn open(
        source: Source,
        config: ConnectionManagerConfig,
        given: Option<Conn>,
    ) -> Result<Self, RedisError> {
        let (client, conn) = match given {
            Some(conn) => (client_of(&source).await?, conn),
            None => connect(&source, &config).await?,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                source,
                config,
                current: ArcSwap::from_pointee(Current {
                    client,
                    conn,
                    generation: 0,
                }),
                renewing: AtomicU64::new(0),
                renewals: AtomicU64::new(0),
                subscriptions: AtomicU64::new(0),
            }),
        })
    }

    /// The client for the pub/sub connection (opened separately): the current primary's, or in
    /// a cluster the next seed node's (any node hears every `PUBLISH`; a listener that lost its
    /// node subscribes on the next one).
    pub(crate) fn client(&self) -> Client {
        // Relaxed: only spreads the attempts over the seeds; nothing is ordered by it.
        let _turn = self.shared.subscriptions.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "redis-cluster")]
        if let Source::Cluster(cluster) = &self.shared.source {
            return cluster.seeds[(_turn % cluster.seeds.len() as u64) as usize].clone();
        }
        self.shared.current.load().client.clone()
    }

    /// How many times the connection was replaced.
    pub(crate) fn renewals(&self) -> u64 {
        // Relaxed: a diagnostic count; nothing is ordered by it.
        self.shared.renewals.load(Ordering::Relaxed)
    }

    /// After a failed call on the connection of `generation`: starts opening a replacement if
    /// the error calls for one and none is being opened.
    fn after_error(&self, e: &RedisError, generation: u64) {
        if !needs_new_connection(e, matches!(self.shared.source, Source::Sentinel(_))) {
            return;
        }
        if self.shared.current.load().generation != generation {
            return; // already replaced since this call began
        }
        // AcqRel: whoever wins the flag sees the replacement stored by the previous holder.
        if self
            .shared
            .renewing
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if let Ok((client, conn)) = connect(&shared.source, &shared.config).await {
                if shared.current.load().generation == generation {
                    shared.current.store(Arc::new(Current {
                        client,
                        conn,
                        generation: generation + 1,
                    }));
                    // Relaxed: a diagnostic count.
                    shared.renewals.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Release: the stored replacement is visible to the next holder of the flag.
            shared.renewing.store(0, Ordering::Release);
        });
    }
}

/// Whether `e` means the connection should be replaced (see the module documentation).
fn needs_new_connection(e: &RedisError, sentinel: bool) -> bool {
    if demoted(e) || e.is_timeout() {
        return true;
    }
    sentinel
        && (e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(e.kind(), ErrorKind::Server(ServerErrorKind::MasterDown)))
}

/// The server is a replica now: `READONLY`, as a reply or as the error of a script's write.
pub(crate) fn demoted(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly))
        || e.code() == Some("READONLY")
        || e.detail().is_some_and(|d| d.contains("READONLY"))
}

/// The client a source names now (for the pub/sub connection beside a given one).
async fn client_of(source: &Source) -> Result<Client, RedisError> {
    Ok(match source {
        Source::Direct(client) => client.clone(),
        Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        #[cfg(feature = "redis-cluster")]
        Source::Cluster(cluster) => cluster.seeds[0].clone(),
    })
}

async fn connect(
    source: &Source,
    config: &ConnectionManagerConfig,
) -> Result<(Client, Conn), RedisError> {
    let client = match source {
        Source::Direct(client) => client.clone(),
        Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        #[cfg(feature = "redis-cluster")]
        Source::Cluster(cluster) => {
            let conn = cluster.client.get_async_connection().await?;
            return Ok((cluster.seeds[0].clone(), Conn::Cluster(conn)));
        }
    };
    let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
    Ok((client, Conn::Single(conn)))
}

/// Whether a keyless `cmd` must reach the registry's own primary in a cluster (its answer is
/// that server's: `INFO`, `WAIT`) rather than where the cluster client routes it.
#[cfg(feature = "redis-cluster")]
fn for_home_node(cmd: &Cmd) -> bool {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => {
            name.eq_ignore_ascii_case(b"INFO") || name.eq_ignore_ascii_case(b"WAIT")
        }
        _ => false,
    }
}

impl Conn {
    async fn command(&mut self, cmd: &Cmd, _source: &Source) -> Result<Value, RedisError> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd).await,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => match _source {
                Source::Cluster(cluster) if for_home_node(cmd) => {
                    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                    let home = SingleNodeRoutingInfo::SpecificNode(cluster.home);
                    conn.route_command(cmd.clone(), RoutingInfo::SingleNode(home))
                        .await
                }
                _ => conn.req_packed_command(cmd).await,
            },
        }
    }

    async fn commands(
        &mut self,
        cmd: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(cmd, offset, count).await,
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count).await,
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut conn, generation) = {
                let current = self.shared.current.load();
                (current.conn.clone(), current.generation)
            };
            let answer = conn.command(cmd, &self.shared.source).await;
            if let Err(e) = &answer {
                self.after_error(e, generation);
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut conn, generation) = {
                let current = self.shared.current.load();
                (current.conn.clone(), current.generation)
            };
            let answer = conn.commands(cmd, offset, count).await;
            if let Err(e) = &answer {
                self.after_error(e, generation);
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.current.load().conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demotion_or_a_timeout_calls_for_a_new_connection() {
        let readonly = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(needs_new_connection(&readonly, false));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(needs_new_connection(&timeout, false));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(
            !needs_new_connection(&refused, false),
            "the manager reconnects"
        );
        assert!(
            needs_new_connection(&refused, true),
            "ask the Sentinels again"
        );
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR user_script:1: WRONGTYPE",
        ));
        assert!(!needs_new_connection(&script, true));
    }
}

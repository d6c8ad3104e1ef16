//! A throwaway Redis Cluster: three `redis-server --cluster-enabled yes` primaries on free
//! loopback ports, their slots assigned by `redis-cli --cluster create`, stopped when dropped (and
//! when the test process exits: each runs under the shell of [`crate::redis`]).

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::have_or_skip;
use crate::redis::Server;

/// A cluster this process started.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts a cluster of `primaries` primaries (at least 3, what `redis-cli --cluster create`
    /// accepts) and waits until every node reports `cluster_state:ok`; `None` without the
    /// binaries (after the skip line, or a failure under `CI`).
    pub fn start(primaries: usize, what: &str) -> Option<Self> {
        Self::start_inner(primaries, false, what)
    }

    fn start_inner(primaries: usize, removed: bool, what: &str) -> Option<Self> {
        if !have_or_skip(&crate::redis::server_binary(), "redis-server", what)
            || !have_or_skip(&crate::redis::cli_binary(), "redis-tools", what)
        {
            return None;
        }
        let args = node_args();
        let start = |what: &str| {
            if removed {
                Server::start_args_removed(&args, what)
            } else {
                Server::start_args(&args, what)
            }
        };
        let nodes: Vec<Server> = (0..primaries.max(3))
            .map(|_| start(what).expect("redis-server is installed"))
            .collect();
        let out = Command::new(crate::redis::cli_binary())
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        // A condition, polled; the cap only bounds a cluster that never forms.
        let cap = Instant::now() + Duration::from_secs(60);
        for node in &cluster.nodes {
            while !cli(node.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(
                    Instant::now() < cap,
                    "the cluster did not form: {}",
                    cli(node.port, &["CLUSTER", "NODES"])
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Some(cluster)
    }

    /// The nodes' URLs (`redis://127.0.0.1:<port>/`), the first one first.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// `redis-cli -p <port of node i> <args>`: its output (what a test asks a node directly).
    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        cli(self.nodes[node].port, args)
    }
}

impl Cluster {
    /// The index of the node that serves `key`'s slot (the one that does not answer `GET key`
    /// with `MOVED`).
    pub fn owner(&self, key: &str) -> usize {
        (0..self.nodes.len())
            .find(|&i| {
                !self
                    .cli(i, &["GET", key])
                    .to_ascii_uppercase()
                    .contains("MOVED")
            })
            .unwrap_or_else(|| panic!("no node serves {key}"))
    }

    /// Moves `key`'s slot with its keys from the node that serves it to node `to`, as
    /// `redis-cli --cluster reshard` does one slot: `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE`
    /// in batches, then `SETSLOT NODE` on every node. Clients that still route the slot to the
    /// old node get `MOVED` afterwards.
    pub fn move_slot_of(&self, key: &str, to: usize) {
        let from = self.owner(key);
        assert_ne!(from, to, "{key} is on node {to} already");
        let slot = self.cli(0, &["CLUSTER", "KEYSLOT", key]).trim().to_owned();
        let id = |i: usize| self.cli(i, &["CLUSTER", "MYID"]).trim().to_owned();
        let (from_id, to_id) = (id(from), id(to));
        let ok = |out: String| assert!(out.trim() == "OK", "{out}");
        ok(self.cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]));
        ok(self.cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]));
        let port = self.nodes[to].port.to_string();
        loop {
            let keys = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            ok(self.cli(from, &args));
        }
        for i in 0..self.nodes.len() {
            ok(self.cli(i, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]));
        }
    }
}

/// The arguments of a cluster node (a node is considered failed after 2 s of silence).
fn node_args() -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "2000",
    ]
    .map(String::from)
    .to_vec()
}

impl Cluster {
    /// Starts one more node, joins it to the cluster (`CLUSTER MEET`) as a replica of node `of`
    /// (`CLUSTER REPLICATE`), and waits until its link to that primary is up; its index.
    pub fn add_replica(&mut self, of: usize) -> usize {
        let node = Server::start_args(&node_args(), "Redis Cluster replica")
            .expect("redis-server is installed");
        let i = self.nodes.len();
        let primary_port = self.nodes[of].port.to_string();
        let meet = cli(node.port, &["CLUSTER", "MEET", "127.0.0.1", &primary_port]);
        assert_eq!(meet.trim(), "OK", "{meet}");
        self.nodes.push(node);
        let primary = self.cli(of, &["CLUSTER", "MYID"]).trim().to_owned();
        // A condition, polled; the cap only bounds a cluster that never takes the node.
        let cap = Instant::now() + Duration::from_secs(60);
        loop {
            // REPLICATE fails until the new node has learnt of the primary through the gossip.
            let out = self.cli(i, &["CLUSTER", "REPLICATE", &primary]);
            if out.trim() == "OK" {
                break;
            }
            assert!(Instant::now() < cap, "CLUSTER REPLICATE: {out}");
            std::thread::sleep(Duration::from_millis(50));
        }
        while !self
            .cli(i, &["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < cap, "the replica never synced");
            std::thread::sleep(Duration::from_millis(20));
        }
        i
    }

    /// Whether every running node reports `cluster_state:ok` (`skip`: a node stopped).
    pub fn is_ok_without(&self, skip: usize) -> bool {
        (0..self.nodes.len()).filter(|&i| i != skip).all(|i| {
            self.cli(i, &["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
        })
    }
}

/// `redis-cli -p port args…`, its standard output (empty if it could not run).
fn cli(port: u16, args: &[&str]) -> String {
    Command::new(crate::redis::cli_binary())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The cluster the tests of one binary share (started on first use, stopped when the process
/// exits, its directories removed). `None` after the skip line.
pub fn shared(what: &str) -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| Cluster::start_inner(3, true, what))
        .as_ref()
}
